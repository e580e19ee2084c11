"""The figures of a run and how they are shown: delivery, lateness percentiles and fire
rate from every message read (`analyse`), with `--workers` the same for every handler
start (`handling_figures`), memory per loaded task (`memory_figures`),
each figure against its target (`judge`), the table, and the JSON document (`emit`).
Everything here is computed from what the run collected; nothing touches a server."""

from __future__ import annotations

import json
import math
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from confluent_kafka import TIMESTAMP_LOG_APPEND_TIME

from scheduler.errors import InvalidMessage
from scheduler.model import decode_message

from .deployment import Fleet
from .reader import Record
from .settings import (
    REFERENCE_CEILINGS,
    TARGET_FIRE_RATE,
    TARGET_HANDLER_P99_MS,
    TARGET_MAX_MS,
    TARGET_OVERHEAD_BYTES,
    TARGET_P99_MS,
)
from .workers import Handled, tally
from .workload import Burst

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
        "lateness_ms": {**lateness_figures(lateness), "by_due_second": by_due_second(first, expected, burst)},
        "fire": fire,
    }


def by_due_second(moments: dict[bytes, int], expected: dict[bytes, int], burst: Burst) -> dict[str, Any]:
    """Lateness (moment - run_at) of the tasks due in each second of the burst."""
    by_second: dict[int, list[int]] = {}
    for key, moment in moments.items():
        by_second.setdefault((expected[key] - burst.minute_ms) // 1000, []).append(moment - expected[key])
    return {str(second): {"tasks": len(values), "p50": percentile(sorted(values), 0.5),
                          "p99": percentile(sorted(values), 0.99), "max": max(values)}
            for second, values in sorted(by_second.items())}


def handling_figures(records: list[Handled], expected: dict[bytes, int], burst: Burst,
                     settled_ms: int | None) -> dict[str, Any]:
    """With `--workers`: tasks handled (a handler started), lost and repeated, and the
    handler-start lateness (first start - run_at) of every task, from the records the
    workers wrote; `settled_ms`: when their stats showed every status durable."""
    counted = tally(records, expected)
    first = counted.first_start
    starts = sorted(first.values())
    rate: dict[str, Any] = {"handled_tasks": len(first)}
    if starts:
        span_ms = starts[-1] - burst.minute_ms
        rate.update({
            "last_start_after_minute_ms": span_ms,
            "tasks_per_s": round(len(starts) / (span_ms / 1000)) if span_ms > 0 else None,
            "peak_1s": peak_in_window(starts, 1000),
            "settled_after_minute_ms": None if settled_ms is None else settled_ms - burst.minute_ms,
            "started_per_s": per_second(starts, burst.minute_ms),
        })
    return {"delivery": counted.figures(),
            "lateness_ms": {**lateness_figures([start - expected[key] for key, start in first.items()]),
                            "by_due_second": by_due_second(first, expected, burst)},
            "rate": rate}


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
    if "handling" in result:
        handled = result["handling"]
        checks += [
            ("handler lateness p99", handled["lateness_ms"]["p99"], f"<= {TARGET_HANDLER_P99_MS:,} ms",
             TARGET_HANDLER_P99_MS, False),
            ("handled lost", handled["delivery"]["lost"], "0", 0, False),
        ]
    return [{"figure": name, "value": value, "target": target,
             "met": None if value is None else (value >= limit if floor else value <= limit)}
            for name, value, target, limit, floor in checks]


# Output.


def table(doc: dict[str, Any]) -> list[str]:
    fire, late, delivery, memory = doc["fire"], doc["lateness_ms"], doc["delivery"], doc["memory"]
    settings = doc["settings"]

    def number(value: Any, unit: str = "") -> str:
        if value is None:
            return "n/a"
        return f"{value:,}{unit}" if isinstance(value, int) else f"{value:,.1f}{unit}"

    lines = [
        f"nine o'clock ({doc.get('scenario', 'burst')}"
        + ("" if settings.get("backend", "cassandra") == "cassandra" else f", {settings['backend']} backend")
        + f"): {settings['tasks']:,} tasks due over {settings['spread_s']} s "
        f"({doc['burst']['due_per_s']:,}/s) at {doc['burst']['minute']}, {settings['dispatchers']} dispatcher(s), "
        f"reader in a {settings['reader']}",
        *fill_lines(doc.get("fill"), number),
        f"  ingest (SDK)            {number(doc['ingest']['rows_per_s'])} rows/s",
        ceiling_line(doc["ceiling"], number),
        f"  load of minute M        {number(doc['load']['seconds'], ' s')} "
        f"({'complete' if doc['load']['complete_before_minute'] else 'INCOMPLETE'} before M)"
        + (f"; LOCAL-CLUSTER.md read ceiling {REFERENCE_CEILINGS['cassandra_partition_read_rows_per_s']}"
           if doc["ceiling"]["kind"] == "kafka_produce" else ""),
        f"  fire rate               {number(fire.get('tasks_per_s'))} tasks/s (peak {number(fire.get('peak_1s'))} "
        f"in 1 s; {(fire.get('vs_ceiling') or 0) * 100:.0f}% of the "
        f"{'Kafka' if doc['ceiling']['kind'] == 'kafka_produce' else 'SQLite queue'} ceiling)",
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
    if "handling" in doc:
        handled, hlate, hrate = doc["handling"]["delivery"], doc["handling"]["lateness_ms"], doc["handling"]["rate"]
        lines += [
            f"  workers                 {settings['workers']} x concurrency {settings['worker_concurrency']}: "
            f"handled {handled['handled']:,} of {handled['expected']:,}, lost {handled['lost']:,}, repeated "
            f"{handled['duplicated_tasks']:,} (+{handled['extra_starts']:,} starts)",
            f"  handling rate           {number(hrate.get('tasks_per_s'))} tasks/s (peak {number(hrate.get('peak_1s'))} "
            f"in 1 s); last start {number(hrate.get('last_start_after_minute_ms'), ' ms')}, all statuses stored "
            f"{number(hrate.get('settled_after_minute_ms'), ' ms')} after M",
            f"  handler lateness        p50 {number(hlate['p50'])}  p90 {number(hlate['p90'])}  p99 "
            f"{number(hlate['p99'])}  p99.9 {number(hlate['p99_9'])}  max {number(hlate['max'])} ms; over 1 s "
            f"{number(hlate['over_1s'])} ({(hlate['over_1s_share'] or 0) * 100:.2f}%)",
        ]
        handling_cpu = doc.get("cpu_handling", {}).get("cores", {})
        if handling_cpu:
            lines.append("  cores until handled     " + ", ".join(f"{k} {v}" for k, v in handling_cpu.items()))
    if doc.get("event"):
        lines += event_lines(doc["event"], doc.get("takeover") or {}, number)
    if doc.get("fairness"):
        lines += fairness_lines(doc["fairness"], doc["ceiling"], number)
    burst_cpu = doc.get("cpu_burst", {}).get("cores", {})
    if burst_cpu:
        lines.append("  cores used in the burst " + ", ".join(f"{k} {v}" for k, v in burst_cpu.items()))
    missed = doc["missed"]
    lines.append("  targets missed:         " + (", ".join(
        f"{c['figure']} ({number(c['value'])}; target {c['target']})" for c in doc["targets"] if c["met"] is False)
        if missed else "none"))
    if doc["burst"]["due_per_s"] < TARGET_FIRE_RATE and not doc.get("fairness"):
        lines.append(f"  (only {doc['burst']['due_per_s']:,} tasks/s fall due: the fire-rate target needs "
                     f"--tasks / --spread-s of at least {TARGET_FIRE_RATE:,})")
    for warning in doc["warnings"]:
        lines.append(f"  WARNING: {warning}")
    for failure in doc["failures"]:
        lines.append(f"  FAILED: {failure}")
    return lines


def ceiling_line(ceiling: dict[str, Any], number: Any) -> str:
    runs = ", ".join(f"{rate / 1000:.0f}k" for rate in ceiling["runs"])
    if ceiling["kind"] == "kafka_produce":
        return (f"  kafka ceiling           {number(ceiling['msgs_per_s'])} msgs/s, median of {runs} "
                f"({ceiling['message_bytes_mean']} B messages); LOCAL-CLUSTER.md: "
                f"{REFERENCE_CEILINGS['kafka_produce_msgs_per_s']}")
    return (f"  sqlite queue ceiling    {number(ceiling['msgs_per_s'])} msgs/s, median of {runs} "
            f"({ceiling['message_bytes_mean']} B messages; no Kafka on the embedded backend: {ceiling['how']})")


def event_lines(event: dict[str, Any], takeover: dict[str, Any], number: Any) -> list[str]:
    """The table's lines for a failover or pause: the event, the re-owning, stale tokens."""
    if event.get("at_ms") is None:
        return [f"  event                   {event['kind']} of {event['dispatcher']}: did not happen"]
    what = "killed (SIGKILL)" if event["kind"] == "kill" else (
        f"paused (SIGSTOP) for {number(event['duration_ms'], ' ms')}")
    late = takeover.get("lateness_ms_of_victim_shards_due_after_event", {})
    return [
        f"  event                   {event['dispatcher']} {what} {number(event['at_ms'], ' ms')} after M, "
        f"holding {len(event['shards'])} shards",
        f"  re-own                  every shard held again {number(event['reown_s'], ' s')} after the event "
        f"(stats files, +-{event['reown_resolution_ms']} ms; lease timeout {event['lease_timeout_s']} s); first "
        f"publish under a new token {number(takeover.get('first_new_owner_publish_after_event_ms'), ' ms')}, "
        f"last shard's {number(takeover.get('last_shard_first_publish_after_event_ms'), ' ms')} after it",
        f"  its shards, due after   {number(late.get('tasks'))} tasks: lateness p50 {number(late.get('p50'))}  p99 "
        f"{number(late.get('p99'))}  max {number(late.get('max'))} ms",
        f"  stale tokens            {number(takeover.get('stale_token_messages'))} messages under the old token "
        f"after its lease expired, {number(takeover.get('after_new_owner_first'))} after a newer token's first "
        f"on the shard; old owner after the event {number(takeover.get('old_owner_messages_after_event'))}",
    ]


def fairness_lines(fair: dict[str, Any], ceiling: dict[str, Any], number: Any) -> list[str]:
    """The table's lines for the fairness scenario: each tenant, the global rate, the
    board's drain and the weights, the raw ceiling beside them."""
    rate, drain, weights = fair["global_rate"], fair["board_drain"], fair["weights"]
    kind = "Kafka" if ceiling["kind"] == "kafka_produce" else "SQLite queue"
    lines = ["  fairness                tenant   weight  tasks   units   release lateness p50 / p90 / p99 / max ms"
             "   first - last release after M"]
    for name, tenant in fair["tenants"].items():
        late = tenant["lateness_ms"]
        lines.append(f"    {name:<22}{tenant['weight']:>6}  {tenant['tasks']:>6,} {tenant['units']:>7,}   "
                     f"{number(late['p50'])} / {number(late['p90'])} / {number(late['p99'])} / {number(late['max'])}"
                     f"   {number(tenant['first_release_after_minute_ms'])} - "
                     f"{number(tenant['last_release_after_minute_ms'])} ms")
    lines += [
        f"  global rate             at most {number(rate['max_units_in_1s'])} units in any 1 s (limit "
        f"{number(rate['configured_units_per_s'])} units/s: {'within' if rate['within'] else 'OVER'}); raw "
        f"{kind} ceiling {number(ceiling['msgs_per_s'])} msgs/s"
        + (f" (LOCAL-CLUSTER.md: {REFERENCE_CEILINGS['kafka_produce_msgs_per_s']})"
           if ceiling["kind"] == "kafka_produce" else ""),
        f"  drain                   {number(drain['units_per_s'])} units/s of all tenants over "
        f"{number(drain['window_ms'], ' ms')} in the middle of the board's releases "
        f"({(drain['vs_global_rate'] or 0) * 100:.0f}% of the global rate)",
        f"  weights                 gold/free "
        f"{'n/a' if weights['ratio'] is None else format(weights['ratio'], '.2f')} (configured "
        f"{number(weights['configured_ratio'])}; error {(weights['error'] or 0) * 100:+.1f}%) over "
        f"{number(weights['window_ms'], ' ms')} both backlogged"
        + (f" ({number(weights.get('gold_units'))} / {number(weights.get('free_units'))} units)"
           if weights.get("gold_units") is not None else ""),
    ]
    return lines


def fill_lines(fill: dict[str, Any] | None, number: Callable[..., str]) -> list[str]:
    """The `--fill` lines: its rate, the settle time, the table on disk."""
    if not fill:
        return []
    disk = fill["disk"]
    return [
        f"  fill                    {fill['rows']:,} tasks ({fill['past_done']:,} done, {fill['future']:,} due; "
        f"{fill['partitions']:,} partitions) in {number(fill['seconds'], ' s')}: {number(fill['rows_per_s'])} "
        f"rows/s by {fill['processes']} process(es), {number(fill['writes_per_s'])} writes/s with the reports",
        f"  fill settled            after {number(fill['settle_s'], ' s')}"
        + ("" if fill["settled"] else " (TIMED OUT)")
        + (f"; table {disk['bytes'] / 2**20:,.1f} MiB on disk in {disk['sstables']} SSTables: "
           f"{number(disk['bytes_per_task'], ' B')} a task, {number(disk['bytes_per_partition'], ' B')} a partition"
           if disk else "; the table's files are not on this machine"),
    ]


def emit(document: dict[str, Any], out: Path | None, as_json: bool) -> None:
    """The table on stdout (on stderr when `as_json`), the JSON document to `out` if
    given, and on stdout when `as_json`."""
    text = json.dumps(document, indent=2)
    for line in table(document):
        print(line, file=sys.stderr if as_json else sys.stdout)
    if out:
        out.write_text(text + "\n", encoding="utf-8")
    if as_json:
        print(text)
