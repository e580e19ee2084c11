"""Helpers shared by the tests: waiting on a condition with a deadline, never sleeping
and hoping."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")


def wait_until(condition: Callable[[], T], *, timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy and return that, or fail
    with `what` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)
