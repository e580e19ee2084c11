"""Line charts of per-minute series as inline SVG, drawn on the server.

A chart is a few polylines over at most a few hundred minutes: SVG written here needs no
script, no chart library to ship, and shows the same in every browser and in a
screenshot. `None` in a series is a minute without data: the line breaks there.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from html import escape

WIDTH, HEIGHT = 560, 170
LEFT, RIGHT, TOP, BOTTOM = 52, 14, 26, 38


@dataclass(frozen=True)
class Series:
    name: str
    values: Sequence[float | None]
    css: str
    """The CSS class that colours the line and its legend entry."""


def nice_ceiling(value: float) -> float:
    """The smallest of 1, 2, 2.5, 5 x 10^k at or above `value` (1 for nothing)."""
    if value <= 0:
        return 1.0
    magnitude = 10.0 ** math.floor(math.log10(value))
    for step in (1, 2, 2.5, 5, 10):
        if step * magnitude >= value:
            return step * magnitude
    return 10 * magnitude


def _label(value: float, unit: str) -> str:
    if unit == "ms" and value >= 1000:
        return f"{value / 1000:g} s"
    text = f"{value:,.0f}" if value >= 10 or value == int(value) else f"{value:g}"
    return f"{text} {unit}".strip()


def _clock(minute_ms: int) -> str:
    return datetime.fromtimestamp(minute_ms / 1000, UTC).strftime("%H:%M")


def line_chart(title: str, minutes_ms: Sequence[int], series: Sequence[Series], unit: str = "",
               floor: float = 10, now_last: bool = True) -> str:
    """An SVG document fragment: `series` against `minutes_ms` (one value per minute), the
    scale from 0 to at least `floor`. With `now_last` the last minute is the current one,
    still filling: its label says "now"."""
    top = nice_ceiling(max((v for s in series for v in s.values if v is not None), default=0.0))
    top = max(top, floor)
    plot_w, plot_h = WIDTH - LEFT - RIGHT, HEIGHT - TOP - BOTTOM
    step = plot_w / max(len(minutes_ms) - 1, 1)

    def x(i: int) -> float:
        return LEFT + i * step

    def y(v: float) -> float:
        return TOP + plot_h - v / top * plot_h

    parts = [f'<svg class="chart" viewBox="0 0 {WIDTH} {HEIGHT}" role="img" aria-label="{escape(title)}">',
             f"<title>{escape(title)}</title>",
             f'<text class="caption" x="{LEFT}" y="15">{escape(title)}</text>']
    for fraction in (0, 0.5, 1):
        at = y(top * fraction)
        parts.append(f'<line class="grid" x1="{LEFT}" x2="{WIDTH - RIGHT}" y1="{at:.1f}" y2="{at:.1f}"/>')
        parts.append(f'<text class="tick" x="{LEFT - 6}" y="{at + 4:.1f}" text-anchor="end">'
                     f"{escape(_label(top * fraction, unit))}</text>")
    if minutes_ms:
        last = len(minutes_ms) - 1
        for i in sorted({0, last // 2, last}):
            anchor = "start" if i == 0 else "end" if i == last else "middle"
            label = "now" if i == last and now_last else _clock(minutes_ms[i])
            parts.append(f'<text class="tick" x="{x(i):.1f}" y="{HEIGHT - BOTTOM + 16}" text-anchor="{anchor}">'
                         f"{label}</text>")
    for s in series:
        run: list[str] = []
        runs = []
        for i, v in enumerate(s.values):
            if v is None:
                if run:
                    runs.append(run)
                run = []
            else:
                run.append(f"{x(i):.1f},{y(v):.1f}")
        if run:
            runs.append(run)
        for points in runs:
            if len(points) == 1:
                cx, cy = points[0].split(",")
                parts.append(f'<circle class="line {s.css}" cx="{cx}" cy="{cy}" r="2"/>')
            else:
                parts.append(f'<polyline class="line {s.css}" points="{" ".join(points)}"/>')
    legend_x = LEFT
    for s in series:
        parts.append(f'<rect class="key {s.css}" x="{legend_x}" y="{HEIGHT - 12}" width="10" height="10"/>'
                     f'<text class="legend" x="{legend_x + 14}" y="{HEIGHT - 3}">{escape(s.name)}</text>')
        legend_x += 24 + 7 * len(s.name)
    parts.append("</svg>")
    return "".join(parts)
