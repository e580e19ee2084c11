"""Compaction bench: which compaction strategy keeps `tasks_by_bucket` small and its
minute partitions quick to read, when every row carries the retention's TTL.

    .venv/bin/python bench/compaction.py --out /tmp/compaction.json
    .venv/bin/python bench/compaction.py --runs twcs:0,ucs:0 --write-s 60 --tail-s 60   # a quick look

Each run (`--runs`, strategy:gc_grace_seconds, default six of them) gets a keyspace of
its own (`bench_compaction_<hex>`) holding a copy of the table from `schema.cql` with
that compaction and gc_grace, and `memtable_flush_period_in_ms` = `--flush-s` (time is
scaled down: the node flushes every few seconds instead of every few hundred MB). For
`--write-s` one process writes as a busy scheduler does, at `--rate` tasks/s:

- submit: each task's row, `INSERT ... USING TTL`, into the partition (minute, shard) it
  is due in, most 5-65 s ahead, `--far-share` of them up to `FAR_LEAD_S` ahead (tasks
  scheduled long before); the TTL ends at the minute + 1 min + `--retention-s`, the
  rule of `scheduler/retention.py`, so whole partitions expire together;
- status: when a task falls due, `running`, then `done` with its history record, each
  `UPDATE ... USING TTL ... AND TIMESTAMP <run_at µs + rank>` as the store writes them;
- read: every `READ_EVERY_S`, `READS` partitions of the coming minute read whole (as a
  dispatcher loads a minute), each timed.

It then waits `--tail-s` with no writes, while partitions go on expiring. Every
`SAMPLE_EVERY_S` it notes the table's bytes on disk and SSTables (the node's data
directory, which it names itself: this must run on the node's machine), and the
share of written tasks whose partition has expired by then. At the end:
`system.compaction_history` (bytes compacted), the node's own read latency and
tombstones per read for the table (`system_views`).

Figures per run: tasks and writes/s reached; bytes at peak, at the end and the end's
share of the peak, beside the share of tasks not yet expired (what a strategy that
drops expired data at once would keep); when the disk first shrank after the first
expiry; Data.db bytes ever written by flushes and by compactions, and write
amplification (all written / flushed); partition read p50/p99/max. Time is scaled, so
retention 60 s stands for days: TWCS windows of 1 minute, and
`expired_sstable_check_frequency_seconds` 10 (600 by default, longer than a run).
`unsafe_aggressive_sstable_expiration` needs a JVM flag the local node is not started
with, so it is not among the runs. Keyspaces are dropped at the end (`--keep` keeps
them). Machine load (1-minute average) is recorded at each run's start and end.
"""

from __future__ import annotations

import argparse
import heapq
import json
import math
import os
import random
import secrets
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from cassandra.cluster import ResponseFuture, Session
from cassandra.query import BatchStatement, BatchType, PreparedStatement, SimpleStatement

ROOT = str(Path(__file__).resolve().parents[1])
if ROOT not in sys.path:
    sys.path.append(ROOT)

from bench.disk import compacted, table_directories, usage  # noqa: E402
from scheduler.adapters.cassandra.connection import connect  # noqa: E402
from scheduler.model import BUCKET_MS, TaskId, encode_payload, minute_bucket  # noqa: E402
from scheduler.retention import expires_ms, ttl_s  # noqa: E402
from scheduler.settings import CassandraSettings  # noqa: E402
from scheduler.visibility.history import AttemptRecord  # noqa: E402

SCHEMA = Path(ROOT) / "schema.cql"
TABLE = "tasks_by_bucket"
SHARDS = 64
FAR_LEAD_S = 125
"""A tenth (`--far-share`) of the tasks are submitted up to a retention ahead of the near ones."""
NEAR_LEAD_S = (5, 65)
READ_EVERY_S = 5.0
READS = 8
SAMPLE_EVERY_S = 5.0
MAX_IN_FLIGHT = 32
STRATEGIES: dict[str, dict[str, str]] = {
    "stcs": {"class": "SizeTieredCompactionStrategy"},
    "lcs": {"class": "LeveledCompactionStrategy"},
    "twcs": {"class": "TimeWindowCompactionStrategy", "compaction_window_unit": "MINUTES",
             "compaction_window_size": "1", "expired_sstable_check_frequency_seconds": "10"},
    "ucs": {"class": "UnifiedCompactionStrategy"},
    # TWCS that also rewrites an SSTable alone once a fifth of it may be dropped, however
    # it overlaps the others: the interval (a day by default) scaled as the retention is.
    "twcs-tomb": {"class": "TimeWindowCompactionStrategy", "compaction_window_unit": "MINUTES",
                  "compaction_window_size": "1", "expired_sstable_check_frequency_seconds": "10",
                  "unchecked_tombstone_compaction": "true", "tombstone_compaction_interval": "60"},
}
DEFAULT_RUNS = "stcs:864000,stcs:0,lcs:0,twcs:0,ucs:0"
RANK_RUNNING, RANK_DONE = 2, 3
"""Status ranks in the write timestamp, as the store's `status_write_timestamp_us`."""


@dataclass(frozen=True)
class RunSpec:
    strategy: str
    gc_grace_s: int

    @property
    def name(self) -> str:
        return f"{self.strategy} gc_grace {self.gc_grace_s}"


def table_cql(keyspace: str, spec: RunSpec, flush_s: int) -> str:
    """`schema.cql`'s CREATE TABLE tasks_by_bucket in `keyspace`, with the run's options."""
    text = "\n".join(line.split("--")[0] for line in SCHEMA.read_text().splitlines())  # comments hold ';'
    start = text.index(f"CREATE TABLE IF NOT EXISTS {TABLE}")
    body = text[start:text.index(";", start)]
    body = body.replace(f"CREATE TABLE IF NOT EXISTS {TABLE}", f"CREATE TABLE {keyspace}.{TABLE}")
    options = ", ".join(f"'{key}': '{value}'" for key, value in STRATEGIES[spec.strategy].items())
    return (f"{body} AND compaction = {{{options}}} AND gc_grace_seconds = {spec.gc_grace_s} "
            f"AND memtable_flush_period_in_ms = {flush_s * 1000}")


@dataclass
class Due:
    bucket_ms: int
    shard: int
    run_at_ms: int
    task_id: TaskId


class Writer:
    """The scheduler's writes, with TTLs, at a set rate, bounded in flight."""

    def __init__(self, session: Session, keyspace: str, retention_s: int, far_share: float) -> None:
        self.session = session
        self.keyspace = keyspace
        self.retention_s = retention_s
        self.far_share = far_share
        self.rng = random.Random(7)
        self.slots = threading.BoundedSemaphore(MAX_IN_FLIGHT)
        self.errors = 0
        self.first_error: str | None = None
        self.writes = 0
        self.tasks = 0
        self.by_bucket: dict[int, int] = defaultdict(int)
        self.due: list[tuple[int, int, Due]] = []
        self.filler = "Your fee receipt and timetable are at portal.example.in. " * 2
        q = f"{keyspace}.{TABLE}"
        self.insert = session.prepare(
            f"INSERT INTO {q} (minute_bucket, shard, run_at, task_id, tenant, type, priority, payload, attempt, "
            "max_attempts, cost) VALUES (?, ?, ?, ?, ?, 'sms', 1, ?, 1, 5, 1) USING TTL ?")
        self.running = session.prepare(
            f"UPDATE {q} USING TTL ? AND TIMESTAMP ? SET status = 'running', status_attempt = 1, last_error = '' "
            "WHERE minute_bucket = ? AND shard = ? AND run_at = ? AND task_id = ?")
        self.done = session.prepare(
            f"UPDATE {q} USING TTL ? AND TIMESTAMP ? SET status = 'done', status_attempt = 1, last_error = '', "
            "history[1] = ? WHERE minute_bucket = ? AND shard = ? AND run_at = ? AND task_id = ?")

    def payload(self) -> bytes:
        """About 100 B, as the nine o'clock bench's: a number, a roll number, fixed text."""
        text = f"Roll no. {self.rng.randrange(10**7):07d}: {self.filler}"[:70]
        return encode_payload({"to": f"+9198{self.rng.randrange(10**8):08d}", "text": text})

    def _send(self, batch: BatchStatement) -> None:
        self.slots.acquire()
        future: ResponseFuture = self.session.execute_async(batch)
        future.add_callbacks(self._ok, self._failed)

    def _ok(self, _: Any) -> None:
        self.slots.release()

    def _failed(self, exc: BaseException) -> None:
        self.errors += 1
        self.first_error = self.first_error or repr(exc)
        self.slots.release()

    def _batches(self, rows: list[tuple[tuple[int, int], PreparedStatement, tuple[Any, ...]]]) -> None:
        groups: dict[tuple[int, int], list[tuple[PreparedStatement, tuple[Any, ...]]]] = defaultdict(list)
        for key, statement, values in rows:
            groups[key].append((statement, values))
        for group in groups.values():
            for start in range(0, len(group), 100):
                batch = BatchStatement(BatchType.UNLOGGED)
                for statement, values in group[start:start + 100]:
                    batch.add(statement, values)
                self._send(batch)
                self.writes += len(group[start:start + 100])

    def submit(self, count: int, now_ms: int) -> None:
        rows: list[tuple[tuple[int, int], PreparedStatement, tuple[Any, ...]]] = []
        for _ in range(count):
            far = self.rng.random() < self.far_share
            lead_ms = self.rng.randrange(NEAR_LEAD_S[1] * 1000, FAR_LEAD_S * 1000) if far else \
                self.rng.randrange(NEAR_LEAD_S[0] * 1000, NEAR_LEAD_S[1] * 1000)
            run_at = now_ms + lead_ms
            task_id = TaskId.new(run_at)
            bucket, shard = minute_bucket(run_at), task_id.shard(SHARDS)
            rows.append(((bucket, shard), self.insert, (bucket, shard, run_at, task_id.uuid,
                                                        "board" if self.rng.random() < 0.8 else "college-7",
                                                        self.payload(), ttl_s(bucket, self.retention_s, now_ms))))
            heapq.heappush(self.due, (run_at, self.tasks, Due(bucket, shard, run_at, task_id)))
            self.by_bucket[bucket] += 1
            self.tasks += 1
        self._batches(rows)

    def statuses(self, now_ms: int) -> None:
        """`running` and `done` of every task due by now."""
        rows: list[tuple[tuple[int, int], PreparedStatement, tuple[Any, ...]]] = []
        while self.due and self.due[0][0] <= now_ms:
            d = heapq.heappop(self.due)[2]
            ttl = ttl_s(d.bucket_ms, self.retention_s, now_ms)
            key = (d.bucket_ms, d.shard, d.run_at_ms, d.task_id.uuid)
            stamp = d.run_at_ms * 1000 + 8
            record = AttemptRecord(1, d.run_at_ms + 40, d.run_at_ms + 90, d.run_at_ms + 140, "worker-1",
                                   "done").encode()
            rows.append(((d.bucket_ms, d.shard), self.running, (ttl, stamp + RANK_RUNNING, *key)))
            rows.append(((d.bucket_ms, d.shard), self.done, (ttl, stamp + RANK_DONE, record, *key)))
        self._batches(rows)

    def drain(self, timeout_s: float = 60) -> None:
        for _ in range(MAX_IN_FLIGHT):
            if not self.slots.acquire(timeout=timeout_s):
                break
        for _ in range(MAX_IN_FLIGHT):
            try:
                self.slots.release()
            except ValueError:
                break


def expired_kept(samples: list[dict[str, Any]], first_expiry_s: float) -> dict[str, float | None]:
    """How much of the expired data is still on disk: the bytes a task took just before
    the first expiry (nothing to drop yet) stand for every task; the bytes beyond what the
    live tasks take are expired data kept, as a share of what the expired tasks took.
    0: expired data leaves at once; 1: none of it left."""
    before = [s for s in samples if s["t_s"] <= first_expiry_s and s["tasks"]]
    if not before:
        return {"bytes_per_task": None, "end": None, "last_minute_max": None}
    per_task = before[-1]["bytes"] / before[-1]["tasks"]

    def share(sample: dict[str, Any]) -> float | None:
        expired = sample["tasks"] * sample["expired_task_share"]
        if not sample["tasks"] or per_task <= 0 or expired < 0.05 * sample["tasks"]:
            return None
        live: float = sample["tasks"] - expired
        kept: float = max(0.0, sample["bytes"] - live * per_task) / (expired * per_task)
        return round(kept, 2)

    last = [value for s in samples if s["t_s"] >= samples[-1]["t_s"] - 60 and (value := share(s)) is not None]
    return {"bytes_per_task": round(per_task, 1), "end": share(samples[-1]),
            "last_minute_max": max(last) if last else None}


class FileWatcher:
    """Every `Data.db` file the table ever had, at the largest size seen, looked at every
    second on a thread: flushes and compactions both write one, and a file compacted away
    within seconds would be missed by the run's 5-s samples."""

    def __init__(self, directories: list[Path]) -> None:
        self.directories = directories
        self.sizes: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="file-watcher", daemon=True)
        self._thread.start()

    def _watch(self) -> None:
        while not self._stop.wait(1.0):
            self.look()

    def look(self) -> None:
        for directory in self.directories:
            for entry in directory.glob("*-Data.db"):
                try:
                    self.sizes[entry.name] = max(self.sizes.get(entry.name, 0), entry.stat().st_size)
                except FileNotFoundError:
                    pass

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(10)
        self.look()


def percentile(values: Sequence[float], share: float) -> float | None:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, math.ceil(share * len(ordered)) - 1)], 2)


def read_partitions(session: Session, keyspace: str, now_ms: int, rng: random.Random) -> list[tuple[float, int]]:
    """`READS` partitions of the coming minute, each read whole: (ms, rows) each."""
    bucket = minute_bucket(now_ms) + BUCKET_MS
    timings = []
    for shard in rng.sample(range(SHARDS), READS):
        statement = SimpleStatement(
            f"SELECT run_at, task_id, tenant, type, priority, payload, attempt, max_attempts, idempotency_key, "
            f"status, status_attempt, last_error, cost FROM {keyspace}.{TABLE} "
            "WHERE minute_bucket = %s AND shard = %s", fetch_size=5000)
        started = time.perf_counter()
        rows = sum(1 for _ in session.execute(statement, (bucket, shard)))
        timings.append(((time.perf_counter() - started) * 1000, rows))
    return timings


def one_run(session: Session, spec: RunSpec, args: argparse.Namespace) -> dict[str, Any]:
    keyspace = f"bench_compaction_{spec.strategy.replace('-', '_')}_{secrets.token_hex(3)}"
    session.execute(f"CREATE KEYSPACE {keyspace} WITH replication = "
                    "{'class': 'SimpleStrategy', 'replication_factor': 1}")
    try:
        session.execute(table_cql(keyspace, spec, args.flush_s), timeout=60)
        directories = table_directories(session, keyspace, TABLE)
        if not directories:
            raise SystemExit("the table's directory is not on this machine: run beside the node")
        return measure(session, keyspace, directories, spec, args)
    finally:
        if not args.keep:
            session.execute(f"DROP KEYSPACE IF EXISTS {keyspace}", timeout=120)


def measure(session: Session, keyspace: str, directories: list[Path], spec: RunSpec,
            args: argparse.Namespace) -> dict[str, Any]:
    writer = Writer(session, keyspace, args.retention_s, args.far_share)
    since = datetime.now(timezone.utc)
    load_start = os.getloadavg()[0]
    start_ms = time.time_ns() // 1_000_000
    write_end_ms = start_ms + args.write_s * 1000
    end_ms = write_end_ms + args.tail_s * 1000
    rng = random.Random(3)
    reads: list[tuple[float, int]] = []
    samples: list[dict[str, Any]] = []
    watcher = FileWatcher(directories)
    data_sizes = watcher.sizes
    next_read = next_sample = 0.0
    tick = 0
    print(f"{spec.name}: keyspace {keyspace}, writing {args.rate:,} tasks/s for {args.write_s} s, then "
          f"{args.tail_s} s idle ...", file=sys.stderr, flush=True)
    while (now_ms := time.time_ns() // 1_000_000) < end_ms:
        if now_ms < write_end_ms:  # on schedule, whatever the reads took
            writer.submit(args.rate * (now_ms - start_ms) // 1000 - writer.tasks, now_ms)
        writer.statuses(now_ms)
        if time.monotonic() >= next_read and now_ms < write_end_ms:
            next_read = time.monotonic() + READ_EVERY_S
            reads += read_partitions(session, keyspace, now_ms, rng)
        if time.monotonic() >= next_sample:
            next_sample = time.monotonic() + SAMPLE_EVERY_S
            disk = usage(directories)
            expired = sum(n for bucket, n in writer.by_bucket.items() if expires_ms(bucket, args.retention_s) <= now_ms)
            samples.append({"t_s": round((now_ms - start_ms) / 1000), "tasks": writer.tasks, "bytes": disk.bytes,
                            "data_bytes": disk.data_bytes, "sstables": disk.sstables,
                            "expired_task_share": round(expired / writer.tasks, 3) if writer.tasks else 0.0})
            if tick % 6 == 0:
                print(f"  t={samples[-1]['t_s']:>4} s  {disk.bytes / 2**20:7.1f} MiB  {disk.sstables:3} SSTables  "
                      f"expired {samples[-1]['expired_task_share'] * 100:5.1f}%  tasks {writer.tasks:,}",
                      file=sys.stderr, flush=True)
            tick += 1
        time.sleep(max(0.0, 0.1 - (time.time_ns() // 1_000_000 - now_ms) / 1000))
    writer.drain()
    watcher.stop()
    history = compacted(session, keyspace, TABLE, since)
    return figures(session, keyspace, spec, args, writer, samples, reads, data_sizes, history.as_dict(),
                   start_ms, load_start)


def figures(session: Session, keyspace: str, spec: RunSpec, args: argparse.Namespace, writer: Writer,
            samples: list[dict[str, Any]], reads: list[tuple[float, int]], data_sizes: dict[str, int],
            history: dict[str, int], start_ms: int, load_start: float) -> dict[str, Any]:
    peak = max(samples, key=lambda s: s["bytes"])
    end = samples[-1]
    first_expiry_s = min((expires_ms(b, args.retention_s) - start_ms) / 1000 for b in writer.by_bucket)
    running_max, shrank_s = 0, None
    for sample in samples:
        running_max = max(running_max, sample["bytes"])
        if sample["t_s"] >= first_expiry_s and sample["bytes"] < 0.9 * running_max:
            shrank_s = round(sample["t_s"] - first_expiry_s)
            break
    kept = expired_kept(samples, first_expiry_s)
    written = sum(data_sizes.values())
    # A file compacted away within a second of being written is missed; when more was
    # missed than flushed, the flushed bytes are unknown and so is the amplification.
    flushed = written - history["bytes_out"] if written > history["bytes_out"] else None
    latency = session.execute("SELECT * FROM system_views.local_read_latency WHERE keyspace_name = %s "
                              "AND table_name = %s", (keyspace, TABLE)).one()
    tombstones = session.execute("SELECT * FROM system_views.tombstones_per_read WHERE keyspace_name = %s "
                                 "AND table_name = %s", (keyspace, TABLE)).one()
    ms = [m for m, _ in reads]
    return {
        "run": spec.name, "strategy": spec.strategy, "compaction": STRATEGIES[spec.strategy],
        "gc_grace_seconds": spec.gc_grace_s, "keyspace": keyspace,
        "tasks": writer.tasks, "writes": writer.writes, "write_errors": writer.errors,
        "first_write_error": writer.first_error,
        "writes_per_s": round(writer.writes / args.write_s),
        "bytes_peak": peak["bytes"], "bytes_peak_at_s": peak["t_s"], "bytes_end": end["bytes"],
        "sstables_end": end["sstables"], "end_share_of_peak": round(end["bytes"] / max(peak["bytes"], 1), 3),
        "live_task_share_end": round(1 - end["expired_task_share"], 3),
        "first_expiry_s": round(first_expiry_s), "shrank_10pct_after_first_expiry_s": shrank_s,
        "bytes_per_task_at_first_expiry": kept["bytes_per_task"], "expired_kept_share_end": kept["end"],
        "expired_kept_share_max_last_minute": kept["last_minute_max"],
        "data_bytes_written": written, "data_bytes_flushed": flushed, "compacted": history,
        "write_amplification": round(written / flushed, 2) if flushed else None,
        "bytes_per_task_peak": round(peak["bytes"] / max(writer.tasks, 1), 1),
        "read_ms": {"samples": len(ms), "p50": percentile(ms, 0.5), "p99": percentile(ms, 0.99),
                    "max": round(max(ms), 2) if ms else None,
                    "rows_mean": round(sum(r for _, r in reads) / len(reads)) if reads else None},
        "node_read_latency_ms": None if latency is None else {"p50": latency.p50th_ms, "p99": latency.p99th_ms,
                                                              "max": latency.max_ms},
        "node_tombstones_per_read": None if tombstones is None else {"p50": tombstones.p50th, "p99": tombstones.p99th,
                                                                     "max": tombstones.max},
        "loadavg_start_end": [round(load_start, 2), round(os.getloadavg()[0], 2)],
        "timeline": samples,
    }


def table(results: list[dict[str, Any]]) -> list[str]:
    lines = [f"{'run':<22}{'tasks':>8}{'wr/s':>7}{'peak MiB':>9}{'end MiB':>8}{'end/peak':>9}{'live':>6}"
             f"{'kept':>6}{'WA':>6}{'compacted MiB':>14}{'read p50':>9}{'p99':>7}{'load':>11}"]
    for r in results:
        lines.append(
            f"{r['run']:<22}{r['tasks']:>8,}{r['writes_per_s']:>7,}{r['bytes_peak'] / 2**20:>9.1f}"
            f"{r['bytes_end'] / 2**20:>8.1f}{r['end_share_of_peak']:>9.2f}{r['live_task_share_end']:>6.2f}"
            f"{share(r['expired_kept_share_end']):>6}"
            f"{share(r['write_amplification']):>6}{r['compacted']['bytes_in'] / 2**20:>14.1f}"
            f"{r['read_ms']['p50'] or 0:>9.1f}{r['read_ms']['p99'] or 0:>7.1f}"
            f"{'/'.join(str(x) for x in r['loadavg_start_end']):>11}")
    return lines


def share(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}"


def parse(argv: Sequence[str]) -> tuple[argparse.Namespace, list[RunSpec]]:
    parser = argparse.ArgumentParser(description="Compaction strategies for tasks_by_bucket with TTL'd rows, "
                                                 "time scaled: bytes on disk over time, write amplification, "
                                                 "partition read latency.")
    parser.add_argument("--runs", default=DEFAULT_RUNS,
                        help=f"strategy:gc_grace_seconds, comma-separated; strategies {', '.join(STRATEGIES)} "
                             f"(default {DEFAULT_RUNS})")
    parser.add_argument("--rate", type=int, default=800, help="tasks submitted a second (default 800)")
    parser.add_argument("--write-s", type=int, default=270, help="seconds of writing (default 270)")
    parser.add_argument("--tail-s", type=int, default=30, help="seconds idle after (default 30)")
    parser.add_argument("--retention-s", type=int, default=60, help="the scaled retention (default 60)")
    parser.add_argument("--far-share", type=float, default=0.1,
                        help=f"share of tasks submitted up to {FAR_LEAD_S} s ahead (default 0.1)")
    parser.add_argument("--flush-s", type=int, default=10, help="memtable_flush_period (default 10 s)")
    parser.add_argument("--out", type=Path, help="write the JSON document here")
    parser.add_argument("--keep", action="store_true", help="keep the keyspaces")
    args = parser.parse_args(argv)
    specs = []
    for part in args.runs.split(","):
        strategy, _, gc = part.strip().partition(":")
        if strategy not in STRATEGIES or not gc.isdigit():
            parser.error(f"--runs: {part!r} is not strategy:gc_grace_seconds")
        specs.append(RunSpec(strategy, int(gc)))
    if args.rate < 10 or args.write_s < 10 or args.tail_s < 0 or args.retention_s < 60:
        parser.error("--rate >= 10, --write-s >= 10, --tail-s >= 0, --retention-s >= 60")
    return args, specs


def main(argv: Sequence[str] | None = None) -> int:
    args, specs = parse(sys.argv[1:] if argv is None else argv)
    connection = connect(CassandraSettings.from_env(keyspace="system"))
    document: dict[str, Any] = {
        "command": [sys.executable, *sys.argv],
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "machine": {"cpu_count": os.cpu_count(), "loadavg": os.getloadavg()},
        "settings": {k: (str(v) if isinstance(v, Path) else v) for k, v in vars(args).items()},
        "runs": [],
    }
    try:
        for spec in specs:
            document["runs"].append(one_run(connection.session, spec, args))
            print("\n".join(table(document["runs"][-1:])[1:]), file=sys.stderr, flush=True)
    finally:
        connection.close()
    text = json.dumps(document, indent=2)
    if args.out:
        args.out.write_text(text + "\n")
    print("\n".join(table(document["runs"])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
