"""The application that keeps submitting while the faults happen: a process of its
own (`python -m bench.faults.producer`), using the SDK as an application does
(`scheduler.connect()`, one `submit` a task, found through the SCHEDULER_* variables).

Each task has an idempotency key, so when a submit fails (`StoreError`: the store did
not acknowledge; `HandoffFailed`: stored, but not handed to the dispatcher) the
producer submits it again with the same key, as the SDK's docs say to, after a pause,
until it is acknowledged or `--give-up-s` has passed. Every failure is recorded, never
swallowed; an acknowledged task is one `submit` returned an id for.

Files in `--out` (read back by `read_results`):

- `acked.bin`: one `ACK` record an acknowledged task: id, run_at, when the submit that
  succeeded began, when it returned (ms);
- `failures.jsonl`: one line a failed submit: when, the task's key, the error's type
  and text;
- `summary.json`: written at the end: counts, and the keys given up on.

It submits `--rate` tasks a second, each due `--delay-min-s` to `--delay-max-s` after
it is submitted, until `--until-ms` or SIGTERM."""

from __future__ import annotations

import argparse
import json
import random
import signal
import struct
import time
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

ACK = struct.Struct(">16sqqq")
"""One acknowledged task: id bytes, run_at ms, submit began ms, submit returned ms."""
TASK_TYPE = "sms"
TENANT = "results-app"
RETRY_PAUSE_S = 0.5


@dataclass
class Results:
    acked: dict[bytes, int]
    """Task id -> run_at ms, of every acknowledged task."""
    ack_latency_ms: list[int]
    acked_at_ms: list[int]
    acked_when: dict[bytes, int]
    """Task id -> when its submit returned (ms)."""
    failures: list[dict[str, Any]]
    summary: dict[str, Any] = field(default_factory=dict)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def read_results(directory: Path) -> Results:
    data = (directory / "acked.bin").read_bytes() if (directory / "acked.bin").exists() else b""
    usable = len(data) - len(data) % ACK.size  # a record cut by a kill is not an acknowledgement
    acked: dict[bytes, int] = {}
    latency: list[int] = []
    moments: list[int] = []
    when: dict[bytes, int] = {}
    for task_id, run_at_ms, began_ms, returned_ms in ACK.iter_unpack(data[:usable]):
        acked[task_id] = run_at_ms
        when[task_id] = returned_ms
        latency.append(returned_ms - began_ms)
        moments.append(returned_ms)
    failures_path = directory / "failures.jsonl"
    failures = ([json.loads(line) for line in failures_path.read_text().splitlines() if line.strip()]
                if failures_path.exists() else [])
    summary_path = directory / "summary.json"
    summary = json.loads(summary_path.read_text()) if summary_path.exists() else {}
    return Results(acked, latency, moments, when, failures, summary)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.faults.producer")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--rate", type=float, default=40.0)
    parser.add_argument("--until-ms", type=int, required=True)
    parser.add_argument("--delay-min-s", type=float, default=2.0)
    parser.add_argument("--delay-max-s", type=float, default=30.0)
    parser.add_argument("--give-up-s", type=float, default=120.0)
    parser.add_argument("--seed", type=int, default=11)
    args = parser.parse_args(argv)

    import scheduler  # after the arguments: `--help` needs no driver

    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, stop)
    args.out.mkdir(parents=True, exist_ok=True)
    rng = random.Random(args.seed)
    acked = failed = 0
    given_up: list[str] = []
    with scheduler.connect(tenant=TENANT) as client, (args.out / "acked.bin").open("ab") as acks, \
            (args.out / "failures.jsonl").open("a") as failures:
        number = 0
        next_at = time.monotonic()
        while not stopping and now_ms() < args.until_ms:
            number += 1
            key = f"chaos-{args.seed}-{number}"
            # A keyed task's time is part of its name: fixed once, so every retry names the same task.
            run_at = datetime.now(timezone.utc) + timedelta(seconds=rng.uniform(args.delay_min_s, args.delay_max_s))
            payload = {"to": f"+9198{rng.randrange(10**8):08d}", "text": f"reminder {number}"}
            first_try = time.monotonic()
            while True:
                began = now_ms()
                try:
                    task_id = client.submit(TASK_TYPE, payload, run_at=run_at, idempotency_key=key)
                except scheduler.SchedulerError as error:
                    failed += 1
                    failures.write(json.dumps({"at_ms": began, "returned_ms": now_ms(), "key": key,
                                               "error": type(error).__name__, "text": str(error)[:300]}) + "\n")
                    failures.flush()
                    if stopping or time.monotonic() - first_try > args.give_up_s:
                        given_up.append(key)
                        break
                    time.sleep(RETRY_PAUSE_S)
                    continue
                acks.write(ACK.pack(task_id.bytes, task_id.run_at_ms, began, now_ms()))
                acks.flush()
                acked += 1
                break
            next_at += 1 / args.rate
            time.sleep(max(0.0, next_at - time.monotonic()))
    (args.out / "summary.json").write_text(json.dumps(
        {"acknowledged": acked, "failed_submits": failed, "given_up": given_up}) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
