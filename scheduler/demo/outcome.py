"""What the demo shows at the end: every task and every SMS accounted for.

A task is lost if it did not end as it should: the board's batches and the college's
reminders `done`, the reminder to the unreachable number `dead` and in the dead-letter
list. An SMS is lost if its key never reached the provider; it is sent twice if the
provider's deduplication had to absorb a repeat (counted: that is the point of it).
"""

from __future__ import annotations

import math
from collections import defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from scheduler.model import TaskId
from scheduler.ports import StoredTask, TaskStatus
from scheduler.visibility.counts import STATES
from scheduler.visibility.status import Status

from .gateway import Start


@dataclass(frozen=True)
class Planned:
    """One submitted task and what should come of it."""

    task_id: TaskId
    tenant: str
    type: str
    run_at_ms: int
    sms_keys: tuple[str, ...]
    """The provider keys it should send (none for the doomed one)."""
    doomed: bool = False


def percentiles(values: Sequence[int]) -> dict[str, int | None]:
    """Nearest-rank p50, p90, p99 and max of `values` (None for none)."""
    ordered = sorted(values)

    def rank(share: float) -> int | None:
        return ordered[max(0, math.ceil(share * len(ordered)) - 1)] if ordered else None

    return {"p50": rank(0.5), "p90": rank(0.9), "p99": rank(0.99), "max": ordered[-1] if ordered else None}


def status_counts(planned: Iterable[Planned], rows: Mapping[TaskId, StoredTask], now_ms: int) -> dict[str, dict[str, int]]:
    """Per tenant: waiting (not yet due), queued (due, no worker has reported), running,
    failed (an attempt failed, a retry is due), done, dead, cancelled."""
    counts: dict[str, dict[str, int]] = defaultdict(lambda: dict.fromkeys(COLUMNS, 0))
    for task in planned:
        row = rows.get(task.task_id)
        status = row.status if row is not None else TaskStatus.SCHEDULED
        if status is TaskStatus.SCHEDULED:
            column = "waiting" if task.run_at_ms > now_ms else "queued"
        else:
            column = status.value
        counts[task.tenant][column] += 1
    return dict(counts)


COLUMNS = ("waiting", "queued", "running", "failed", "done", "dead", "cancelled")


def summarise(planned: Sequence[Planned], rows: Mapping[TaskId, StoredTask], sent_keys: set[str], absorbed: int,
              starts: Sequence[Start], dead_letters: Sequence[Any], events: Sequence[dict[str, Any]],
              seconds: float, backend: str, not_created: Sequence[str] = ()) -> dict[str, Any]:
    """The demo's closing document: tasks, SMS, duplicates, lateness, events, and `ok`.
    `not_created`: what is wrong with a workflow itself (steps never created, or it did not
    succeed), each counted lost."""
    dead_lettered = {str(letter.task_id) for letter in dead_letters if letter.task_id is not None}
    first_start: dict[str, int] = {}
    runs: dict[str, int] = defaultdict(int)
    for start in starts:
        runs[start.task] += 1
        first_start.setdefault(start.task, start.started_ms)
    tenants: dict[str, dict[str, Any]] = {}
    lost: list[str] = list(not_created)
    expected_keys: set[str] = set()
    for task in planned:
        key = str(task.task_id)
        row = rows.get(task.task_id)
        status = row.status if row is not None else None
        wanted = TaskStatus.DEAD if task.doomed else TaskStatus.DONE
        ok = status is wanted and (not task.doomed or key in dead_lettered)
        if not ok:
            lost.append(f"{task.tenant} {task.type} {key}: {status.value if status else 'no row'}"
                        + (", not in the dead-letter list" if task.doomed and key not in dead_lettered else ""))
        expected_keys.update(task.sms_keys)
        figures = tenants.setdefault(task.tenant, {"tasks": 0, "done": 0, "dead": 0, "lateness": []})
        figures["tasks"] += 1
        figures["done"] += status is TaskStatus.DONE
        figures["dead"] += status is TaskStatus.DEAD
        if key in first_start:
            figures["lateness"].append(first_start[key] - task.run_at_ms)
    for figures in tenants.values():
        figures["handler_start_lateness_ms"] = percentiles(figures.pop("lateness"))
    missing = expected_keys - sent_keys
    unexpected = sent_keys - expected_keys
    reruns = sum(count - 1 for count in runs.values() if count > 1)
    return {
        "backend": backend,
        "seconds": round(seconds, 1),
        "tasks": {"submitted": len(planned), "as_expected": len(planned) - len(lost), "lost": len(lost),
                  "not_as_expected": lost[:20]},
        "tenants": tenants,
        "sms": {"expected": len(expected_keys), "delivered": len(expected_keys & sent_keys),
                "missing": len(missing), "unexpected": len(unexpected), "repeats_absorbed": absorbed},
        "handler_runs": {"total": len(starts), "beyond_first": reruns},
        "dead_letters": [{"task": str(letter.task_id), "tenant": letter.tenant, "type": letter.type,
                          "attempt": letter.attempt, "reason": letter.reason, "error": letter.error}
                         for letter in dead_letters],
        "lateness_ms": percentiles([first_start[str(t.task_id)] - t.run_at_ms for t in planned
                                    if str(t.task_id) in first_start]),
        "events": list(events),
        "ok": not lost and not missing and not unexpected,
    }


def against_status(tenants: Mapping[str, Mapping[str, Any]], status: Status,
                   killed_worker_tasks: int, killed_dispatcher_tasks: int = 0) -> dict[str, Any]:
    """What `scheduler status` shows per tenant (from the counts the processes wrote, not
    from the tasks) beside the reconciled tasks, and a verdict:

    - `same`: every tenant's done and dead are the tasks', and no task is shown in
      another state;
    - `within_kill`: dead the same, the done tasks the counts miss (shown another state
      or not at all) no more than `killed_worker_tasks`, the tasks the killed worker
      started, and the tasks shown in another state no more than those plus
      `killed_dispatcher_tasks`, the tasks the killed dispatcher may have fired in its
      last seconds (done, but their `fired` count lost: shown waiting as well). A process
      killed with kill -9 never writes its last ~2 s of counts;
    - `differs`: anything else."""
    shown: dict[str, dict[str, int]] = {tenant: dict.fromkeys(STATES, 0) for tenant in tenants}
    for (tenant, _), levels in status.levels.items():
        row = shown.setdefault(tenant, dict.fromkeys(STATES, 0))
        for state, n in levels.as_dict().items():
            row[state] += n
    differences = []
    missing_done = 0
    extra_others = 0
    explained = True
    for tenant, row in shown.items():
        figures = tenants.get(tenant, {"done": 0, "dead": 0})
        for state in STATES:
            expected = figures[state] if state in ("done", "dead") else 0
            if row[state] != expected:
                differences.append(f"{tenant} {state} {row[state]} (tasks: {expected})")
        short = figures["done"] - row["done"]
        others = sum(row[state] for state in STATES if state not in ("done", "dead"))
        missing_done += max(short, 0)
        extra_others += max(others - max(short, 0), 0)
        explained &= row["dead"] == figures["dead"] and short >= 0
    verdict = "same" if not differences else (
        "within_kill" if explained and missing_done <= killed_worker_tasks
        and extra_others <= killed_dispatcher_tasks else "differs")
    return {"tenants": shown, "verdict": verdict, "differences": differences,
            "killed_worker_tasks": killed_worker_tasks, "killed_dispatcher_tasks": killed_dispatcher_tasks}


def render(summary: Mapping[str, Any]) -> list[str]:
    """The closing summary as lines of text."""
    tasks, sms = summary["tasks"], summary["sms"]
    lines = [f"Results day on the {summary['backend']}, {summary['seconds']:.0f} s:"]
    for tenant, figures in summary["tenants"].items():
        late = figures["handler_start_lateness_ms"]
        lines.append(f"  {tenant:<14} {figures['tasks']:>5} tasks: {figures['done']} done, {figures['dead']} dead; "
                     f"handler start after due time p50 {_ms(late['p50'])}, p99 {_ms(late['p99'])}, "
                     f"max {_ms(late['max'])}")
    lines.append(f"  SMS: {sms['delivered']:,} of {sms['expected']:,} delivered, {sms['missing']:,} missing, "
                 f"{sms['unexpected']:,} unexpected; {sms['repeats_absorbed']:,} repeats absorbed by the "
                 f"provider's idempotency keys ({summary['handler_runs']['beyond_first']} handler re-runs)")
    fairness = summary.get("fairness")
    if fairness and fairness["sms_rate_limit"] is not None and fairness["board_sms_per_s"] is not None:
        college = summary["tenants"].get("city-college", {}).get("handler_start_lateness_ms", {})
        lines.append(f"  fair: the board's SMS went out at {fairness['board_sms_per_s']:,}/s (the provider's limit: "
                     f"{fairness['sms_rate_limit']:,.0f}/s); {fairness['board_sms_after_reminders_due']:,} of them were "
                     f"still to go when the reminders fell due, and the reminders started p99 "
                     f"{_ms(college.get('p99'))} after their time")
    for letter in summary["dead_letters"]:
        error = (letter["error"] or "").strip().splitlines()
        lines.append(f"  dead letter: {letter['tenant']} {letter['type']} after attempt {letter['attempt']} "
                     f"({letter['reason']}): {error[-1] if error else 'no error recorded'}")
    status = summary.get("status")
    if status is not None:
        shown = "; ".join(f"{tenant} " + ", ".join(f"{n:,} {state}" for state, n in row.items() if n)
                          for tenant, row in status["tenants"].items())
        differences = "; ".join(status["differences"])
        lines.append(f"  scheduler status shows {shown}: " + {
            "same": "the same as the tasks",
            "within_kill": f"{differences}: tasks whose counts the killed worker or dispatcher had not yet "
                           "written (a process killed with kill -9 takes its last ~2 s of counts with it)",
            "differs": f"NOT the tasks: {differences}",
        }[status["verdict"]])
    for event in summary["events"]:
        lines.append(f"  t+{event['at_s']:5.1f}s {event['what']}")
    verdict = ("all delivered, none lost" if summary["ok"]
               else f"NOT ALL DELIVERED: {tasks['lost']} tasks not as expected, {sms['missing']} SMS missing")
    lines.append(f"  {verdict}: {tasks['as_expected']} of {tasks['submitted']} tasks ended as expected")
    lines.extend(f"    {line}" for line in tasks["not_as_expected"])
    return lines


def _ms(value: int | None) -> str:
    if value is None:
        return "-"
    return f"{value} ms" if abs(value) < 10_000 else f"{value / 1000:.1f} s"
