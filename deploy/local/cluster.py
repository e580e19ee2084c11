#!/usr/bin/env python3
"""Fetch, start, stop and inspect a local Cassandra, Kafka (KRaft) and ZooKeeper: one node
of each (the default), or three (``--nodes 3``) as production runs them.

The servers run as plain JVM processes from Maven Central jars. A single node of each
listens on 127.0.0.1; three nodes listen on 127.0.1.1, 127.0.1.2 and 127.0.1.3 (see
servers.py), so both clusters can run at once, and are named ``cassandra-1`` ...
``zookeeper-3``: ``stop``, ``kill``, ``start`` and ``restart`` take one node by name
(``--only kafka-2``), or every node of a server (``--only kafka``). ``env`` prints the
SCHEDULER_* variables that point the scheduler at the cluster. Owns, under the cluster
dir (SCHEDULER_CLUSTER_DIR, default ``<repo>/.cluster``):

- ``lib/<server>/``: the server's jars, copied by Maven from ``maven/<server>/pom.xml``
  (cached in the Maven local repository as Maven does), and a ``.fetched`` marker
  holding the POM's hash: fetch skips a server whose POM did not change;
- ``<node>/``: ``conf/`` (generated at every start, see servers.py), ``data/``,
  ``server.log`` (the JVM's stdout and stderr; the run before is ``server.log.1``)
  and ``pid.json`` (pid, host and ports of the running JVM);
- the JVMs that ``start`` launched, and only those: a pid is signalled only while
  ``/proc/<pid>/cmdline`` shows that server's main class, this dir's classpath and
  the node's own config directory;
- ``.lock``: fetch, start, stop, kill and wipe hold it, so concurrent calls run one
  after another.

Per server::

    down --start--> launched --a real client request answers--> up
                        '--exits, or no answer by --timeout--> its log tail printed;
                           every JVM this call launched is stopped --> down (exit 1)
    up --stop--> SIGTERM --exits within --timeout--> down
                    '--still alive--> SIGKILL --> down

How it fails:

- ``fetch``: Maven's output is printed (exit 1). Jars are copied into a scratch dir that
  replaces ``lib/<server>/`` only when complete, so an interrupted fetch is redone.
- ``start``: a port held by another process, or configured twice, fails before anything
  is launched, naming the port, the server, and the variable and flag that move it
  (exit 4). A server that exits or does not answer in time fails the call (exit 1).
- ``stop``: a pid file whose process has gone or is no longer our server (pid recycled)
  is removed, and nothing is signalled.
- ``status``: exit 3 unless every selected server answers a real client request
  (CQL query, Kafka metadata request, ZooKeeper session): an open port is not enough.
"""
from __future__ import annotations

import argparse
import fcntl
import hashlib
import json
import logging
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from credentials import SCHEDULER_USER, Credentials
from processes import cmdline, exited, open_pidfd, port_holder, port_is_free, rss_mb
from servers import SERVER_TYPES, ClusterError, Kafka, NotReady, Server, Settings, ZooKeeper

HERE = Path(__file__).resolve().parent
REPO_ROOT = HERE.parent.parent
MAVEN_DIR = HERE / "maven"

EXIT_OK = 0
EXIT_FAILED = ClusterError.exit_code
EXIT_USAGE = 2  # argparse's own code for a bad command line
EXIT_UNHEALTHY = 3
EXIT_PORT_CONFLICT = 4
EXIT_INTERRUPTED = 130

SERVER_KINDS = tuple(kind.kind for kind in SERVER_TYPES)
NODE_COUNTS = (1, 3, 5)
MULTI_NODE_HOST = "127.0.1.1"
SECURE_HOST = "127.0.2.1"
SECURE_ENV = "SCHEDULER_LOCAL_SECURE"
JAVA_MAJOR = 17  # Cassandra 5.0 runs on 11 or 17, Kafka 4.1 needs 17+: 17 is the overlap.
LOG_TAIL_LINES = 40
LOG_TAIL_WIDTH = 300
PROBE_INTERVAL_S = 0.5
PROBE_TIMEOUT_S = 5.0
CLEANUP_STOP_TIMEOUT_S = 30.0
SIGKILL_WAIT_S = 10.0


class PortConflict(ClusterError):
    exit_code = EXIT_PORT_CONFLICT


class UsageError(ClusterError):
    """A command line naming what does not exist (a node of a cluster with fewer nodes)."""

    exit_code = EXIT_USAGE


# ---------------------------------------------------------------- settings


@dataclass(frozen=True)
class Option:
    """A setting: its flag wins, else its SCHEDULER_* variable, else the default."""

    dest: str  # the Settings field
    env: str
    default: str
    help: str

    @property
    def flag(self) -> str:
        return "--" + self.dest.replace("_", "-")


OPTIONS: tuple[Option, ...] = (
    Option("cluster_dir", "SCHEDULER_CLUSTER_DIR", str(REPO_ROOT / ".cluster"),
           "jars in <dir>/lib/<server>/; config, data, log and pid file in <dir>/<server>/"),
    Option("nodes", "SCHEDULER_LOCAL_NODES", "1",
           "nodes of each server: 1, or 3 (or 5) as in production (Cassandra keyspaces replicated 3 "
           "times, Kafka topics 3 times with 2 in sync, a ZooKeeper ensemble)"),
    Option("host", "SCHEDULER_LOCAL_HOST", "",
           f"the address the first node binds, node n this plus n - 1 (empty: 127.0.0.1 for one node, "
           f"{MULTI_NODE_HOST} for several)"),
    Option("cassandra_port", "SCHEDULER_LOCAL_CASSANDRA_PORT", "9042", "Cassandra CQL native port"),
    Option("cassandra_storage_port", "SCHEDULER_LOCAL_CASSANDRA_STORAGE_PORT", "7000",
           "Cassandra internode (storage) port"),
    Option("kafka_port", "SCHEDULER_LOCAL_KAFKA_PORT", "9092", "Kafka broker (PLAINTEXT) port"),
    Option("kafka_controller_port", "SCHEDULER_LOCAL_KAFKA_CONTROLLER_PORT", "9093",
           "Kafka KRaft controller port"),
    Option("zookeeper_port", "SCHEDULER_LOCAL_ZOOKEEPER_PORT", "2181", "ZooKeeper client port"),
    Option("zookeeper_peer_port", "SCHEDULER_LOCAL_ZOOKEEPER_PEER_PORT", "2888",
           "ZooKeeper quorum port (several nodes only)"),
    Option("zookeeper_election_port", "SCHEDULER_LOCAL_ZOOKEEPER_ELECTION_PORT", "3888",
           "ZooKeeper leader election port (several nodes only)"),
    Option("maven_repo", "SCHEDULER_MAVEN_REPO", "",
           "Maven local repository used by fetch (empty: Maven's own, ~/.m2/repository)"),
)
OPTION_BY_DEST = {option.dest: option for option in OPTIONS}


def node_count(text: str) -> int:
    if not text.isdigit() or int(text) not in NODE_COUNTS:
        raise argparse.ArgumentTypeError(
            f"--nodes (SCHEDULER_LOCAL_NODES) must be one of {', '.join(map(str, NODE_COUNTS))}, got {text!r}: "
            "a ZooKeeper ensemble and a KRaft quorum need an odd number of nodes")
    return int(text)


def settings_from_args(args: argparse.Namespace) -> Settings:
    if args.secure and args.nodes != 1:
        raise UsageError("--secure runs one node of each server; drop --nodes (or SCHEDULER_LOCAL_NODES)")
    default_host = SECURE_HOST if args.secure else "127.0.0.1" if args.nodes == 1 else MULTI_NODE_HOST
    return Settings(
        cluster_dir=Path(args.cluster_dir).expanduser().resolve(),
        host=args.host or default_host,
        nodes=args.nodes,
        secure=args.secure,
        zookeeper_peer_port=args.zookeeper_peer_port,
        zookeeper_election_port=args.zookeeper_election_port,
        cassandra_port=args.cassandra_port,
        cassandra_storage_port=args.cassandra_storage_port,
        kafka_port=args.kafka_port,
        kafka_controller_port=args.kafka_controller_port,
        zookeeper_port=args.zookeeper_port,
        maven_repo=Path(args.maven_repo).expanduser().resolve() if args.maven_repo else None,
    )


# ---------------------------------------------------------------- run records


@dataclass(frozen=True)
class RunRecord:
    """What ``pid.json`` holds about a launched JVM."""

    pid: int
    host: str
    ports: dict[str, int]
    started_at: float


def read_record(server: Server) -> RunRecord | None:
    try:
        return RunRecord(**json.loads(server.pid_file.read_text()))
    except (OSError, ValueError, TypeError):
        return None


def is_our_server(pid: int, server: Server) -> bool:
    """True while ``pid`` runs this server's main class on this cluster dir's classpath,
    with this node's config."""
    args = cmdline(pid)
    return (server.main_class in args and server.classpath in args
            and any(server.marker in arg for arg in args))


def running_record(server: Server) -> RunRecord | None:
    record = read_record(server)
    return record if record and is_our_server(record.pid, server) else None


def log_tail(path: Path, lines: int = LOG_TAIL_LINES, width: int = LOG_TAIL_WIDTH) -> str:
    """The last lines of a log, each cut to ``width`` (Cassandra logs its config as one 12 kB line)."""
    try:
        tail = path.read_text(errors="replace").splitlines()[-lines:]
    except OSError:
        return f"(no log at {path})"
    return "\n".join(line if len(line) <= width else line[:width] + " [...]" for line in tail)


def describe_ports(host: str, ports: dict[str, int]) -> str:
    return f"{host} " + " ".join(f"{role}={port}" for role, port in ports.items())


# ---------------------------------------------------------------- fetch


def pom_digest(server: Server) -> str:
    return hashlib.sha256((MAVEN_DIR / server.kind / "pom.xml").read_bytes()).hexdigest()


def is_fetched(server: Server) -> bool:
    marker = server.lib / ".fetched"
    return marker.exists() and marker.read_text().strip() == pom_digest(server)


def maven_copy(server: Server, target: Path) -> None:
    if shutil.which("mvn") is None:
        raise ClusterError("mvn not found: install Maven 3.8+ (e.g. `apt-get install maven`)")
    command = ["mvn", "-B", "-q", "-Dstyle.color=never",
               "-f", str(MAVEN_DIR / server.kind / "pom.xml"),
               "dependency:copy-dependencies", f"-Dlib.dir={target}"]
    if server.settings.maven_repo:
        command.append(f"-Dmaven.repo.local={server.settings.maven_repo}")
    done = subprocess.run(command, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ClusterError(
            f"Maven could not fetch the {server.kind} jars (exit {done.returncode}); check that "
            f"Maven Central is reachable (a proxy goes in ~/.m2/settings.xml):\n{done.stdout}{done.stderr}"
        )


def fetch_one(server: Server) -> None:
    """Copies the jars into a scratch dir, then swaps it in place of ``lib/<server>/``."""
    scratch = server.lib.with_name(f".{server.kind}.partial")
    shutil.rmtree(scratch, ignore_errors=True)
    maven_copy(server, scratch)
    (scratch / ".fetched").write_text(pom_digest(server) + "\n")
    shutil.rmtree(server.lib, ignore_errors=True)
    scratch.rename(server.lib)


def fetch(servers: list[Server]) -> None:
    """One Maven run per server, in turn: Maven 3.8 does not lock its local repository."""
    began = time.monotonic()
    for server in servers:
        if is_fetched(server):
            print(f"{server.kind}: jars up to date in {server.lib}")
            continue
        server_began = time.monotonic()
        fetch_one(server)
        jars = list(server.lib.glob("*.jar"))
        size_mb = sum(jar.stat().st_size for jar in jars) / 2**20
        print(f"{server.kind}: fetched {len(jars)} jars ({size_mb:.0f} MB) "
              f"in {time.monotonic() - server_began:.1f} s", flush=True)
    print(f"fetch took {time.monotonic() - began:.1f} s")


# ---------------------------------------------------------------- start


def java_major(java: str) -> int | None:
    try:
        banner = subprocess.run([java, "-version"], capture_output=True, text=True).stderr
    except OSError:
        return None
    match = re.search(r'version "(\d+)', banner)
    return int(match.group(1)) if match else None


def find_java() -> str:
    """The first Java 17 of: $JAVA_HOME, `java` on PATH, /usr/lib/jvm/*17*."""
    java_home = os.environ.get("JAVA_HOME")
    candidates = [str(Path(java_home) / "bin" / "java")] if java_home else []
    candidates += [found for found in [shutil.which("java")] if found]
    candidates += sorted(str(path) for path in Path("/usr/lib/jvm").glob(f"*{JAVA_MAJOR}*/bin/java"))
    seen = {java: java_major(java) for java in dict.fromkeys(candidates)}
    for java, major in seen.items():
        if major == JAVA_MAJOR:
            return java
    found = ", ".join(f"{java} (Java {major or '?'})" for java, major in seen.items()) or "none"
    raise ClusterError(f"no Java {JAVA_MAJOR} found (tried: {found}). Cassandra 5.0 runs on Java 11 or 17 "
                       f"and Kafka 4.1 needs 17+: install Java {JAVA_MAJOR} (Debian: openjdk-17-jre-headless) "
                       f"or set JAVA_HOME to one")


def port_option_hint(server: Server, role: str) -> str:
    option = OPTION_BY_DEST[dict(server.port_fields)[role]]
    return f"{option.env}=<port> or {option.flag} <port>"


def check_ports(to_launch: list[Server], all_servers: list[Server]) -> None:
    """Fails before anything is launched if a needed port is configured twice or taken."""
    users: dict[tuple[str, int], str] = {}
    for server in all_servers:
        for role, port in server.ports().items():
            user = users.setdefault((server.host, port), f"{server.name} {role}")
            if user != f"{server.name} {role}":
                raise PortConflict(f"port {port} is configured for both the {user} port and the "
                                   f"{server.name} {role} port: move one ({port_option_hint(server, role)})")
    for server in to_launch:
        for role, port in server.ports().items():
            if not port_is_free(server.host, port):
                raise PortConflict(
                    f"port {port} on {server.host}, needed by {server.name} ({role} port), "
                    f"is in use by {port_holder(port)}. Stop that process, or give {server.name} "
                    f"another port with {port_option_hint(server, role)}."
                )


def launch(server: Server, java: str) -> tuple[subprocess.Popen[bytes], RunRecord]:
    """Starts the JVM detached (own session, output to server.log) and records its pid."""
    for directory in (server.conf, server.data):
        directory.mkdir(parents=True, exist_ok=True)
    if server.log_file.exists():
        server.log_file.replace(server.log_file.with_name("server.log.1"))
    argv = server.jvm_command(java)
    with server.log_file.open("ab") as log:
        process = subprocess.Popen(argv, cwd=server.home, stdin=subprocess.DEVNULL, stdout=log,
                                   stderr=subprocess.STDOUT, start_new_session=True)
    record = RunRecord(process.pid, server.host, server.ports(), time.time())
    server.pid_file.write_text(json.dumps(asdict(record)) + "\n")
    return process, record


def exit_of_launched(process: subprocess.Popen[bytes]) -> Callable[[], str | None]:
    def ended() -> str | None:
        code = process.poll()
        return None if code is None else f"exited with code {code}"
    return ended


def exit_of_running(pid: int, server: Server) -> Callable[[], str | None]:
    def ended() -> str | None:
        return None if is_our_server(pid, server) else "exited"
    return ended


def wait_ready(server: Server, record: RunRecord, ended: Callable[[], str | None],
               deadline: float, aborted: threading.Event) -> None:
    """Probes until the server answers; raises ClusterError on its exit, the deadline or abort."""
    last = "no probe yet"
    while not aborted.is_set():
        how = ended()
        if how is not None:
            raise ClusterError(f"{server.name} {how} before answering")
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise ClusterError(f"{server.name} did not answer in time; last probe: {last}")
        try:
            server.probe(record.host, record.ports, timeout_s=min(PROBE_TIMEOUT_S, max(remaining, 1.0)))
            return
        except NotReady as exc:
            last = str(exc)
        time.sleep(PROBE_INTERVAL_S)
    raise ClusterError(f"{server.name}: start interrupted")


@dataclass
class Outcome:
    """What ``start`` did with one server (filled in by its thread)."""

    server: Server
    launched: subprocess.Popen[bytes] | None = None  # None: it was already running
    record: RunRecord | None = None
    ready_s: float | None = None
    error: str | None = None


def bring_up(outcome: Outcome, java: str, deadline: float, aborted: threading.Event) -> None:
    """Launches the server unless it is already running, then waits until it answers."""
    server, began = outcome.server, time.monotonic()
    try:
        record = running_record(server)
        if record is not None:
            print(f"{server.name}: already running (pid {record.pid})", flush=True)
            ended = exit_of_running(record.pid, server)
        else:
            outcome.launched, record = launch(server, java)
            ended = exit_of_launched(outcome.launched)
        outcome.record = record
        wait_ready(server, record, ended, deadline, aborted)
        server.provision(timeout_s=max(deadline - time.monotonic(), 1.0))
        outcome.ready_s = time.monotonic() - began
    except ClusterError as exc:
        outcome.error = str(exc)


def start(servers: list[Server], all_servers: list[Server], timeout_s: float) -> None:
    """Brings every server up concurrently; on any failure stops all that this call launched."""
    check_ports([server for server in servers if running_record(server) is None], all_servers)
    missing = {server.kind: server for server in servers if not is_fetched(server)}
    if missing:
        fetch(list(missing.values()))
    java = find_java()
    settings = servers[0].settings
    if settings.secure:
        settings.credentials.ensure([settings.node_host(node) for node in range(1, settings.nodes + 1)])
    outcomes = [Outcome(server) for server in servers]
    aborted = threading.Event()
    deadline = time.monotonic() + timeout_s
    pool = ThreadPoolExecutor(max_workers=len(outcomes))
    futures = [pool.submit(bring_up, outcome, java, deadline, aborted) for outcome in outcomes]
    try:
        for future in futures:
            future.result()
    except BaseException:  # Ctrl-C, or a bug: leave nothing half-up
        aborted.set()
        pool.shutdown()
        stop_launched(outcomes)
        raise
    pool.shutdown()
    failed = [outcome for outcome in outcomes if outcome.error]
    if failed:
        for outcome in failed:
            print(f"\n{outcome.error}\n--- last {LOG_TAIL_LINES} lines of {outcome.server.log_file} ---\n"
                  f"{log_tail(outcome.server.log_file)}\n---", file=sys.stderr)
        stop_launched(outcomes)
        names = ", ".join(outcome.server.name for outcome in failed)
        raise ClusterError(f"start failed ({names}); the servers this call launched were stopped")
    for outcome in outcomes:
        report_ready(outcome)


def report_ready(outcome: Outcome) -> None:
    server, record = outcome.server, outcome.record
    assert record is not None and outcome.ready_s is not None
    how = "started, ready in" if outcome.launched else "already running, answered in"
    print(f"{server.name:<12} {how} {outcome.ready_s:5.1f} s  pid {record.pid}  "
          f"rss {rss_mb(record.pid) or 0:.0f} MB  {describe_ports(record.host, record.ports)}")


def stop_launched(outcomes: list[Outcome]) -> None:
    launched = [outcome for outcome in outcomes if outcome.launched]
    stop([outcome.server for outcome in launched], CLEANUP_STOP_TIMEOUT_S)
    for outcome in launched:
        assert outcome.launched is not None
        outcome.launched.poll()  # reap our exited child


# ---------------------------------------------------------------- stop, status, wipe


def stop(servers: list[Server], timeout_s: float) -> bool:
    """SIGTERM to each of our running servers, SIGKILL to any alive at the deadline.

    Returns False if a server survived SIGKILL.
    """
    pending: dict[int, tuple[Server, int]] = {}  # pidfd -> (server, pid)
    for server in servers:
        record = read_record(server)
        pidfd = open_pidfd(record.pid) if record else None  # opened before the check: see processes.py
        if record is None or pidfd is None or not is_our_server(record.pid, server):
            stale = server.pid_file.exists()
            server.pid_file.unlink(missing_ok=True)
            print(f"{server.name}: not running" + (" (removed a stale pid file)" if stale else ""))
            if pidfd is not None:
                os.close(pidfd)
            continue
        signal.pidfd_send_signal(pidfd, signal.SIGTERM)
        pending[pidfd] = (server, record.pid)
    signalled_at = time.monotonic()

    def stopped(pidfd: int, how: str) -> None:
        server, pid = pending.pop(pidfd)
        os.close(pidfd)
        server.pid_file.unlink(missing_ok=True)
        print(f"{server.name}: {how} (pid {pid}, {time.monotonic() - signalled_at:.1f} s after SIGTERM)")

    while pending and (remaining := signalled_at + timeout_s - time.monotonic()) > 0:
        for pidfd in exited(pending, remaining):
            stopped(pidfd, "stopped")
    for pidfd in list(pending):
        signal.pidfd_send_signal(pidfd, signal.SIGKILL)
        if exited([pidfd], SIGKILL_WAIT_S):
            stopped(pidfd, f"killed (SIGTERM not obeyed within {timeout_s:g} s)")
    for pidfd, (server, pid) in pending.items():
        print(f"{server.name}: pid {pid} survived SIGKILL", file=sys.stderr)
        os.close(pidfd)
    return not pending


def server_status(server: Server, timeout_s: float) -> dict[str, Any]:
    """The ``status --json`` entry of one node."""
    record = running_record(server)
    host, ports = (record.host, record.ports) if record else (server.host, server.ports())
    state = "down"
    role = None
    if record:
        try:
            server.probe(host, ports, timeout_s)
            state = "up"
        except NotReady:
            state = "unhealthy"
        if isinstance(server, ZooKeeper):
            role = server.mode(host, ports, timeout_s)
    return {
        "state": state,
        "kind": server.kind,
        "node": server.node,
        "role": role,
        "pid": record.pid if record else None,
        "host": host,
        "port": next(iter(ports.values())),
        "ports": ports,
        "rss_mb": rss_mb(record.pid) if record else None,
        "data_dir": str(server.home),
        "log": str(server.log_file),
    }


STATE_TEXT = {"up": "up", "unhealthy": "running, NOT answering", "down": "stopped"}


def status(servers: list[Server], as_json: bool, timeout_s: float) -> bool:
    """Prints each node's state; True if all answer."""
    with ThreadPoolExecutor(max_workers=len(servers)) as pool:
        entries = list(pool.map(lambda server: server_status(server, timeout_s), servers))
    reports = {server.name: entry for server, entry in zip(servers, entries, strict=True)}
    if as_json:
        print(json.dumps(reports, indent=2))
    else:
        print(f"{'server':<12} {'state':<22} {'role':<10} {'pid':>7} {'rss MB':>7}  {'ports':<50} data dir")
        for name, report in reports.items():
            print(f"{name:<12} {STATE_TEXT[report['state']]:<22} {report['role'] or '-':<10} "
                  f"{report['pid'] or '-':>7} {report['rss_mb'] or '-':>7}  "
                  f"{describe_ports(report['host'], report['ports']):<50} {report['data_dir']}")
    return all(report["state"] == "up" for report in reports.values())


def kill(servers: list[Server]) -> None:
    """SIGKILL to each of our running nodes, as a crash would end them: no shutdown hook
    runs, nothing unflushed reaches the disk. The pid file stays, and is found stale by
    the next ``start``, which starts the node again on its data."""
    for server in servers:
        record = read_record(server)
        pidfd = open_pidfd(record.pid) if record else None  # opened before the check: see processes.py
        if record is None or pidfd is None or not is_our_server(record.pid, server):
            print(f"{server.name}: not running")
            if pidfd is not None:
                os.close(pidfd)
            continue
        try:
            signal.pidfd_send_signal(pidfd, signal.SIGKILL)
            if not exited([pidfd], SIGKILL_WAIT_S):
                raise ClusterError(f"{server.name} (pid {record.pid}) survived SIGKILL for {SIGKILL_WAIT_S:g} s")
        finally:
            os.close(pidfd)
        print(f"{server.name}: killed (SIGKILL, pid {record.pid})")


def wipe(servers: list[Server], timeout_s: float) -> None:
    partial = [server.name for server in servers if server.settings.nodes > 1
               and not all(any(peer.name == other.name for other in servers) for peer in server.peers)]
    if partial:
        # A Cassandra node back empty (no bootstrap) would answer for data it lacks, and a
        # KRaft voter that lost its log breaks the static quorum: all nodes of a server, or none.
        raise UsageError(f"wipe deletes every node of a server or none, not {', '.join(partial)} alone: "
                         "stop or kill a node to take it away, `wipe --only <server>` to start it afresh")
    if not stop(servers, timeout_s):
        raise ClusterError("a server could not be stopped, so no data was deleted")
    for server in servers:
        shutil.rmtree(server.home, ignore_errors=True)
        print(f"{server.name}: deleted {server.home}")
    settings = servers[0].settings
    if settings.secure and not any(kind(settings, 1).home.exists() for kind in SERVER_TYPES):
        # Nothing left that was made with them: the next start makes new ones.
        shutil.rmtree(settings.credentials.directory, ignore_errors=True)
        print(f"deleted the secure cluster's certificates and passwords in {settings.credentials.directory}")
    kafka = [server for server in servers if isinstance(server, Kafka)]
    if kafka and not any(node.home.exists() for node in kafka[0].peers):
        # No node is formatted any more: the next start makes a new cluster id.
        (kafka[0].settings.cluster_dir / f"kafka-{kafka[0].settings.nodes}-nodes.cluster-id").unlink(missing_ok=True)


def environment(servers: list[Server]) -> dict[str, str]:
    """The SCHEDULER_* variables that point the scheduler at this cluster (``env``)."""
    settings = servers[0].settings
    hosts = [settings.node_host(node) for node in range(1, settings.nodes + 1)]
    variables = {
        "SCHEDULER_BACKEND": "cassandra",
        "SCHEDULER_CASSANDRA_HOSTS": ",".join(hosts),
        "SCHEDULER_CASSANDRA_PORT": str(settings.cassandra_port),
        "SCHEDULER_KAFKA_BOOTSTRAP": ",".join(f"{host}:{settings.kafka_port}" for host in hosts),
        "SCHEDULER_ZOOKEEPER_HOSTS": ",".join(f"{host}:{settings.zookeeper_port}" for host in hosts),
    }
    if settings.nodes > 1:
        # Three replicas in the one data centre SimpleSnitch reports; a quorum of them
        # takes each read and write.
        variables["SCHEDULER_REPLICATION"] = "{'class': 'NetworkTopologyStrategy', 'datacenter1': 3}"
        variables["SCHEDULER_CONSISTENCY"] = "LOCAL_QUORUM"
    if settings.secure:
        variables.update(secure_environment(settings.credentials))
    return variables


def secure_environment(credentials: Credentials) -> dict[str, str]:
    """The scheduler's identity on each server of the secure cluster, and the files it
    proves it with (paths only: no secret is printed)."""
    variables = {
        "SCHEDULER_CASSANDRA_USERNAME": SCHEDULER_USER,
        "SCHEDULER_CASSANDRA_PASSWORD_FILE": str(credentials.password_file("cassandra-scheduler")),
        "SCHEDULER_KAFKA_USERNAME": SCHEDULER_USER,
        "SCHEDULER_KAFKA_PASSWORD_FILE": str(credentials.password_file("kafka-scheduler")),
        "SCHEDULER_KAFKA_SASL_MECHANISM": "SCRAM-SHA-512",
        "SCHEDULER_ZOOKEEPER_AUTH_FILE": str(credentials.password_file("zookeeper-scheduler")),
    }
    for server in ("CASSANDRA", "KAFKA", "ZOOKEEPER"):
        variables |= {f"SCHEDULER_{server}_TLS_CA": str(credentials.ca),
                      f"SCHEDULER_{server}_TLS_CERT": str(credentials.client_cert),
                      f"SCHEDULER_{server}_TLS_KEY": str(credentials.client_key)}
    return variables


# ---------------------------------------------------------------- command line


def port_number(text: str) -> int:
    if not text.isdigit() or not 0 < int(text) < 65536:
        raise argparse.ArgumentTypeError(f"not a TCP port: {text!r}")
    return int(text)


def select(text: str, all_servers: list[Server]) -> list[Server]:
    """The nodes ``--only`` names: a server's name (every node of it) or a node's."""
    names = {name.strip() for name in text.split(",") if name.strip()}
    known = {*SERVER_KINDS, *(server.name for server in all_servers)}
    unknown = names - known
    if unknown or not names:
        raise UsageError(
            f"unknown server(s) {', '.join(sorted(unknown)) or repr(text)} in --only; choose from "
            f"{','.join(sorted(known, key=lambda name: (name not in SERVER_KINDS, name)))}")
    return [server for server in all_servers if server.name in names or server.kind in names]


def shared_options() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(add_help=False)
    parser.add_argument(
        "--secure", action="store_true", default=os.environ.get(SECURE_ENV, "") not in ("", "0"),
        help=f"the secure cluster ({SECURE_ENV}=1): one node of each on {SECURE_HOST}, with authentication and "
             "TLS on every server, certificates and passwords made here at its first start (see "
             "deploy/README.md); a cluster of its own, beside the plain one")
    parser.add_argument("--only", default=",".join(SERVER_KINDS), metavar="LIST",
                        help=f"comma-separated servers ({','.join(SERVER_KINDS)}: every node of each) or "
                             "nodes (cassandra-2, kafka-1, ...; with --nodes 3) (default: all)")
    group = parser.add_argument_group("settings (a flag wins over its environment variable)")
    for option in OPTIONS:
        kind = port_number if option.dest.endswith("port") else node_count if option.dest == "nodes" else str
        group.add_argument(
            option.flag, default=os.environ.get(option.env, option.default), metavar=option.env, type=kind,
            help=f"{option.help} (default {option.default or 'see above'})",
        )
    return parser


def add_timeout(parser: argparse.ArgumentParser, default_s: float, what: str) -> None:
    parser.add_argument("--timeout", type=float, default=default_s, metavar="S",
                        help=f"{what} (default {default_s:.0f})")


def build_parser() -> argparse.ArgumentParser:
    shared = shared_options()
    parser = argparse.ArgumentParser(
        prog="cluster.py",
        description="Fetch, start, stop and inspect a local Cassandra 5.0, Kafka 4.1 (KRaft) and "
                    "ZooKeeper 3.9, one node of each or three (--nodes 3), run as JVM processes from "
                    "Maven Central jars.",
        epilog=f"Exit codes: {EXIT_OK} ok; {EXIT_FAILED} failed; {EXIT_USAGE} bad command line; "
               f"{EXIT_UNHEALTHY} (status) a server is not answering; {EXIT_PORT_CONFLICT} (start) a port "
               f"is taken or configured twice. Settings, each also read from its environment variable: "
               + ", ".join(option.env for option in OPTIONS) + " (see `cluster.py start --help`).",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="command")
    commands.add_parser("fetch", parents=[shared],
                        help="resolve the jars with Maven; skipped for a server whose POM did not change")
    start_parser = commands.add_parser(
        "start", parents=[shared],
        help="fetch if needed, start each node not running, wait until each answers")
    add_timeout(start_parser, 180, "seconds for every node to answer")
    stop_parser = commands.add_parser("stop", parents=[shared], help="stop the nodes this tool started")
    add_timeout(stop_parser, 60, "seconds to wait after SIGTERM before SIGKILL")
    commands.add_parser("kill", parents=[shared],
                        help="SIGKILL the nodes, as a crash would; `start` brings them back on their data")
    restart_parser = commands.add_parser("restart", parents=[shared],
                                         help="stop, then start the nodes, waiting until each answers")
    add_timeout(restart_parser, 180, "seconds to stop, and again to answer")
    status_parser = commands.add_parser(
        "status", parents=[shared], help=f"state of each node; exit {EXIT_UNHEALTHY} unless all answer")
    status_parser.add_argument(
        "--json", action="store_true",
        help='print one JSON object: {"<node>": {"state": "up"|"unhealthy"|"down", "kind", "node", "role" '
             '(ZooKeeper: leader, follower or standalone), "pid", "host", "port", "ports", "rss_mb", '
             '"data_dir", "log"}, ...}')
    add_timeout(status_parser, PROBE_TIMEOUT_S, "seconds each probe may take")
    commands.add_parser("env", parents=[shared],
                        help="print the SCHEDULER_* variables that point the scheduler at this cluster, "
                             "as shell exports: eval \"$(cluster.py env --nodes 3)\"")
    wipe_parser = commands.add_parser("wipe", parents=[shared],
                                      help="stop, then delete data, config and logs (not the jars)")
    add_timeout(wipe_parser, 60, "seconds to wait after SIGTERM before SIGKILL")
    return parser


def quiet_client_libraries() -> None:
    """The probes report failures themselves; the clients' own retry chatter is noise."""
    for name in ("cassandra", "kazoo"):
        logging.getLogger(name).setLevel(logging.CRITICAL)


@contextmanager
def cluster_lock(cluster_dir: Path) -> Iterator[None]:
    """Serialises the commands that change a cluster dir: a second `start` (say, from a
    parallel test worker) waits, then finds the servers "already running"."""
    cluster_dir.mkdir(parents=True, exist_ok=True)
    with (cluster_dir / ".lock").open("w") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            print(f"waiting for another cluster.py working on {cluster_dir} ...", flush=True)
            fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def run(args: argparse.Namespace) -> int:
    settings = settings_from_args(args)
    all_servers = [kind(settings, node) for kind in SERVER_TYPES for node in range(1, settings.nodes + 1)]
    servers = select(args.only, all_servers)
    if args.command == "status":  # reads only: no lock
        return EXIT_OK if status(servers, args.json, args.timeout) else EXIT_UNHEALTHY
    if args.command == "env":
        for name, value in environment(all_servers).items():
            quoted = f'"{value}"' if not set(value) & set('"$`\\') else shlex.quote(value)
            print(f"export {name}={quoted}")
        return EXIT_OK
    with cluster_lock(settings.cluster_dir):
        if args.command == "fetch":
            fetch(list({server.kind: server for server in servers}.values()))
        elif args.command == "start":
            start(servers, all_servers, args.timeout)
        elif args.command == "stop":
            return EXIT_OK if stop(servers, args.timeout) else EXIT_FAILED
        elif args.command == "kill":
            kill(servers)
        elif args.command == "restart":
            if not stop(servers, args.timeout):
                return EXIT_FAILED
            start(servers, all_servers, args.timeout)
        elif args.command == "wipe":
            wipe(servers, args.timeout)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    quiet_client_libraries()
    try:
        return run(args)
    except ClusterError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return exc.exit_code
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED


if __name__ == "__main__":
    sys.exit(main())
