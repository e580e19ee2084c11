"""What a shard's owner has handled, slice by slice: the memory behind its counts, its
re-reads and its refusal to publish a task twice.

A row is *handled* once the owner has taken it out of its wheel (to publish it, or to
give it to the release gate), or read it as not to fire (finished, or already reported
on), or dead-lettered it as unreadable. The record keeps, for each one-second slice,
the keys `(run_at, id)` of the rows handled in it, packed 24 bytes each (8 for `run_at`,
16 for the id) into one `bytearray` a slice: no Python object per row, so a burst of
300,000 tasks costs 7.2 MB of record (a `set` of tuples would cost ~170 bytes a row).

What it answers:
- `count(k)`: how many distinct rows of slice `k` were handled, without unpacking: the
  expected side of every count the owner asks of the store behind its wheel;
- `__contains__`: whether a row was handled already: a copy that reaches the wheel after
  its row fired (a late hand-off, a re-read) is dropped instead of published again. A
  lookup scans the slice's bytes (`bytearray.find`, in C), so it is asked only of the
  few entries that can be copies (those that entered the wheel behind its frontier),
  never of every entry fired;
- `keys(k)`: the slice's keys as a set, for merging a re-read (rare: only when a count
  differs).

Worked example: two rows due 09:00:00.250 and 09:00:00.900 fire; slice
`1796202000` (09:00:00) then holds 48 bytes, `count` is 2; a hand-off copy of the first
arriving at 09:00:03 is found by `__contains__` and dropped.

Slices older than the owner's look-back horizon are forgotten (`forget_before`), so the
record holds the rows handled within the horizon: 24 bytes a row.
"""

from __future__ import annotations

from collections.abc import Iterable

KEY_BYTES = 24

Key = tuple[int, bytes]
"""A row: `(run_at_ms, id bytes)`; a retry copy is the same id at a later run_at."""


def pack(run_at_ms: int, task_id: bytes) -> bytes:
    return run_at_ms.to_bytes(8, "big") + task_id


def unpack(packed: bytes) -> Key:
    return int.from_bytes(packed[:8], "big"), packed[8:]


class SeenRecord:
    """Packed keys of the rows handled, by slice. Not thread-safe: the fire loop owns it."""

    def __init__(self) -> None:
        self._slices: dict[int, bytearray] = {}

    def add(self, k: int, key: Key) -> None:
        record = self._slices.get(k)
        if record is None:
            record = self._slices[k] = bytearray()
        record += key[0].to_bytes(8, "big")
        record += key[1]

    def add_packed(self, k: int, packed: bytes) -> None:
        record = self._slices.get(k)
        if record is None:
            record = self._slices[k] = bytearray()
        record += packed

    def count(self, k: int) -> int:
        record = self._slices.get(k)
        return 0 if record is None else len(record) // KEY_BYTES

    def count_between(self, k: int, after_ms: int, through_ms: int) -> int:
        """How many keys of slice `k` have `after_ms < run_at <= through_ms` (a scan of
        the slice only when the range cuts it)."""
        record = self._slices.get(k)
        if not record:
            return 0
        if after_ms < k * 1000 and through_ms >= k * 1000 + 999:
            return len(record) // KEY_BYTES
        data = bytes(record)
        return sum(1 for at in range(0, len(data), KEY_BYTES)
                   if after_ms < int.from_bytes(data[at:at + 8], "big") <= through_ms)

    def __contains__(self, item: tuple[int, bytes]) -> bool:
        """`(slice, packed key)` handled already?"""
        k, packed = item
        record = self._slices.get(k)
        if not record:
            return False
        at = record.find(packed)
        while at != -1 and at % KEY_BYTES:  # a match across two keys: look on
            at = record.find(packed, at + 1)
        return at != -1

    def keys(self, k: int) -> set[Key]:
        record = self._slices.get(k)
        if not record:
            return set()
        data = bytes(record)
        return {unpack(data[at:at + KEY_BYTES]) for at in range(0, len(data), KEY_BYTES)}

    def slices(self) -> Iterable[int]:
        return self._slices.keys()

    def forget_before(self, k: int) -> None:
        """Drop the slices before `k`."""
        for old in [slice_ for slice_ in self._slices if slice_ < k]:
            del self._slices[old]

    @property
    def nbytes(self) -> int:
        return sum(len(record) for record in self._slices.values())

    def __len__(self) -> int:
        """Rows recorded, all slices."""
        return sum(len(record) for record in self._slices.values()) // KEY_BYTES
