"""What a run deploys, and removes again: a keyspace, topics and a ZooKeeper root of its
own (`Deployment`), the `scheduler dispatcher` processes on them (`Fleet`, one
`DispatcherProcess` each, a `BenchProcess` with its log and stats file), and with
`--py-spy` their recordings (`Profiler`).

Creating fails with the scheduler's errors or a `KafkaException`. Removing never raises:
it warns on stderr and lets the rest of the cleanup go on. A dispatcher that exits
early, or a fleet that does not take the shards in time, is a `BenchFailure` that
quotes the end of the log; a dispatcher that outlives SIGTERM by `STOP_TIMEOUT_S` is
killed."""

from __future__ import annotations

import json
import os
import secrets
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol, Self

from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import CassandraConnection
from scheduler.adapters.kafka.security import client_config
from scheduler.adapters.kafka.topics import ensure_topics
from scheduler.adapters.teardown import remove_deployment
from scheduler.settings import READY_TOPICS, CassandraSettings, KafkaSettings, ZooKeeperSettings, environment

from .common import KAFKA_LOG, BenchFailure, echo, now_ms
from .proc import cpu_seconds, rss_bytes
from .settings import LEASE_TIMEOUT_S, READY_PARTITIONS, SHARDS, STOP_TIMEOUT_S

REPOSITORY = Path(__file__).resolve().parents[2]
"""The repository root: processes run from here, so `--app bench.worker_app:app` imports."""


# The deployment: a keyspace, topics and a ZooKeeper root of the bench's own.


@dataclass
class Deployment:
    cassandra: CassandraSettings
    kafka: KafkaSettings
    zookeeper: ZooKeeperSettings
    ceiling_topic: str

    @classmethod
    def fresh(cls, name: str = "nine_oclock") -> Deployment:
        """Names of its own: keyspace `<name>_<hex>`, topics `<name with dashes>-<hex>.*`,
        ZooKeeper root `/<name>_<hex>`."""
        tag = secrets.token_hex(4)
        kafka = KafkaSettings.from_env(topic_prefix=f"{name.replace('_', '-')}-{tag}")
        return cls(
            cassandra=CassandraSettings.from_env(keyspace=f"{name}_{tag}", shard_count=SHARDS),
            kafka=kafka,
            zookeeper=ZooKeeperSettings.from_env(root=f"/{name}_{tag}", session_timeout_s=LEASE_TIMEOUT_S),
            ceiling_topic=f"{kafka.topic_prefix}.ceiling",
        )

    @property
    def ready_topics(self) -> list[str]:
        return [self.kafka.ready_topic(name) for name in READY_TOPICS]

    def env(self) -> dict[str, str]:
        """The variables a dispatcher process reads to find this deployment."""
        return {"SCHEDULER_BACKEND": "cassandra", **environment(self.cassandra, self.kafka, self.zookeeper),
                "SCHEDULER_LEASE_TIMEOUT_S": str(LEASE_TIMEOUT_S)}

    def create(self, connection: CassandraConnection, cleanup: list[Callable[[], None]], keep: bool,
               log_append_time: bool = True) -> None:
        """Keyspace, topics (ready topics stamped `LogAppendTime`, unless not
        `log_append_time`: then they keep the producer's `CreateTime`, the moment the
        dispatcher's gate released each message), ceiling topic; each registered for
        removal unless `keep`."""
        if not keep:
            cleanup.append(self.remove)
        schema.apply(connection, self.cassandra)
        ensure_topics(self.kafka, shard_count=SHARDS, ready_partitions=READY_PARTITIONS)
        admin = self.admin()
        created = admin.create_topics([NewTopic(self.ceiling_topic, num_partitions=READY_PARTITIONS,
                                                replication_factor=-1)], request_timeout=30)
        for future in created.values():
            future.result(timeout=60)
        if not log_append_time:
            return
        stamped = admin.incremental_alter_configs([
            ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
                ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)])
            for topic in self.ready_topics
        ])
        for future in stamped.values():
            future.result(timeout=60)

    def admin(self) -> AdminClient:
        config: dict[str, Any] = {**client_config(self.kafka), "logger": KAFKA_LOG}
        return AdminClient(config)

    def remove(self) -> None:
        """The keyspace, the topics (the ceiling's too), the groups and the ZooKeeper
        root; what cannot be removed is a warning, and the rest of the cleanup goes on."""
        for warning in remove_deployment(self.cassandra, self.kafka, self.zookeeper, (self.ceiling_topic,)):
            echo(f"warning: {warning}")


# The scheduler processes: dispatchers here, workers in `workers.py`.


@dataclass
class BenchProcess:
    """A `scheduler` process the bench started (its own session), with its log and the
    stats file it keeps."""

    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stats_path: Path
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)

    @classmethod
    def start(cls, name: str, arguments: list[str], directory: Path, env: dict[str, str],
              preexec: Callable[[], None] | None = None) -> Self:
        """`python -m scheduler <arguments> --stats-file <directory>/<name>.json`, stderr to
        `<directory>/<name>.log`, run from the repository root (so `bench.*` imports);
        `preexec` runs in the child before it starts (e.g. to enter a cgroup)."""
        directory = directory.resolve()
        log_path, stats_path = directory / f"{name}.log", directory / f"{name}.json"
        with log_path.open("wb") as log:
            process = subprocess.Popen(
                [sys.executable, "-m", "scheduler", *arguments, "--stats-file", str(stats_path)],
                stdout=subprocess.DEVNULL, stderr=log, env=env, start_new_session=True, cwd=REPOSITORY,
                preexec_fn=preexec,
            )
        return cls(name, process, log_path, stats_path)

    def stats(self) -> dict[str, Any]:
        try:
            document: dict[str, Any] = json.loads(self.stats_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return document

    def alive(self) -> bool:
        return self.process.poll() is None

    def log_warnings(self) -> dict[str, Any]:
        """The log's warnings and errors, less the driver's protocol negotiation."""
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return {"count": 0, "first": []}
        found = [line for line in lines if (" WARNING " in line or " ERROR " in line)
                 and "Downgrading core protocol version" not in line]
        return {"count": len(found), "first": found[:20]}

    def log_tail(self, chars: int = 3000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-chars:]
        except OSError:
            return ""

    def died(self) -> BenchFailure:
        return BenchFailure(f"{self.name} exited with status {self.process.returncode}; the end of its log "
                            f"({self.log_path}):\n{self.log_tail()}")

    def stop(self, timeout_s: float, *, terminate: bool = True) -> int | None:
        """SIGTERM (if still running and `terminate`: once only, as a second SIGTERM may
        find the process finalising, with the default action back) and wait; killed if it
        outlives `timeout_s`: None then."""
        if terminate and self.alive():
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(timeout=timeout_s)
        except subprocess.TimeoutExpired:
            echo(f"warning: {self.name} did not stop within {timeout_s} s of SIGTERM; killing it")
            self.process.kill()
            self.process.wait(timeout=10)
            return None


@dataclass
class DispatcherProcess(BenchProcess):
    def sample(self) -> dict[str, Any]:
        stats = self.stats()
        counters = stats.get("stats", {})
        return {"at_ms": now_ms(), "stats_at_ms": stats.get("at_ms"), "rss_bytes": rss_bytes(self.process.pid),
                "cpu_s": cpu_seconds(self.process.pid), "shards": len(stats.get("shards", [])),
                "waiting": stats.get("waiting", 0), "wheel_bytes": stats.get("wheel_bytes", 0),
                "loaded": counters.get("loaded", 0), "fired": counters.get("fired", 0)}


class Fleet:
    """The dispatcher processes of one run, each with its own log and stats file."""

    def __init__(self, env: dict[str, str], backend: Sequence[str], directory: Path,
                 extra: Sequence[str] = ()) -> None:
        """`env`: the variables that name the deployment; `backend`: the arguments that
        pick the backend (`--backend cassandra`, or `--backend embedded --db PATH`);
        `extra`: more arguments for every dispatcher (`--metrics-port 0`)."""
        self.env = {**os.environ, **env}
        self.backend = list(backend)
        self.extra = list(extra)
        self.directory = directory
        self.members: list[DispatcherProcess] = []

    def start(self, count: int, preexec: Mapping[str, Callable[[], None]] | None = None) -> None:
        """Start `count` dispatchers, `dispatcher-1` ...; `preexec[name]`, if given, runs
        in that one's child process before it starts."""
        for n in range(1, count + 1):
            name = f"dispatcher-{n}"
            self.members.append(DispatcherProcess.start(
                name, ["dispatcher", *self.backend, "--shards", "auto", "--member", name,
                       "--lease-timeout", str(LEASE_TIMEOUT_S), *self.extra], self.directory, self.env,
                (preexec or {}).get(name)))

    def check_alive(self) -> None:
        for member in self.members:
            if not member.alive():
                raise member.died()

    def wait_for_shards(self, timeout_s: float) -> float:
        """Wait until the dispatchers fire all 64 shards between them, none twice, each
        its fair share; returns the seconds it took."""
        started = time.monotonic()
        fair = SHARDS // len(self.members)
        while True:
            self.check_alive()
            held = [set(member.stats().get("shards", [])) for member in self.members]
            if (sum(map(len, held)) == SHARDS and set().union(*held) == set(range(SHARDS))
                    and all(len(shards) >= fair for shards in held)):
                return time.monotonic() - started
            if time.monotonic() - started > timeout_s:
                raise BenchFailure(f"the dispatchers did not take the {SHARDS} shards within {timeout_s} s: they "
                                   f"hold {[len(shards) for shards in held]}")
            time.sleep(0.2)

    def sample(self, label: str) -> dict[str, Any]:
        """Sample every dispatcher, keep it under `label`, and return the totals."""
        for member in self.members:
            member.samples[label] = member.sample()
        keys = ("rss_bytes", "waiting", "wheel_bytes", "loaded", "fired", "shards")
        return {key: sum(member.samples[label][key] or 0 for member in self.members) for key in keys}

    def totals(self) -> dict[str, int]:
        stats = [member.sample() for member in self.members]
        return {key: sum(s[key] or 0 for s in stats) for key in ("waiting", "loaded", "fired", "rss_bytes")}

    def stop(self) -> list[int | None]:
        """SIGTERM every dispatcher, wait, kill what did not stop; the exit codes."""
        return stop_all(self.members, STOP_TIMEOUT_S)


def stop_all(members: Sequence[BenchProcess], timeout_s: float) -> list[int | None]:
    """SIGTERM them all at once, then wait for each (killing what outlives `timeout_s`);
    the exit codes (None: killed)."""
    for member in members:
        if member.alive():
            member.process.send_signal(signal.SIGTERM)
    return [member.stop(timeout_s, terminate=False) for member in members]


class Members(Protocol):
    @property
    def members(self) -> Sequence[BenchProcess]: ...


class Profiler:
    """py-spy recordings of each process of a fleet, one per phase, in raw (collapsed) form."""

    def __init__(self, directory: Path | None, fleet: Members) -> None:
        self.directory = directory
        self.fleet = fleet
        self.running: list[subprocess.Popen[bytes]] = []
        self.files: list[str] = []
        self.executable = shutil.which("py-spy") or str(Path(sys.executable).with_name("py-spy"))

    def start(self, phase: str) -> None:
        if self.directory is None:
            return
        self.directory.mkdir(parents=True, exist_ok=True)
        for member in self.fleet.members:
            path = self.directory / f"{member.name}-{phase}.txt"
            self.files.append(str(path))
            self.running.append(subprocess.Popen(
                [self.executable, "record", "--pid", str(member.process.pid), "--rate", "100", "--nonblocking",
                 "--threads", "--format", "raw", "--output", str(path)],
                stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))

    def stop(self) -> None:
        for process in self.running:
            process.send_signal(signal.SIGINT)
        for process in self.running:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        self.running = []
