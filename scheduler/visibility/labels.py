"""Bounded label values for the metrics: which task types get a series of their own.

Producers name task types freely, so a `type` label taken as it comes would give
Prometheus one series per name any producer ever used (a typo, a generated name, an
attacker's garbage): its memory and every query grow with it. The rule: a process
labels at most a fixed set of types, and counts every other type as `other`.

- A worker's set is its app's registered handler types: the types it can run. A
  message of any other type is dead-lettered, and counted as `other`.
- A dispatcher has no such list: it labels the first `limit` distinct types it sees
  (`--metrics-types`), in the order it sees them, and the rest as `other`. Which types
  those are depends on the process's history, so two dispatchers may label differently;
  totals over types are always exact.

There is no tenant label: tenants are unbounded too, and per-tenant counts are the
store's to answer (`scheduler get`, `scheduler limits show`), not Prometheus's.

A type literally named `other` shares the `other` series.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

OTHER = "other"
"""The label of every type without a series of its own."""

MAX_TYPE_LABELS = 31
"""The most types a dispatcher can label: the slot travels in 5 bits of the wheel's tag
(`scheduler.dispatcher.rows.tag_for`), slot 0 being `other`."""

DEFAULT_TYPE_LABELS = 20


class TypeLabels:
    """Task type -> a small slot number (0: `other`), and slot -> label.

    `slot` may be called from any thread: a known type is a dict read; a new type takes a
    lock once, and only until `limit` types are labelled. With `fixed`, the set never
    grows (a worker's handler types)."""

    def __init__(self, limit: int = DEFAULT_TYPE_LABELS, *, fixed: Iterable[str] | None = None) -> None:
        if not 0 <= limit <= MAX_TYPE_LABELS and fixed is None:
            raise ValueError(f"a dispatcher labels 0 to {MAX_TYPE_LABELS} task types, not {limit}")
        self._names: list[str] = [OTHER]
        self._slots: dict[str, int] = {}
        self._lock = threading.Lock()
        if fixed is not None:
            for name in sorted(set(fixed) - {OTHER}):
                self._slots[name] = len(self._names)
                self._names.append(name)
            self.limit = len(self._names) - 1
            self._full = True
        else:
            self.limit = limit
            self._full = limit == 0

    def slot(self, type_: str) -> int:
        """The type's slot: its own (1 to `limit`), or 0 for `other`."""
        slot = self._slots.get(type_)
        if slot is not None:
            return slot
        if self._full or type_ == OTHER:
            return 0
        with self._lock:
            slot = self._slots.get(type_)
            if slot is not None:
                return slot
            if len(self._names) > self.limit:
                self._full = True
                return 0
            slot = len(self._names)
            self._names.append(type_)  # the name first: a reader that finds the slot finds its name
            self._slots[type_] = slot
            if len(self._names) > self.limit:
                self._full = True
            return slot

    def label(self, type_: str) -> str:
        """The type's label: the type itself if it has a slot, else `other`."""
        return self._names[self.slot(type_)]

    def name(self, slot: int) -> str:
        """The label of a slot (an unknown slot reads as `other`)."""
        names = self._names
        return names[slot] if 0 <= slot < len(names) else OTHER

    def labels(self) -> list[str]:
        """Every label so far, `other` first."""
        return list(self._names)
