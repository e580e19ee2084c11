"""The `scheduler worker` processes of a bench run and what they leave behind.

`WorkerFleet` starts N workers (`scheduler worker --app bench.worker_app:app`, each its
own log, stats file and record file), follows their stats files (`poll`: every new
version of a file is kept with its modification time, which is when the worker wrote
it, to the millisecond), and stops them with SIGTERM, so each drains, commits and
writes its handler starts. `read_records` reads those starts back (`Handled`), and
`tally` sets them against the tasks that were submitted: handled, lost, repeated, and
the first start of each task.

The stats file is rewritten once a second, so a moment read from it ("every status was
written by then") is known to within that second; `settled_between` gives both ends.
"""

from __future__ import annotations

import json
import os
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from bench.worker_app import RECORD, RECORDS_ENV

from .common import BenchFailure
from .deployment import BenchProcess, stop_all
from .proc import cpu_seconds, rss_bytes
from .settings import STOP_TIMEOUT_S

WORKER_APP = "bench.worker_app:app"

COUNTERS = ("received", "started", "done", "retried", "dead", "skipped", "running", "buffered", "reports_settled",
            "reports_submitted", "reports_written", "check_failures", "stale_fence", "commit_failures", "revoked", "unknown_type",
            "undecodable", "timed_out")


def counters(stats: Mapping[str, Any]) -> dict[str, int]:
    """The figures of one worker snapshot (`Worker.snapshot()`) the benches use.

    `reports_submitted`: status reports the worker queued for the settler (an outcome at
    each end, a `running` for an attempt still running after a second); `reports_settled`:
    those the settler made durable, or dropped as superseded by a later one of the same
    batch (coalesced); `reports_written`: those made durable."""
    settler = stats.get("settler", {})
    got = {name: int(stats.get(name, 0)) for name in ("received", "started", "done", "retried", "dead",
                                                       "check_failures", "stale_fence", "commit_failures",
                                                       "revoked", "unknown_type", "undecodable", "timed_out")}
    got["skipped"] = sum(int(stats.get(name, 0)) for name in ("skipped_cancelled", "skipped_finished",
                                                               "skipped_superseded"))
    got["running"] = int(stats.get("running", 0))
    got["buffered"] = sum(int(n) for n in stats.get("buffered", {}).values())
    got["reports_settled"] = int(settler.get("reports_written", 0)) + int(settler.get("reports_coalesced", 0))
    got["reports_written"] = int(settler.get("reports_written", 0))
    got["reports_submitted"] = int(settler["reports_submitted"]) if "reports_submitted" in settler else \
        got["started"] + got["done"] + got["retried"] + got["dead"] - got["undecodable"]  # a worker without the count
    return got


def all_settled(totals: Mapping[str, int], tasks: int) -> bool:
    """Whether the workers have finished `tasks` tasks (done, dead or skipped as already
    finished) and made every outcome durable, with nothing left running or buffered."""
    return (totals["received"] >= tasks and totals["done"] + totals["dead"] + totals["skipped"] >= tasks
            and totals["running"] == 0 and totals["buffered"] == 0
            and totals["reports_settled"] >= totals["reports_submitted"])


@dataclass
class WorkerProcess(BenchProcess):
    timeline: list[dict[str, Any]] = field(default_factory=list)
    """Every version of the stats file seen: `at_ms` (when the worker wrote it), the
    `counters`, and the process's CPU seconds and RSS when the bench read it."""

    def poll(self) -> bool:
        """Read the stats file; keep it if it is a version not seen yet. True if it was."""
        try:
            with self.stats_path.open("rb") as file:
                at_ms = os.fstat(file.fileno()).st_mtime_ns // 1_000_000
                if self.timeline and at_ms <= self.timeline[-1]["at_ms"]:
                    return False
                document = json.loads(file.read())
        except (OSError, ValueError):
            return False
        self.timeline.append({"at_ms": at_ms, **counters(document), "cpu_s": cpu_seconds(self.process.pid),
                              "rss_bytes": rss_bytes(self.process.pid)})
        return True

    def exit_race(self) -> bool:
        """Whether the worker exited 1 only because its last two stats writes collided:
        `scheduler worker` writes the stats file from its stats thread and again from the
        main thread as it stops, both through the same `<file>.tmp`, so one `os.replace`
        can find the temporary gone (FileNotFoundError). It had drained and committed by
        then; the bench counts it as a warning, not a failed worker."""
        tail = self.log_tail(600)
        return (self.process.returncode == 1 and "FileNotFoundError" in tail and ".json.tmp" in tail
                and "write_json" in tail)

    def latest(self) -> dict[str, Any]:
        return self.timeline[-1] if self.timeline else {"at_ms": 0, **dict.fromkeys(COUNTERS, 0)}


class WorkerFleet:
    """The worker processes of one run; `backend` is the arguments that pick the backend
    (`--backend cassandra`, or `--backend embedded --db PATH`), `env` the environment
    that names the deployment."""

    def __init__(self, env: Mapping[str, str], directory: Path, backend: Sequence[str]) -> None:
        self.directory = directory
        self.records_dir = directory / "handled"
        self.records_dir.mkdir(parents=True, exist_ok=True)
        self.env = {**env, RECORDS_ENV: str(self.records_dir.resolve())}
        self.backend = list(backend)
        self.members: list[WorkerProcess] = []
        self.codes: list[int | None] = []

    def start(self, count: int, concurrency: int, app: str = WORKER_APP, extra: Sequence[str] = ()) -> None:
        for n in range(1, count + 1):
            name = f"worker-{n}"
            self.members.append(WorkerProcess.start(
                name, ["worker", "--app", app, "--concurrency", str(concurrency), "--member", name,
                       "--log-level", "info", *self.backend, *extra], self.directory, self.env))

    def check_alive(self) -> None:
        for member in self.members:
            if not member.alive():
                raise member.died()

    def poll(self) -> bool:
        """Read every stats file; True if any had a new version."""
        return any([member.poll() for member in self.members])

    def totals(self) -> dict[str, int]:
        latest = [member.latest() for member in self.members]
        return {name: sum(int(point.get(name, 0)) for point in latest) for name in COUNTERS}

    def settled_between(self, tasks: int) -> tuple[int, int] | None:
        """(last moment the stats files showed work left, first moment they showed all
        `tasks` settled): the last status was made durable between the two. None if the
        files never showed it."""
        events = sorted((point["at_ms"], n, point) for n, member in enumerate(self.members)
                        for point in member.timeline)
        latest: dict[int, dict[str, Any]] = {}
        before = 0
        for at_ms, n, point in events:
            latest[n] = point
            totals = {name: sum(int(p.get(name, 0)) for p in latest.values()) for name in COUNTERS}
            if len(latest) == len(self.members) and all_settled(totals, tasks):
                return before, at_ms
            before = at_ms
        return None

    def stop(self) -> list[int | None]:
        """SIGTERM every worker (each drains, commits and writes its records), wait, kill
        what did not stop; the exit codes (None: killed)."""
        if not self.codes:
            self.codes = stop_all(self.members, STOP_TIMEOUT_S)
        return self.codes

    def records(self) -> list[Handled]:
        return read_records(self.records_dir)

    def describe(self) -> list[dict[str, Any]]:
        """Each worker for the JSON document: exit code, log, warnings, last stats."""
        codes = self.codes or [None] * len(self.members)
        return [{"name": m.name, "pid": m.process.pid, "exit_code": code, "exit_race": m.exit_race(),
                 "log": str(m.log_path), "log_warnings": m.log_warnings(), "final": m.stats()}
                for m, code in zip(self.members, codes, strict=True)]

    def exit_problems(self, accepted: tuple[int, ...] = (0,)) -> tuple[list[str], list[str]]:
        """(failures, warnings) from the exit codes: a code outside `accepted` is a
        failure, except the stats-file race at exit (`WorkerProcess.exit_race`)."""
        failures: list[str] = []
        warnings: list[str] = []
        for member, code in zip(self.members, self.codes, strict=True):
            if code in accepted:
                continue
            if member.exit_race():
                warnings.append(f"{member.name} exited 1 after draining: its final stats writes collided "
                                "(scheduler/cli/worker.py writes the stats file from two threads at exit)")
            else:
                failures.append(f"{member.name} exited with status {code}")
        return failures, warnings


@dataclass(frozen=True, slots=True)
class Handled:
    """One handler start, as `bench.worker_app` recorded it."""

    task_id: bytes
    attempt: int
    start_ms: int
    pid: int


def read_records(directory: Path) -> list[Handled]:
    """Every handler start recorded in `directory` (`handled-<pid>.bin`, one per worker)."""
    found: list[Handled] = []
    for path in sorted(directory.glob("handled-*.bin")):
        pid = int(path.stem.removeprefix("handled-"))
        data = path.read_bytes()
        if len(data) % RECORD.size:
            raise BenchFailure(f"{path} is truncated ({len(data)} bytes, not a multiple of {RECORD.size})")
        found.extend(Handled(task_id, attempt, start_ms, pid) for task_id, attempt, start_ms in RECORD.iter_unpack(data))
    return found


@dataclass
class Tally:
    """Handler starts set against the submitted tasks."""

    expected: int
    first_start: dict[bytes, int]
    """Task id -> its earliest handler start (ms), for every submitted task handled."""
    starts: int
    repeated_tasks: int
    extra_starts: int
    unexpected: int
    by_process: dict[int, int]

    @property
    def handled(self) -> int:
        return len(self.first_start)

    @property
    def lost(self) -> int:
        return self.expected - self.handled

    def figures(self) -> dict[str, Any]:
        return {"expected": self.expected, "handled": self.handled, "lost": self.lost, "starts": self.starts,
                "duplicated_tasks": self.repeated_tasks, "extra_starts": self.extra_starts,
                "unexpected": self.unexpected, "by_process": {str(pid): n for pid, n in self.by_process.items()}}


def tally(records: Iterable[Handled], expected: Iterable[bytes]) -> Tally:
    wanted = set(expected)
    first: dict[bytes, int] = {}
    copies: Counter[bytes] = Counter()
    by_process: Counter[int] = Counter()
    starts = unexpected = 0
    for record in records:
        starts += 1
        by_process[record.pid] += 1
        if record.task_id not in wanted:
            unexpected += 1
            continue
        copies[record.task_id] += 1
        held = first.get(record.task_id)
        if held is None or record.start_ms < held:
            first[record.task_id] = record.start_ms
    repeated = [n for n in copies.values() if n > 1]
    return Tally(len(wanted), first, starts, len(repeated), sum(repeated) - len(repeated), unexpected,
                 dict(sorted(by_process.items())))
