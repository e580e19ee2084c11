"""What every part of the bench uses: `BenchFailure`, the wall clock in milliseconds,
progress lines on stderr, and the logger that takes librdkafka's own log lines."""

from __future__ import annotations

import logging
import sys
import time
from datetime import datetime, timezone

KAFKA_LOG = logging.getLogger("nine_oclock.kafka")
"""librdkafka's own log lines (e.g. events purged at close) go here, not to stderr."""


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
