"""Nine o'clock bench: a burst of tasks due in the first seconds of one minute, fired by
real dispatcher processes on the real Cassandra, Kafka and ZooKeeper.

What it measures
----------------
`--tasks` SMS tasks (default 300,000) due evenly over the first `--spread-s` seconds
(default 10) of one minute M, so N/S fall due each second: about 80% for one "board"
tenant, the rest over `--tenants` colleges (default 5,000) with Zipf-like sizes (the
n-th college has 1/n of the first one's), each with a ~`--payload-bytes` msgpack
payload. In one run, on a fresh keyspace, topic prefix and ZooKeeper root:

1. Kafka ceiling: `--ceiling-messages` messages of the bench's own kind and size,
   produced as fast as one process can with the dispatcher's producer settings
   (`acks=all`, idempotent, lz4, linger 5 ms) to a topic of its own; messages/s.
2. Ingest: every task written with the producer SDK (`Client(store, handoff=None)`,
   `submit_many`), rows/s. M is the first minute boundary at least the estimated
   ingest time plus `--lead-s` (default 75 s) ahead, so the tasks are stored before
   the dispatchers, started next, read minute M (at M - 60 s).
3. `--dispatchers` processes (`scheduler dispatcher --shards auto --lease-timeout 10`)
   start and take the 64 shards between them. Their stats file and RSS are sampled at
   baseline (M - 62 s, wheels empty) and just before M (the minute loaded).
4. A reader (a thread or a process, `--reader`) takes every message of the four ready
   topics from offset 0, with the broker's timestamp (the bench sets the ready topics
   to `LogAppendTime`, so the timestamp is when Kafka stored the message). It stops
   when every task was seen or at M + S + 60 s, after the dispatchers are stopped
   (SIGTERM) and the topics are read to their end.

Figures: fire rate = tasks published / (last first-publish - M), and the most first
publishes within any one second; lateness = first publish - run_at of every task
(p50, p90, p99, p99.9, max, share over 1 s, early = before run_at); lost (never
published) and duplicated (published more than once) tasks; memory per loaded task =
(wheel bytes, and RSS) growth from baseline to loaded over the tasks loaded, also less
the mean payload size; CPU seconds of each process in the load and burst windows. Each
is checked against its target and the misses are listed.

How to run
----------
    .venv/bin/python deploy/local/cluster.py start          # the local servers, if not running
    .venv/bin/python bench/nine_oclock.py --out bench/results/nine_oclock.json
    .venv/bin/python bench/nine_oclock.py --dispatchers 2 --out /tmp/nine-2.json
    .venv/bin/python bench/nine_oclock.py --tasks 2000 --spread-s 2 --lead-s 10   # a quick check

The servers are found as the scheduler finds them (`SCHEDULER_CASSANDRA_HOSTS`,
`SCHEDULER_CASSANDRA_PORT`, `SCHEDULER_KAFKA_BOOTSTRAP`, `SCHEDULER_ZOOKEEPER_HOSTS`;
the local cluster by default). The keyspace, topics and ZooKeeper root are removed at
the end unless `--keep`; dispatchers are always stopped, also on Ctrl-C or SIGTERM.
Their logs and stats files go to `--work-dir` (a temporary directory, removed unless
`--keep` or something went wrong). Exit status: 0 the bench ran (targets may have been
missed: see "missed"), 1 a task was lost or fired early, a dispatcher failed, or a
write failed, 2 a server could not be reached, 130 interrupted.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import math
import multiprocessing
import os
import platform
import random
import resource
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Protocol

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME, Consumer, KafkaException, Message, Producer, TopicPartition
from confluent_kafka.admin import (  # type: ignore[attr-defined]
    AdminClient,
    AlterConfigOpType,
    ConfigEntry,
    ConfigResource,
    NewTopic,
    ResourceType,
)
from kazoo.client import KazooClient

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import DRIVER_ERRORS, CassandraConnection, connect
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.adapters.kafka.publisher import PRODUCER_CONFIG
from scheduler.adapters.kafka.topics import delete_topics, ensure_topics
from scheduler.errors import (
    CoordinatorUnavailable,
    InvalidMessage,
    QueueUnavailable,
    SchedulerError,
    StoreUnavailable,
)
from scheduler.model import (
    BUCKET_MS,
    DEFAULT_MAX_ATTEMPTS,
    MESSAGE_ID_SLICE,
    Priority,
    Task,
    TaskId,
    decode_message,
    encode_message,
    encode_payload,
    from_ms,
)
from scheduler.producer import Client, Submission
from scheduler.settings import READY_TOPICS, CassandraSettings, KafkaSettings, ZooKeeperSettings

TASK_TYPE = "sms"
BOARD_SHARE = 0.8
READ_AHEAD_S = 60
"""The dispatcher reads a minute's partitions this long before the minute starts."""
ASSUMED_INGEST_ROWS_PER_S = 15_000
"""For choosing M: about half the SDK's measured rate, so ingest is done in time."""
LEASE_TIMEOUT_S = 10
SHARDS = 64
READY_PARTITIONS = 8
SETTLE_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
DRAIN_TIMEOUT_S = 30
AFTER_BURST_S = 60
"""How long after the last due second the bench waits for stragglers."""
DUPLICATE_WATCH_S = 2.0
"""How long the reader goes on after the last task was seen, to catch repeats."""
SAMPLE_FENCE = 1 << 33
"""A fencing token of the size ZooKeeper's zxids have, for the ceiling's messages."""

TARGET_FIRE_RATE = 25_000
TARGET_P99_MS = 1_000
TARGET_MAX_MS = 2_000
TARGET_OVERHEAD_BYTES = 64

REFERENCE_CEILINGS = {
    "source": "/work/shared/LOCAL-CLUSTER.md: 2-core machine, servers co-located",
    "kafka_produce_msgs_per_s": "100k msg/s (200 B, acks=all, idempotent, lz4, linger 5 ms)",
    "cassandra_partition_read_rows_per_s": "49k rows/s (16 concurrent, paged 5,000); sequential 32k",
    "cassandra_insert_rows_per_s": "17k-35k rows/s (single-partition UNLOGGED batches)",
    "zookeeper_sync_writes_per_s": "~380/s",
}


KAFKA_LOG = logging.getLogger("nine_oclock.kafka")
"""librdkafka's own log lines (e.g. events purged at close) go here, not to stderr."""


CLEANUP_ERRORS: tuple[type[Exception], ...] = (*DRIVER_ERRORS, StoreUnavailable)


class BenchFailure(Exception):
    """The bench cannot go on: a write failed, a dispatcher died, or time ran out."""


def echo(text: str) -> None:
    print(text, file=sys.stderr, flush=True)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def clock(ms: int) -> str:
    return datetime.fromtimestamp(ms / 1000, timezone.utc).strftime("%H:%M:%S.%f")[:-3]


def sleep_until(at_ms: int) -> None:
    while (left := at_ms - now_ms()) > 0:
        time.sleep(min(left / 1000, 1.0))


@dataclass(frozen=True)
class Options:
    tasks: int
    spread_s: int
    dispatchers: int
    payload_bytes: int
    tenants: int
    lead_s: int
    reader: str
    ceiling_messages: int
    keep: bool
    work_dir: Path | None
    py_spy: Path | None


# The workload.


def text_length_for(payload_bytes: int) -> int:
    """The text length that makes an encoded payload about `payload_bytes` long."""
    length = max(0, payload_bytes - len(encode_payload({"to": "+919800000000", "text": ""})))
    while length and len(encode_payload({"to": "+919800000000", "text": "x" * length})) > payload_bytes:
        length -= 1
    return length


@dataclass(frozen=True)
class Burst:
    """`tasks` tasks due evenly over the first `spread_ms` of the minute at `minute_ms`."""

    minute_ms: int
    tasks: int
    spread_ms: int
    text_len: int
    colleges: int

    def records(self, seed: int, count: int | None = None) -> Iterator[tuple[int, str, dict[str, str]]]:
        """(run_at_ms, tenant, payload): the board has `BOARD_SHARE` of the tasks, college
        n (1-based) a share proportional to 1/n of the rest."""
        rng = random.Random(seed)
        names = [f"college-{n}" for n in range(1, self.colleges + 1)]
        cumulative: list[float] = []
        total = 0.0
        for n in range(1, self.colleges + 1):
            total += 1 / n
            cumulative.append(total)
        filler = "Visit results.example.in for marks and the revaluation form. " * (self.text_len // 60 + 1)
        count = self.tasks if count is None else count
        for n in range(count):
            if rng.random() < BOARD_SHARE:
                tenant = "board"
            else:
                tenant = names[min(bisect.bisect(cumulative, rng.random() * total), self.colleges - 1)]
            text = f"Roll no. {rng.randrange(10**7):07d}: your result is out. {filler}"[: self.text_len]
            payload = {"to": f"+9198{rng.randrange(10**8):08d}", "text": text}
            yield self.minute_ms + n * self.spread_ms // self.tasks, tenant, payload

    def submissions(self, seed: int) -> list[Submission]:
        moments: dict[int, datetime] = {}
        items = []
        for run_at_ms, tenant, payload in self.records(seed):
            run_at = moments.get(run_at_ms) or moments.setdefault(run_at_ms, from_ms(run_at_ms))
            items.append(Submission(TASK_TYPE, payload, tenant=tenant, run_at=run_at))
        return items

    def messages(self, count: int, seed: int) -> list[bytes]:
        """Ready-topic messages for `count` tasks of this burst, as a dispatcher encodes them."""
        return [
            encode_message(Task.unchecked(TaskId.new(run_at_ms), tenant, TASK_TYPE, encode_payload(payload),
                                          run_at_ms, Priority.NORMAL, 1, DEFAULT_MAX_ATTEMPTS, None), SAMPLE_FENCE)
            for run_at_ms, tenant, payload in self.records(seed, count)
        ]

    def mean_payload_bytes(self, sample: int = 2000) -> float:
        sizes = [len(encode_payload(payload)) for _, _, payload in self.records(0, min(sample, self.tasks))]
        return sum(sizes) / len(sizes)


# The deployment: a keyspace, topics and a ZooKeeper root of the bench's own.


@dataclass
class Deployment:
    cassandra: CassandraSettings
    kafka: KafkaSettings
    zookeeper: ZooKeeperSettings
    ceiling_topic: str

    @classmethod
    def fresh(cls) -> Deployment:
        tag = secrets.token_hex(4)
        kafka = KafkaSettings.from_env(topic_prefix=f"nine-oclock-{tag}")
        return cls(
            cassandra=CassandraSettings.from_env(keyspace=f"nine_oclock_{tag}", shard_count=SHARDS),
            kafka=kafka,
            zookeeper=ZooKeeperSettings.from_env(root=f"/nine_oclock_{tag}", session_timeout_s=LEASE_TIMEOUT_S),
            ceiling_topic=f"{kafka.topic_prefix}.ceiling",
        )

    @property
    def ready_topics(self) -> list[str]:
        return [self.kafka.ready_topic(name) for name in READY_TOPICS]

    def env(self) -> dict[str, str]:
        """The variables a dispatcher process reads to find this deployment."""
        return {
            "SCHEDULER_BACKEND": "cassandra",
            "SCHEDULER_CASSANDRA_HOSTS": ",".join(self.cassandra.hosts),
            "SCHEDULER_CASSANDRA_PORT": str(self.cassandra.port),
            "SCHEDULER_KEYSPACE": self.cassandra.keyspace,
            "SCHEDULER_SHARDS_TOTAL": str(self.cassandra.shard_count),
            "SCHEDULER_KAFKA_BOOTSTRAP": self.kafka.bootstrap,
            "SCHEDULER_TOPIC_PREFIX": self.kafka.topic_prefix,
            "SCHEDULER_ZOOKEEPER_HOSTS": self.zookeeper.hosts,
            "SCHEDULER_ZOOKEEPER_ROOT": self.zookeeper.root,
            "SCHEDULER_LEASE_TIMEOUT_S": str(LEASE_TIMEOUT_S),
        }

    def create(self, connection: CassandraConnection, cleanup: list[Callable[[], None]], keep: bool) -> None:
        """Keyspace, topics (ready topics stamped `LogAppendTime`), ceiling topic; each
        registered for removal unless `keep`."""
        if not keep:
            cleanup.append(self.drop_zookeeper_root)
            cleanup.append(lambda: self.drop_keyspace(connection))
        schema.apply(connection, self.cassandra)
        if not keep:
            cleanup.append(self.drop_topics)
        ensure_topics(self.kafka, shard_count=SHARDS, ready_partitions=READY_PARTITIONS)
        admin = self.admin()
        created = admin.create_topics([NewTopic(self.ceiling_topic, num_partitions=READY_PARTITIONS,
                                                replication_factor=-1)], request_timeout=30)
        for future in created.values():
            future.result(timeout=60)
        stamped = admin.incremental_alter_configs([
            ConfigResource(ResourceType.TOPIC, topic, incremental_configs=[
                ConfigEntry("message.timestamp.type", "LogAppendTime", incremental_operation=AlterConfigOpType.SET)])
            for topic in self.ready_topics
        ])
        for future in stamped.values():
            future.result(timeout=60)

    def admin(self) -> AdminClient:
        config: dict[str, Any] = {"bootstrap.servers": self.kafka.bootstrap, "logger": KAFKA_LOG}
        return AdminClient(config)

    def drop_keyspace(self, connection: CassandraConnection) -> None:
        """Drop the keyspace; once more on a new connection if the first one broke (a
        server restarted under the run)."""
        statement = f"DROP KEYSPACE IF EXISTS {self.cassandra.keyspace}"
        try:
            connection.session.execute(statement, timeout=120)
            return
        except DRIVER_ERRORS:
            pass
        try:
            with connect(self.cassandra) as again:
                again.session.execute(statement, timeout=120)
        except CLEANUP_ERRORS as exc:
            echo(f"warning: could not drop keyspace {self.cassandra.keyspace}: {exc}")

    def drop_topics(self) -> None:
        try:
            delete_topics(self.kafka)
            admin = self.admin()
            for future in admin.delete_topics([self.ceiling_topic], operation_timeout=30).values():
                future.result(timeout=60)
        except (SchedulerError, KafkaException) as exc:
            echo(f"warning: could not delete the topics {self.kafka.topic_prefix}.*: {exc}")

    def drop_zookeeper_root(self) -> None:
        client = KazooClient(hosts=self.zookeeper.hosts, timeout=10)
        try:
            client.start(timeout=15)
            if client.exists(self.zookeeper.root):
                client.delete(self.zookeeper.root, recursive=True)
        except Exception as exc:  # kazoo raises many unrelated types; this is cleanup
            echo(f"warning: could not delete the ZooKeeper root {self.zookeeper.root}: {exc}")
        finally:
            client.stop()
            client.close()


# The Kafka ceiling.


def kafka_ceiling(kafka: KafkaSettings, topic: str, messages: Sequence[bytes], rounds: int = 3) -> dict[str, Any]:
    """Messages/s of one process producing `messages` with the dispatcher's producer
    settings, from the first `produce` to the end of the `flush`: the median of `rounds`
    runs (one run is well under a second, so one alone is noisy), after an untimed 1%."""
    failed = 0

    def delivered(error: Any, _: Message) -> None:
        nonlocal failed
        if error is not None:
            failed += 1

    config: dict[str, Any] = {"bootstrap.servers": kafka.bootstrap, "client.id": "nine-oclock-ceiling",
                              **PRODUCER_CONFIG, "on_delivery": delivered, "logger": KAFKA_LOG}
    producer = Producer(config)

    def produce_all(values: Sequence[bytes]) -> float:
        started = time.monotonic()
        produce = producer.produce
        for value in values:
            while True:
                try:
                    produce(topic, value)
                    break
                except BufferError:
                    producer.poll(0.01)
        if producer.flush(120) or failed:
            raise BenchFailure(f"the Kafka ceiling run lost messages: {failed} failed, {len(producer)} unacknowledged")
        return time.monotonic() - started

    produce_all(messages[: max(1, len(messages) // 100)])
    rates = sorted(round(len(messages) / produce_all(messages)) for _ in range(rounds))
    return {"messages": len(messages), "message_bytes_mean": round(sum(map(len, messages)) / len(messages), 1),
            "msgs_per_s": rates[len(rates) // 2], "runs": rates, "settings": dict(PRODUCER_CONFIG)}


# Ingest.


def ingest(cassandra: CassandraSettings, items: list[Submission]) -> tuple[dict[str, Any], dict[bytes, int]]:
    """Store every item with the SDK; the timing and id -> run_at_ms of what was stored."""
    store = CassandraTaskStore.open(cassandra)
    try:
        client = Client(store, handoff=None)
        started = time.monotonic()
        report = client.submit_many(items, keep_ids=True)
        seconds = time.monotonic() - started
    finally:
        store.close()
    if not report.complete or report.stored != len(items):
        errors = report.rejected or report.failed
        raise BenchFailure(f"ingest stored {report.stored:,} of {len(items):,}"
                           + (f"; first error: {errors[0].reason}" if errors else ""))
    expected = {task_id.bytes: task_id.run_at_ms for task_id in report.ids or [] if task_id is not None}
    timing = {"tasks": report.stored, "seconds": round(seconds, 3), "rows_per_s": round(report.stored / seconds)}
    return timing, expected


# Processes: CPU and memory from /proc.

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process `pid`, all its threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICKS_PER_S


SERVER_MARKERS = {"cassandra": "org.apache.cassandra.service.CassandraDaemon", "kafka": "kafka.Kafka",
                  "zookeeper": "org.apache.zookeeper.server.quorum.QuorumPeerMain"}


def server_pids() -> dict[str, int]:
    """PIDs of the Cassandra, Kafka and ZooKeeper JVMs on this machine, if they run here."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for name, marker in SERVER_MARKERS.items():
            if marker.encode() in arguments and name not in found:
                found[name] = int(entry.name)
    return found


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    snapshot = {name: cpu for name, pid in pids.items() if (cpu := cpu_seconds(pid)) is not None}
    snapshot["machine"] = machine_busy_seconds()
    return snapshot


def cpu_window(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """CPU seconds each process used between two snapshots, and cores' worth of it."""
    used = {name: round(after[name] - before[name], 2) for name in before if name in after}
    return {"seconds": round(seconds, 2), "cpu_s": used,
            "cores": {name: round(cpu / seconds, 2) for name, cpu in used.items()} if seconds > 0 else {}}


# Dispatchers.


@dataclass
class DispatcherProcess:
    name: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stats_path: Path
    samples: dict[str, dict[str, Any]] = field(default_factory=dict)

    def stats(self) -> dict[str, Any]:
        try:
            document: dict[str, Any] = json.loads(self.stats_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return document

    def sample(self) -> dict[str, Any]:
        stats = self.stats()
        counters = stats.get("stats", {})
        return {"at_ms": now_ms(), "stats_at_ms": stats.get("at_ms"), "rss_bytes": rss_bytes(self.process.pid),
                "cpu_s": cpu_seconds(self.process.pid), "shards": len(stats.get("shards", [])),
                "waiting": stats.get("waiting", 0), "wheel_bytes": stats.get("wheel_bytes", 0),
                "loaded": counters.get("loaded", 0), "fired": counters.get("fired", 0)}

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


class Fleet:
    """The dispatcher processes of one run, each with its own log and stats file."""

    def __init__(self, deployment: Deployment, directory: Path) -> None:
        self.env = {**os.environ, **deployment.env()}
        self.directory = directory
        self.members: list[DispatcherProcess] = []

    def start(self, count: int) -> None:
        for n in range(1, count + 1):
            name = f"dispatcher-{n}"
            log_path, stats_path = self.directory / f"{name}.log", self.directory / f"{name}.json"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [sys.executable, "-m", "scheduler", "dispatcher", "--backend", "cassandra", "--shards", "auto",
                     "--member", name, "--stats-file", str(stats_path), "--lease-timeout", str(LEASE_TIMEOUT_S)],
                    stdout=subprocess.DEVNULL, stderr=log, env=self.env, start_new_session=True,
                )
            self.members.append(DispatcherProcess(name, process, log_path, stats_path))

    def check_alive(self) -> None:
        for member in self.members:
            if not member.alive():
                raise BenchFailure(f"{member.name} exited with status {member.process.returncode}; the end of "
                                   f"its log ({member.log_path}):\n{member.log_tail()}")

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
        for member in self.members:
            if member.alive():
                member.process.send_signal(signal.SIGTERM)
        codes: list[int | None] = []
        for member in self.members:
            try:
                codes.append(member.process.wait(timeout=STOP_TIMEOUT_S))
            except subprocess.TimeoutExpired:
                echo(f"warning: {member.name} did not stop within {STOP_TIMEOUT_S} s of SIGTERM; killing it")
                member.process.kill()
                member.process.wait(timeout=10)
                codes.append(None)
        return codes


class Profiler:
    """py-spy recordings of each dispatcher, one per phase, in raw (collapsed) form."""

    def __init__(self, directory: Path | None, fleet: Fleet) -> None:
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


# The reader of the ready topics.


class Flag(Protocol):
    def is_set(self) -> bool: ...


class Count(Protocol):
    value: int


@dataclass
class Counter:
    value: int = 0


Record = tuple[bytes, int, int]
"""(message value, broker timestamp in ms, timestamp type)."""


def read_ready_topics(bootstrap: str, topics: Sequence[str], stop: Flag, seen: Count) -> tuple[list[Record], float]:
    """Every message of `topics` from offset 0 until `stop`, then to the end of each
    partition; `seen` counts distinct task ids as they come. Messages are kept as they
    arrived (decoded afterwards), so the reader costs little while the burst runs.
    Returns the records and the CPU seconds of this process while reading."""
    consumer = Consumer({"bootstrap.servers": bootstrap, "group.id": "nine-oclock-reader",
                         "enable.auto.commit": False, "auto.offset.reset": "earliest"})
    cpu_started = resource.getrusage(resource.RUSAGE_SELF)
    metadata = consumer.list_topics(timeout=30)
    partitions = [TopicPartition(topic, p, 0) for topic in topics for p in metadata.topics[topic].partitions]
    consumer.assign(partitions)
    records: list[Record] = []
    ids: set[bytes] = set()

    def take(batch: list[Message]) -> None:
        for message in batch:
            value = message.value()
            if message.error() is not None or value is None:
                continue
            kind, stamp = message.timestamp()
            records.append((value, stamp, kind))
            ids.add(value[MESSAGE_ID_SLICE])
        seen.value = len(ids)

    while not stop.is_set():
        take(consumer.consume(10_000, 0.2))
    ends = {(p.topic, p.partition): consumer.get_watermark_offsets(TopicPartition(p.topic, p.partition),
                                                                   timeout=10)[1] for p in partitions}
    deadline = time.monotonic() + DRAIN_TIMEOUT_S
    while time.monotonic() < deadline:
        positions = consumer.position(partitions)
        if all(max(p.offset, 0) >= ends[(p.topic, p.partition)] for p in positions):
            break
        take(consumer.consume(10_000, 0.2))
    consumer.close()
    cpu_ended = resource.getrusage(resource.RUSAGE_SELF)
    cpu = (cpu_ended.ru_utime + cpu_ended.ru_stime) - (cpu_started.ru_utime + cpu_started.ru_stime)
    return records, cpu


@dataclass
class StopOrOrphaned:
    """Set when the bench says stop, or when the bench is gone (killed)."""

    stop: Any
    parent: int

    def is_set(self) -> bool:
        return bool(self.stop.is_set()) or os.getppid() != self.parent


def reader_process_main(bootstrap: str, topics: list[str], stop: Any, seen: Any, connection: Any) -> None:
    """A spawned reader process's body: read, then send the records and CPU seconds back."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops it through `stop`
    try:
        connection.send(read_ready_topics(bootstrap, topics, StopOrOrphaned(stop, os.getppid()), seen))
    finally:
        connection.close()


class Reader:
    """`read_ready_topics` on a thread of the bench or in a process of its own."""

    def __init__(self, mode: str, bootstrap: str, topics: list[str]) -> None:
        self.mode = mode
        self.result: tuple[list[Record], float] | None = None
        self.pid: int | None = None
        if mode == "thread":
            self._stop: Any = threading.Event()
            self._seen: Any = Counter()

            def run() -> None:
                self.result = read_ready_topics(bootstrap, topics, self._stop, self._seen)

            self._thread = threading.Thread(target=run, name="ready-reader", daemon=True)
            self._thread.start()
            self.pid = os.getpid()
        else:
            context = multiprocessing.get_context("spawn")
            self._stop = context.Event()
            self._seen = context.Value("q", 0, lock=False)
            self._receive, send = context.Pipe(duplex=False)
            self._process = context.Process(target=reader_process_main, name="ready-reader",
                                            args=(bootstrap, topics, self._stop, self._seen, send), daemon=True)
            self._process.start()
            send.close()
            self.pid = self._process.pid

    @property
    def seen(self) -> int:
        return int(self._seen.value)

    def finish(self) -> tuple[list[Record], float]:
        """Stop reading once every partition is read to its end; the records and CPU seconds."""
        self._stop.set()
        if self.mode == "thread":
            self._thread.join(DRAIN_TIMEOUT_S + 30)
        elif self._receive.poll(DRAIN_TIMEOUT_S + 60):
            self.result = self._receive.recv()
            self._process.join(10)
        if self.result is None:
            raise BenchFailure("the ready-topic reader did not finish")
        return self.result

    def abort(self) -> None:
        self._stop.set()
        if self.mode == "process" and self._process.is_alive():
            self._process.terminate()
            self._process.join(10)


# Figures.


def relative(timeline: list[dict[str, Any]], minute_ms: int) -> list[dict[str, Any]]:
    """Timeline points with their time as milliseconds after M (negative before it)."""
    return [{"after_minute_ms": point["at_ms"] - minute_ms, **{k: v for k, v in point.items() if k != "at_ms"}}
            for point in timeline]


def percentile(ordered: Sequence[int], share: float) -> int | None:
    """Nearest-rank percentile of an ascending sequence."""
    if not ordered:
        return None
    return ordered[max(0, math.ceil(share * len(ordered)) - 1)]


def peak_in_window(ordered: Sequence[int], window_ms: int) -> int:
    """Most values of an ascending sequence within any `window_ms`."""
    best = start = 0
    for end, value in enumerate(ordered):
        while value - ordered[start] >= window_ms:
            start += 1
        best = max(best, end - start + 1)
    return best


def lateness_figures(lateness: Sequence[int]) -> dict[str, Any]:
    ordered = sorted(lateness)
    count = len(ordered)
    over = sum(1 for value in ordered if value > 1000)
    return {"p50": percentile(ordered, 0.5), "p90": percentile(ordered, 0.9), "p99": percentile(ordered, 0.99),
            "p99_9": percentile(ordered, 0.999), "max": ordered[-1] if ordered else None,
            "min": ordered[0] if ordered else None,
            "mean": round(sum(ordered) / count, 1) if count else None,
            "over_1s": over, "over_1s_share": round(over / count, 5) if count else None,
            "early": sum(1 for value in ordered if value < 0)}


def analyse(records: list[Record], expected: dict[bytes, int], burst: Burst) -> dict[str, Any]:
    """Delivery, lateness and fire rate from every message read."""
    first: dict[bytes, int] = {}
    copies: dict[bytes, int] = {}
    fences: set[int] = set()
    unexpected = mismatched = invalid = log_append = 0
    for value, stamp, kind in records:
        try:
            message = decode_message(value)
        except InvalidMessage:
            invalid += 1
            continue
        key = message.task.id.bytes
        run_at = expected.get(key)
        if run_at is None:
            unexpected += 1
            continue
        if message.task.run_at_ms != run_at:
            mismatched += 1
        fences.add(message.fence)
        log_append += kind == TIMESTAMP_LOG_APPEND_TIME
        copies[key] = copies.get(key, 0) + 1
        if key not in first or stamp < first[key]:
            first[key] = stamp
    lateness = [stamp - expected[key] for key, stamp in first.items()]
    published = sorted(first.values())
    by_second: dict[int, list[int]] = {}
    for key, stamp in first.items():
        by_second.setdefault((expected[key] - burst.minute_ms) // 1000, []).append(stamp - expected[key])
    fire: dict[str, Any] = {"published_tasks": len(first)}
    if published:
        span_ms = published[-1] - burst.minute_ms
        fire.update({
            "first_publish_after_minute_ms": published[0] - burst.minute_ms,
            "last_publish_after_minute_ms": span_ms,
            "tasks_per_s": round(len(published) / (span_ms / 1000)) if span_ms > 0 else None,
            "peak_1s": peak_in_window(published, 1000),
            "due_per_s": round(burst.tasks / (burst.spread_ms / 1000)),
            "published_per_s": per_second(published, burst.minute_ms),
        })
    repeated = [count for count in copies.values() if count > 1]
    return {
        "delivery": {"expected": len(expected), "published": len(first), "lost": len(expected) - len(first),
                     "duplicated_tasks": len(repeated), "extra_messages": sum(repeated) - len(repeated),
                     "messages": len(records), "unexpected": unexpected, "invalid": invalid,
                     "run_at_mismatches": mismatched, "fences": len(fences),
                     "broker_timestamps": log_append == sum(copies.values()) and log_append > 0},
        "lateness_ms": {**lateness_figures(lateness), "by_due_second": {
            str(second): {"tasks": len(values), "p50": percentile(sorted(values), 0.5),
                          "p99": percentile(sorted(values), 0.99), "max": max(values)}
            for second, values in sorted(by_second.items())}},
        "fire": fire,
    }


def per_second(ordered: Sequence[int], minute_ms: int) -> list[int]:
    """First publishes per second from M (second 0) to the last one."""
    counts = [0] * (max(0, (ordered[-1] - minute_ms) // 1000) + 1)
    for stamp in ordered:
        if stamp >= minute_ms:
            counts[(stamp - minute_ms) // 1000] += 1
    return counts


def memory_figures(fleet: Fleet, payload_mean: float, baseline_clean: bool) -> dict[str, Any]:
    """Per loaded task: growth of wheel bytes and of RSS from baseline to loaded, over the
    growth in tasks waiting; and the same less the mean payload. RSS once the wheels are
    empty again ("fired") tells how much of the growth the process keeps regardless."""
    keys = ("rss_bytes", "waiting", "wheel_bytes")
    samples = {label: {key: sum(m.samples.get(label, {}).get(key) or 0 for m in fleet.members) for key in keys}
               for label in ("baseline", "loaded", "fired")}
    base, loaded = samples["baseline"], samples["loaded"]
    tasks = loaded["waiting"] - base["waiting"]
    figures: dict[str, Any] = {"payload_bytes_mean": round(payload_mean, 1), "baseline_clean": baseline_clean,
                               **samples, "tasks": tasks}
    if tasks > 0:
        wheel = (loaded["wheel_bytes"] - base["wheel_bytes"]) / tasks
        rss = (loaded["rss_bytes"] - base["rss_bytes"]) / tasks
        figures.update({"wheel_bytes_per_task": round(wheel, 1),
                        "wheel_bytes_per_task_over_payload": round(wheel - payload_mean, 1),
                        "rss_bytes_per_task": round(rss, 1),
                        "rss_bytes_per_task_over_payload": round(rss - payload_mean, 1)})
    return figures


def judge(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Each figure against its target: (figure, value, target, limit, whether the limit is a floor)."""
    fire, lateness, delivery, memory = result["fire"], result["lateness_ms"], result["delivery"], result["memory"]
    per_task = f"<= payload + {TARGET_OVERHEAD_BYTES} B a task"
    checks: list[tuple[str, float | None, str, float, bool]] = [
        ("fire rate", fire.get("tasks_per_s"), f">= {TARGET_FIRE_RATE:,} tasks/s", TARGET_FIRE_RATE, True),
        ("lateness p99", lateness["p99"], f"<= {TARGET_P99_MS} ms", TARGET_P99_MS, False),
        ("lateness max", lateness["max"], f"<= {TARGET_MAX_MS} ms", TARGET_MAX_MS, False),
        ("lost", delivery["lost"], "0", 0, False),
        ("early", lateness["early"], "0", 0, False),
        ("memory (wheel)", memory.get("wheel_bytes_per_task_over_payload"), per_task, TARGET_OVERHEAD_BYTES, False),
        ("memory (RSS)", memory.get("rss_bytes_per_task_over_payload"), per_task, TARGET_OVERHEAD_BYTES, False),
    ]
    return [{"figure": name, "value": value, "target": target,
             "met": None if value is None else (value >= limit if floor else value <= limit)}
            for name, value, target, limit, floor in checks]


# The run.


def run(options: Options, cleanup: list[Callable[[], None]], document: dict[str, Any]) -> dict[str, Any]:
    deployment = Deployment.fresh()
    document["deployment"] = {"keyspace": deployment.cassandra.keyspace,
                              "topic_prefix": deployment.kafka.topic_prefix,
                              "zookeeper_root": deployment.zookeeper.root, "kept": options.keep}
    servers = server_pids()
    connection = connect(deployment.cassandra)
    cleanup.append(connection.close)
    deployment.create(connection, cleanup, options.keep)
    work_dir = options.work_dir or Path(tempfile.mkdtemp(prefix="nine-oclock-"))
    work_dir.mkdir(parents=True, exist_ok=True)
    document["work_dir"] = str(work_dir)
    echo(f"deployment: keyspace {deployment.cassandra.keyspace}, topics {deployment.kafka.topic_prefix}.*, "
         f"ZooKeeper {deployment.zookeeper.root}, logs in {work_dir}")

    text_len = text_length_for(options.payload_bytes)
    like = Burst(now_ms(), options.tasks, options.spread_s * 1000, text_len, options.tenants)
    echo(f"kafka ceiling: producing {options.ceiling_messages:,} messages ...")
    document["kafka_ceiling"] = kafka_ceiling(deployment.kafka, deployment.ceiling_topic,
                                              like.messages(options.ceiling_messages, seed=7))
    echo(f"kafka ceiling: {document['kafka_ceiling']['msgs_per_s']:,} msgs/s "
         f"({document['kafka_ceiling']['message_bytes_mean']} B messages)")

    estimate_s = options.tasks / ASSUMED_INGEST_ROWS_PER_S + 2
    minute_ms = math.ceil((now_ms() + (estimate_s + options.lead_s) * 1000) / BUCKET_MS) * BUCKET_MS
    burst = Burst(minute_ms, options.tasks, options.spread_s * 1000, text_len, options.tenants)
    document["burst"] = {"minute": datetime.fromtimestamp(minute_ms / 1000, timezone.utc).isoformat(),
                         "minute_ms": minute_ms, "due_per_s": round(options.tasks / options.spread_s)}
    echo(f"burst minute M = {clock(minute_ms)} UTC; ingesting {options.tasks:,} tasks ...")
    items = burst.submissions(seed=1)
    document["ingest"], expected = ingest(deployment.cassandra, items)
    del items
    ingested_ms = now_ms()
    document["ingest"]["done_before_minute_s"] = round((minute_ms - ingested_ms) / 1000, 1)
    echo(f"ingest: {document['ingest']['rows_per_s']:,} rows/s; {(minute_ms - ingested_ms) / 1000:.1f} s before M")
    if ingested_ms >= minute_ms - 1000:
        raise BenchFailure("ingest ended less than a second before the burst minute: raise --lead-s")

    fleet = Fleet(deployment, work_dir)
    profiler = Profiler(options.py_spy, fleet)
    reader = Reader(options.reader, deployment.kafka.bootstrap, deployment.ready_topics)
    completed = False
    try:
        fleet.start(options.dispatchers)
        started_ms = now_ms()
        settle_s = fleet.wait_for_shards(SETTLE_TIMEOUT_S)
        echo(f"dispatchers: {options.dispatchers} hold the {SHARDS} shards after {settle_s:.1f} s")
        load_ms = minute_ms - READ_AHEAD_S * 1000
        sleep_until(load_ms - 2000)
        pids = {**servers, **{m.name: m.process.pid for m in fleet.members}, "reader": reader.pid or 0}
        if options.reader == "process":
            pids["bench"] = os.getpid()
        baseline = fleet.sample("baseline")
        baseline_ms, cpu_before_load = now_ms(), cpu_snapshot(pids)
        baseline_clean = baseline["waiting"] == 0 and baseline_ms < load_ms
        profiler.start("load")
        echo(f"baseline: RSS {baseline['rss_bytes'] / 2**20:.1f} MiB, {baseline['waiting']:,} waiting; "
             f"the dispatchers read M at {clock(max(load_ms, started_ms))}")
        loaded_ms = cpu_loaded = None
        load_timeline: list[dict[str, Any]] = []
        while now_ms() < minute_ms - 1500:
            fleet.check_alive()
            totals = fleet.totals()
            if not load_timeline or now_ms() - load_timeline[-1]["at_ms"] >= 1000:
                load_timeline.append({"at_ms": now_ms(), **totals})
            if loaded_ms is None and totals["loaded"] >= options.tasks:
                loaded_ms, cpu_loaded = now_ms(), cpu_snapshot(pids)
                echo(f"loaded: all {options.tasks:,} tasks in the wheels "
                     f"{(loaded_ms - max(load_ms, started_ms)) / 1000:.1f} s after the read began")
            time.sleep(0.25)
        loaded = fleet.sample("loaded")
        profiler.stop()
        document["load"] = {
            "loaded": loaded["loaded"], "waiting": loaded["waiting"],
            "complete_before_minute": loaded["waiting"] >= options.tasks,
            "seconds": round((loaded_ms - max(load_ms, started_ms)) / 1000, 1) if loaded_ms else None,
            "cpu": cpu_window(cpu_before_load, cpu_loaded or cpu_snapshot(pids),
                              ((loaded_ms or now_ms()) - baseline_ms) / 1000),
            "peak_rss_bytes": max(point["rss_bytes"] for point in [*load_timeline, loaded]),
            "timeline": relative(load_timeline, minute_ms),
        }
        echo(f"before M: RSS {loaded['rss_bytes'] / 2**20:.1f} MiB, {loaded['waiting']:,} waiting, "
             f"wheels {loaded['wheel_bytes'] / 2**20:.1f} MiB")

        sleep_until(minute_ms - 500)
        profiler.start("burst")
        cpu_burst = cpu_snapshot(pids)
        deadline_ms = minute_ms + (options.spread_s + AFTER_BURST_S) * 1000
        timeline: list[dict[str, Any]] = []
        all_seen_ms = None
        while now_ms() < deadline_ms:
            if reader.seen >= options.tasks:
                all_seen_ms = now_ms()
                break
            if not any(member.alive() for member in fleet.members):
                break
            if not timeline or now_ms() - timeline[-1]["at_ms"] >= 1000:
                timeline.append({"at_ms": now_ms(), "seen": reader.seen, **fleet.totals()})
            time.sleep(0.1)
        end_ms = all_seen_ms or now_ms()
        cpu_burst_end = cpu_snapshot(pids)
        echo(f"burst: {reader.seen:,} of {options.tasks:,} seen "
             + (f"{(end_ms - minute_ms) / 1000:.1f} s after M" if all_seen_ms else "when the bench stopped waiting"))
        time.sleep(DUPLICATE_WATCH_S)
        profiler.stop()
        fleet.sample("fired")
        document["timeline"] = relative(timeline, minute_ms)
        document["cpu_burst"] = cpu_window(cpu_burst, cpu_burst_end, (end_ms - minute_ms + 500) / 1000)
        completed = True
    finally:
        profiler.stop()
        codes = fleet.stop()
        if not completed:
            reader.abort()
    records, reader_cpu = reader.finish()
    document["dispatchers"] = [
        {"name": m.name, "pid": m.process.pid, "exit_code": code, "log": str(m.log_path),
         "log_warnings": m.log_warnings(), "samples": m.samples, "final": m.stats()}
        for m, code in zip(fleet.members, codes, strict=True)
    ]
    servers_now = server_pids()
    document["warnings"] = [f"{name} restarted during the run (pid {pid} -> {servers_now.get(name)}): figures "
                            "are suspect" for name, pid in servers.items() if servers_now.get(name) != pid]
    document["warnings"] += [f"{d['name']} logged {d['log_warnings']['count']} warnings or errors, first: "
                             f"{d['log_warnings']['first'][0]}" for d in document["dispatchers"]
                             if d["log_warnings"]["count"]]
    if profiler.files:
        document["py_spy"] = profiler.files
    document["reader"] = {"mode": options.reader, "messages": len(records), "cpu_s": round(reader_cpu, 2)}
    result = analyse(records, expected, burst)
    fire = result["fire"]
    if fire.get("tasks_per_s"):
        fire["vs_kafka_ceiling"] = round(fire["tasks_per_s"] / document["kafka_ceiling"]["msgs_per_s"], 3)
    result["memory"] = memory_figures(fleet, burst.mean_payload_bytes(), baseline_clean)
    document.update(result)
    document["targets"] = judge(result)
    document["missed"] = [check["figure"] for check in document["targets"] if check["met"] is False]
    failures = [f"{m.name} exited with status {code}" for m, code in zip(fleet.members, codes, strict=True)
                if code not in (0, -signal.SIGTERM)]
    if result["delivery"]["lost"]:
        failures.append(f"{result['delivery']['lost']:,} tasks were never published")
    if result["lateness_ms"]["early"]:
        failures.append(f"{result['lateness_ms']['early']:,} tasks were published before their time")
    document["failures"] = failures
    return document


# Output.


def table(doc: dict[str, Any]) -> list[str]:
    fire, late, delivery, memory = doc["fire"], doc["lateness_ms"], doc["delivery"], doc["memory"]
    settings = doc["settings"]

    def number(value: Any, unit: str = "") -> str:
        if value is None:
            return "n/a"
        return f"{value:,}{unit}" if isinstance(value, int) else f"{value:,.1f}{unit}"

    lines = [
        f"nine o'clock: {settings['tasks']:,} tasks due over {settings['spread_s']} s "
        f"({doc['burst']['due_per_s']:,}/s) at {doc['burst']['minute']}, {settings['dispatchers']} dispatcher(s), "
        f"reader in a {settings['reader']}",
        f"  ingest (SDK)            {number(doc['ingest']['rows_per_s'])} rows/s",
        f"  kafka ceiling           {number(doc['kafka_ceiling']['msgs_per_s'])} msgs/s, median of "
        f"{', '.join(f'{rate / 1000:.0f}k' for rate in doc['kafka_ceiling']['runs'])} "
        f"({doc['kafka_ceiling']['message_bytes_mean']} B messages); LOCAL-CLUSTER.md: "
        f"{REFERENCE_CEILINGS['kafka_produce_msgs_per_s']}",
        f"  load of minute M        {number(doc['load']['seconds'], ' s')} "
        f"({'complete' if doc['load']['complete_before_minute'] else 'INCOMPLETE'} before M); "
        f"LOCAL-CLUSTER.md read ceiling {REFERENCE_CEILINGS['cassandra_partition_read_rows_per_s']}",
        f"  fire rate               {number(fire.get('tasks_per_s'))} tasks/s (peak {number(fire.get('peak_1s'))} "
        f"in 1 s; {(fire.get('vs_kafka_ceiling') or 0) * 100:.0f}% of the Kafka ceiling)",
        f"  last publish            {number(fire.get('last_publish_after_minute_ms'), ' ms')} after M",
        f"  lateness                p50 {number(late['p50'])}  p90 {number(late['p90'])}  p99 {number(late['p99'])}  "
        f"p99.9 {number(late['p99_9'])}  max {number(late['max'])} ms; over 1 s {number(late['over_1s'])} "
        f"({(late['over_1s_share'] or 0) * 100:.2f}%); early {late['early']}",
        f"  delivery                published {delivery['published']:,} of {delivery['expected']:,}, "
        f"lost {delivery['lost']:,}, duplicated {delivery['duplicated_tasks']:,} "
        f"(+{delivery['extra_messages']:,} messages), fences {delivery['fences']}",
        f"  memory per loaded task  wheel {number(memory.get('wheel_bytes_per_task'), ' B')} "
        f"(payload + {number(memory.get('wheel_bytes_per_task_over_payload'))}), "
        f"RSS {number(memory.get('rss_bytes_per_task'), ' B')} "
        f"(payload + {number(memory.get('rss_bytes_per_task_over_payload'))}); payload "
        f"{memory['payload_bytes_mean']} B" + ("" if memory["baseline_clean"] else " (baseline not clean)"),
        f"  dispatcher RSS          {memory['baseline']['rss_bytes'] / 2**20:.1f} MiB at baseline, "
        f"{doc['load']['peak_rss_bytes'] / 2**20:.1f} at most while loading, "
        f"{memory['loaded']['rss_bytes'] / 2**20:.1f} loaded, {memory['fired']['rss_bytes'] / 2**20:.1f} "
        "once all fired (wheels empty)",
        f"  reader                  {doc['reader']['messages']:,} messages, {doc['reader']['cpu_s']} CPU s",
    ]
    burst_cpu = doc.get("cpu_burst", {}).get("cores", {})
    if burst_cpu:
        lines.append("  cores used in the burst " + ", ".join(f"{k} {v}" for k, v in burst_cpu.items()))
    missed = doc["missed"]
    lines.append("  targets missed:         " + (", ".join(
        f"{c['figure']} ({number(c['value'])}; target {c['target']})" for c in doc["targets"] if c["met"] is False)
        if missed else "none"))
    if doc["burst"]["due_per_s"] < TARGET_FIRE_RATE:
        lines.append(f"  (only {doc['burst']['due_per_s']:,} tasks/s fall due: the fire-rate target needs "
                     f"--tasks / --spread-s of at least {TARGET_FIRE_RATE:,})")
    for warning in doc["warnings"]:
        lines.append(f"  WARNING: {warning}")
    for failure in doc["failures"]:
        lines.append(f"  FAILED: {failure}")
    return lines


def parse_args(argv: Sequence[str]) -> tuple[argparse.Namespace, Options]:
    parser = argparse.ArgumentParser(
        description="The 9:00 burst on the real cluster: tasks due in the first seconds of one minute, fired by "
                    "real dispatcher processes; fire rate, lateness of every task, lost and duplicated tasks, "
                    "memory per loaded task, next to the Kafka ceiling measured in the same run.",
        epilog="Servers: SCHEDULER_CASSANDRA_HOSTS, SCHEDULER_CASSANDRA_PORT, SCHEDULER_KAFKA_BOOTSTRAP, "
               "SCHEDULER_ZOOKEEPER_HOSTS (default: the local cluster). Exit status: 0 ran (see 'missed'), "
               "1 lost or early tasks or a failed dispatcher, 2 a server unreachable, 130 interrupted.")
    parser.add_argument("--tasks", type=int, default=300_000, help="tasks in the burst (default 300,000)")
    parser.add_argument("--spread-s", type=int, default=10,
                        help="tasks fall due evenly over the first S seconds of the minute, N/S a second "
                             "(1-60, default 10)")
    parser.add_argument("--dispatchers", type=int, default=1, help="dispatcher processes (1-64, default 1)")
    parser.add_argument("--payload-bytes", type=int, default=100,
                        help="encoded payload size, about (default 100)")
    parser.add_argument("--tenants", type=int, default=5000,
                        help=f"colleges beside the board, which has {BOARD_SHARE * 100:.0f}%% of the tasks; college n has "
                             "a share of the rest proportional to 1/n (default 5,000)")
    parser.add_argument("--lead-s", type=int, default=75,
                        help="M is the first minute boundary at least the estimated ingest time plus this ahead "
                             f"(default 75). Below {READ_AHEAD_S + 2} the dispatchers read M as they start, so the "
                             "baseline may hold tasks already and the memory figures mean little: for quick checks")
    parser.add_argument("--reader", choices=("process", "thread"), default="process",
                        help="read the ready topics in a process of its own or on a thread of the bench "
                             "(default process)")
    parser.add_argument("--ceiling-messages", type=int, default=200_000,
                        help="messages of the Kafka ceiling run (default 200,000)")
    parser.add_argument("--out", type=Path, help="write the JSON document to this file")
    parser.add_argument("--json", action="store_true", help="print the JSON document on stdout (table on stderr)")
    parser.add_argument("--keep", action="store_true",
                        help="keep the keyspace, topics, ZooKeeper root and the work directory")
    parser.add_argument("--work-dir", type=Path,
                        help="dispatcher logs and stats files (default: a temporary directory, removed at the "
                             "end unless --keep or something failed)")
    parser.add_argument("--py-spy", type=Path, metavar="DIR",
                        help="record each dispatcher with py-spy (raw collapsed stacks, by thread) during the "
                             "load and the burst into DIR")
    args = parser.parse_args(argv)
    if args.tasks < 1 or not 1 <= args.spread_s <= 60 or not 1 <= args.dispatchers <= SHARDS:
        parser.error("--tasks must be positive, --spread-s 1 to 60, --dispatchers 1 to 64")
    if args.payload_bytes < 0 or args.tenants < 1 or args.lead_s < 5 or args.ceiling_messages < 100:
        parser.error("--payload-bytes >= 0, --tenants >= 1, --lead-s >= 5, --ceiling-messages >= 100")
    return args, Options(args.tasks, args.spread_s, args.dispatchers, args.payload_bytes, args.tenants,
                         args.lead_s, args.reader, args.ceiling_messages, args.keep, args.work_dir, args.py_spy)


def interrupted(*_: Any) -> None:
    raise KeyboardInterrupt


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    args, options = parse_args(argv)
    signal.signal(signal.SIGTERM, interrupted)  # so SIGTERM, too, stops the dispatchers and cleans up
    document: dict[str, Any] = {
        "command": [sys.executable, sys.argv[0], *argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "python": platform.python_version(),
                    "platform": platform.platform(), "loadavg": os.getloadavg()},
        "settings": {**{k: (str(v) if isinstance(v, Path) else v) for k, v in asdict(options).items()},
                     "board_share": BOARD_SHARE, "lease_timeout_s": LEASE_TIMEOUT_S, "shards": SHARDS,
                     "ready_partitions": READY_PARTITIONS},
        "reference_ceilings": REFERENCE_CEILINGS,
    }
    cleanup: list[Callable[[], None]] = []
    code = 0
    try:
        run(options, cleanup, document)
    except (StoreUnavailable, QueueUnavailable, CoordinatorUnavailable) as exc:
        echo(f"error: {exc}")
        code = 2
    except (SchedulerError, BenchFailure, KafkaException) as exc:
        echo(f"error: {exc}")
        code = 1
    except KeyboardInterrupt:
        echo("interrupted")
        code = 130
    finally:
        for step in reversed(cleanup):
            step()
    work_dir = document.get("work_dir")
    if code == 0 and document.get("failures"):
        code = 1
    if work_dir and not options.keep and options.work_dir is None:
        if code == 0:
            shutil.rmtree(work_dir, ignore_errors=True)
            document["work_dir"] = None
        else:
            echo(f"dispatcher logs and stats kept in {work_dir}")
    if "targets" not in document:
        return code
    text = json.dumps(document, indent=2)
    for line in table(document):
        print(line, file=sys.stderr if args.json else sys.stdout)
    if args.out:
        args.out.write_text(text + "\n", encoding="utf-8")
    if args.json:
        print(text)
    return code


if __name__ == "__main__":
    sys.exit(main())
