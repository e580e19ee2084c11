"""The run's picture, a PNG drawn from the JSON document alone (`plot`): on top the
publish lateness by due second (p50, p99, max; with `--workers` the handler-start p99
too), below the fire rate (first publishes each second; handler starts each second with
`--workers`). A failover is marked by a line at the kill, a pause by a span from stop
to continue; a dotted line shows when every shard was held again."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")  # files only: no display on a server

import matplotlib.pyplot as plt  # noqa: E402


def plot(document: dict[str, Any], path: Path) -> Path:
    """Draw the run described by `document` into `path` (PNG); returns `path`."""
    if "fairness" in document:
        return plot_fairness(document, path)
    settings = document["settings"]
    figure, (top, bottom) = plt.subplots(2, 1, figsize=(11, 7), sharex=True,
                                         gridspec_kw={"height_ratios": [3, 2]})
    late = document["lateness_ms"]["by_due_second"]
    seconds = [int(s) + 0.5 for s in late]
    for key, style in (("p50", "-"), ("p99", "-"), ("max", "--")):
        top.plot(seconds, [late[s][key] for s in late], style, marker=".", label=f"publish {key}")
    if "handling" in document:
        handled = document["handling"]["lateness_ms"]["by_due_second"]
        top.plot([int(s) + 0.5 for s in handled], [handled[s]["p99"] for s in handled], ":", marker=".",
                 label="handler start p99")
    top.set_ylabel("lateness (ms)")
    top.set_title(f"nine o'clock, {document.get('scenario', 'burst')}: {settings['tasks']:,} tasks due over "
                  f"{settings['spread_s']} s, {settings['dispatchers']} dispatcher(s)")
    top.grid(alpha=0.3)

    published = document["fire"].get("published_per_s", [])
    bottom.stairs(published, range(len(published) + 1), label="first publishes")
    if "handling" in document:
        started = document["handling"]["rate"].get("started_per_s", [])
        bottom.stairs(started, range(len(started) + 1), label="handler starts")
    bottom.axhline(document["burst"]["due_per_s"], color="grey", linewidth=0.8, linestyle=":", label="due per s")
    bottom.set_ylabel("tasks per second")
    bottom.set_xlabel("seconds after M (top: by due second; bottom: by publish second)")
    bottom.grid(alpha=0.3)

    event = document.get("event")
    if event and event.get("at_ms") is not None:
        at_s = event["at_ms"] / 1000
        for axis in (top, bottom):
            if event["kind"] == "pause" and event.get("duration_ms") is not None:
                axis.axvspan(at_s, at_s + event["duration_ms"] / 1000, color="tab:red", alpha=0.12)
            axis.axvline(at_s, color="tab:red", linewidth=1.2)
            if event.get("reowned_at_ms") is not None:
                axis.axvline(event["reowned_at_ms"] / 1000, color="tab:green", linewidth=1.2, linestyle=":")
        label = (f"{event['dispatcher']} killed" if event["kind"] == "kill"
                 else f"{event['dispatcher']} paused {event['duration_ms'] / 1000:.0f} s"
                 if event.get("duration_ms") is not None else f"{event['dispatcher']} paused")
        top.annotate(label, xy=(at_s, 1), xycoords=("data", "axes fraction"), xytext=(4, -14),
                     textcoords="offset points", color="tab:red")
        if event.get("reown_s") is not None:
            top.annotate(f"all shards held again (+{event['reown_s']} s) ",
                         xy=(event["reowned_at_ms"] / 1000, 1), xycoords=("data", "axes fraction"),
                         xytext=(-4, -28), textcoords="offset points", color="tab:green", ha="right")
    top.legend(loc="upper left", bbox_to_anchor=(0, 0.85), fontsize="small")
    bottom.legend(loc="upper right", fontsize="small")
    return _save(figure, path)


def plot_fairness(document: dict[str, Any], path: Path) -> Path:
    """The fairness run: units each tenant released each second, stacked, under the
    global rate, with each tenant's release lateness p99 in the legend."""
    fair = document["fairness"]
    tenants = fair["tenants"]
    figure, axis = plt.subplots(figsize=(11, 5.5))
    seconds = max(1, *(len(t["units_per_s"]) for t in tenants.values()))
    series = [t["units_per_s"] + [0] * (seconds - len(t["units_per_s"])) for t in tenants.values()]
    labels = [f"{name} (weight {t['weight']}, p99 "
              f"{'-' if t['lateness_ms']['p99'] is None else format(t['lateness_ms']['p99'], ',')} ms)"
              for name, t in tenants.items()]
    # each second's value held from its start to its end ("post" steps need the last one twice)
    axis.stackplot(range(seconds + 1), [values + values[-1:] for values in series], labels=labels, step="post",
                   alpha=0.8)
    axis.axhline(fair["global_rate"]["configured_units_per_s"], color="black", linewidth=1, linestyle="--",
                 label=f"global rate {fair['global_rate']['configured_units_per_s']:,.0f} units/s")
    axis.set_xlabel("seconds after M (by release second)")
    axis.set_ylabel("cost units released per second")
    axis.set_title(f"nine o'clock, fairness: most units in any 1 s {fair['global_rate']['max_units_in_1s']:,}; "
                   f"gold/free {fair['weights']['ratio']} (configured 3)")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3, fontsize="small")
    return _save(figure, path)


def _save(figure: Any, path: Path) -> Path:
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path, dpi=100)
    plt.close(figure)
    return path
