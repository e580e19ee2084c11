"""The dispatcher's timing wheel: the entries it has loaded and not yet fired, ordered
by the millisecond they fall due. Pure: no threads, no I/O and no clock of its own; the
caller passes the time (`now_ms`) to every `poll`.

Slots
-----
Time is cut into slots of `tick_ms`; slot `n` holds the entries with
`n * tick_ms <= run_at_ms < (n + 1) * tick_ms`. The ring has `slots` of them, one per
slot number modulo `slots`, and covers the `slots` slot numbers from the cursor on. The
cursor, `fired_through_ms`, is the last millisecond already fired: it starts at
`start_ms - 1` and, once anything has fired, is the end of the last fired slot.

`add` has three branches, as in Kafka's TimingWheel and Netty's HashedWheelTimer:

- already due (`run_at_ms <= fired_through_ms`): the overdue list, which the very next
  `poll` fires, whatever time it is given;
- within the ring's span: the entry's slot in the ring;
- beyond it: the overflow, keyed by slot number. An overflow slot moves into the ring
  as the cursor comes within `slots` slots of it (after a long jump it may fire straight
  from the overflow).

Never early, at most one tick late: a slot fires only once its whole span has passed,
i.e. at the first `poll` with `now_ms >= (n + 1) * tick_ms - 1`, so no entry is returned
before its `run_at_ms` and none later than the first poll at or after
`run_at_ms + tick_ms - 1`. Each `poll` returns its entries in `run_at_ms` order, equal
times in the order they were added, the overdue ones first.

Worked example, `tick_ms=100`, `slots=2048` (a ring of 204.8 s), the cursor at
2026-12-02T08:59:59.999Z (`fired_through_ms = 1796201999999`):

- an entry due 09:00:00.250 (`1796202000250`) lies in slot `17962020002`, ring index
  `17962020002 % 2048 = 1186`, and fires at the first poll with
  `now_ms >= 1796202000299` (09:00:00.299);
- an entry due 08:59:59.900 is already due: the next poll returns it;
- an entry due 09:03:30.000 lies 2100 slots ahead, beyond the ring's 2048: it waits in
  the overflow and moves into the ring once the cursor reaches 09:00:05.299.

Memory: no Python object per waiting entry. Each slot (and the overdue list) packs its
entries into a `bytearray`, a 13-byte header (`run_at_ms`, `tag`, item length) then the
item's bytes, unpacked only when the slot fires or is inspected. A `bytearray` keeps up
to 1/8 of its size spare for growth, so once it holds `_CHUNK_BYTES` its contents are
frozen into an exact-size `bytes` chunk and it starts again empty: the spare room stays
under 512 bytes per slot whatever the slot holds. An entry costs its item plus 13 bytes
of header and a share of its slot's: about 100 bytes for a slot, 230 once it has frozen
a chunk, plus 41 a chunk. With 100 entries of 100 bytes a slot, that comes to 16 to 18
bytes an entry. `nbytes` tells the total.

Locking: not thread-safe. The caller serialises every call (the dispatcher's loop owns
its wheel). Returned items are new `bytes` objects; the wheel keeps no reference to them.
"""

from __future__ import annotations

import struct
import sys
from collections.abc import Iterator
from heapq import heappop, heappush
from operator import itemgetter

from scheduler.errors import ConfigError

_HEADER = struct.Struct("<qBI")
"""A packed entry's header: run_at_ms, tag, length of the item that follows."""

_HEADER_SIZE = _HEADER.size
_pack_header = _HEADER.pack
_unpack_header = _HEADER.unpack_from
_by_run_at = itemgetter(0)

_CHUNK_BYTES = 4 * 1024
"""A slot's packed entries are frozen into a chunk of `bytes` once they reach this size."""

_BYTES_OVERHEAD = sys.getsizeof(b"")

Entry = tuple[int, int, bytes]
"""What the wheel returns: `(run_at_ms, tag, item)`."""


class TimingWheel:
    """Entries `(run_at_ms, tag, item)` waiting for their time; see the module docstring.

    `tag` is a small integer (0 to 255) kept with the item, e.g. the topic to publish to.
    """

    def __init__(self, *, start_ms: int, tick_ms: int = 100, slots: int = 2048) -> None:
        if not isinstance(tick_ms, int) or tick_ms < 1:
            raise ConfigError(f"tick_ms must be a positive number of milliseconds, got {tick_ms!r}")
        if not isinstance(slots, int) or slots < 1:
            raise ConfigError(f"slots must be a positive integer, got {slots!r}")
        self._tick_ms = tick_ms
        self._slots = slots
        self._fired_through_ms = start_ms - 1
        self._cursor = start_ms // tick_ms
        """The first slot number not fired yet; the ring holds `_cursor` up to `_ring_end - 1`."""
        self._ring_end = self._cursor + slots
        self._ring: list[bytearray | None] = [None] * slots
        self._ring_due: list[int] = []
        """Slot numbers of the ring's non-empty slots (a heap), so no poll visits an empty slot."""
        self._overflow: dict[int, bytearray] = {}
        self._overflow_due: list[int] = []
        """The overflow's slot numbers (a heap)."""
        self._frozen: dict[int, list[bytes]] = {}
        """Chunks frozen from a slot's buffer, oldest first, by slot number (ring or overflow)."""
        self._frozen_nbytes = 0
        self._overdue = bytearray()
        self._overdue_frozen: list[bytes] = []
        self._count = 0

    @property
    def tick_ms(self) -> int:
        return self._tick_ms

    @property
    def slots(self) -> int:
        return self._slots

    @property
    def fired_through_ms(self) -> int:
        """Every entry with `run_at_ms` up to this has been returned by `poll`, or is overdue
        and goes out with the next one. Never decreases."""
        return self._fired_through_ms

    def __len__(self) -> int:
        """Entries waiting, overdue ones included."""
        return self._count

    def add(self, run_at_ms: int, tag: int, item: bytes) -> None:
        """Hold `item` until `run_at_ms`. O(1); `ValueError` for a tag outside 0 to 255.

        The wheel does not de-duplicate: the same item added twice fires twice (see
        `items_in_slot`).
        """
        try:
            header = _pack_header(run_at_ms, tag, len(item))
        except struct.error:
            raise ValueError(f"a wheel entry's tag is an integer from 0 to 255, got {tag!r}") from None
        self._count += 1
        if run_at_ms <= self._fired_through_ms:
            buffer = self._overdue
            buffer += header
            buffer += item
            if len(buffer) >= _CHUNK_BYTES:
                self._overdue_frozen.append(self._freeze(buffer))
            return
        slot = run_at_ms // self._tick_ms
        if slot < self._ring_end:
            index = slot % self._slots
            ring_buffer = self._ring[index]
            if ring_buffer is None:
                ring_buffer = self._ring[index] = bytearray()
                heappush(self._ring_due, slot)
            buffer = ring_buffer
        else:
            overflow_buffer = self._overflow.get(slot)
            if overflow_buffer is None:
                overflow_buffer = self._overflow[slot] = bytearray()
                heappush(self._overflow_due, slot)
            buffer = overflow_buffer
        buffer += header
        buffer += item
        if len(buffer) >= _CHUNK_BYTES:
            chunk = self._freeze(buffer)
            chunks = self._frozen.get(slot)
            if chunks is None:
                self._frozen[slot] = [chunk]
            else:
                chunks.append(chunk)

    def poll(self, now_ms: int) -> list[Entry]:
        """Fire and return every overdue entry, then every entry of every slot whose whole
        span has passed by `now_ms`, in `run_at_ms` order (equal times in the order they
        were added). Advances `fired_through_ms` to the end of the last slot fired; a
        `now_ms` before the cursor fires the overdue entries only.

        Cost: the entries fired, plus the non-empty slots fired or moved from the
        overflow into the ring; never the entries still waiting, nor the empty slots.
        """
        fired: list[Entry] = []
        if self._overdue_frozen or self._overdue:
            self._unpack(self._overdue_frozen, self._overdue, fired)
            self._overdue_frozen = []
            self._overdue = bytearray()
        last = (now_ms + 1) // self._tick_ms - 1
        if last >= self._cursor:
            ring = self._ring
            slots = self._slots
            frozen = self._frozen
            ring_due = self._ring_due
            while ring_due and ring_due[0] <= last:
                slot = heappop(ring_due)
                index = slot % slots
                self._unpack(frozen.pop(slot, None), ring[index], fired)
                ring[index] = None
            overflow = self._overflow
            overflow_due = self._overflow_due
            while overflow_due and overflow_due[0] <= last:
                slot = heappop(overflow_due)
                self._unpack(frozen.pop(slot, None), overflow.pop(slot), fired)
            self._cursor = last + 1
            self._fired_through_ms = self._cursor * self._tick_ms - 1
            self._ring_end = self._cursor + slots
            while overflow_due and overflow_due[0] < self._ring_end:
                slot = heappop(overflow_due)
                ring[slot % slots] = overflow.pop(slot)
                heappush(ring_due, slot)
        self._count -= len(fired)
        # Overdue entries are all due before any slot's, and slots fire in order, so one
        # stable sort orders the whole batch; it is linear on runs already in order.
        fired.sort(key=_by_run_at)
        return fired

    def next_due_ms(self) -> int | None:
        """The earliest `now_ms` at which `poll` would return something: `fired_through_ms`
        when entries are overdue, None when the wheel is empty. O(1)."""
        if self._overdue or self._overdue_frozen:
            return self._fired_through_ms
        if self._ring_due:
            slot = self._ring_due[0]
        elif self._overflow_due:
            slot = self._overflow_due[0]
        else:
            return None
        return (slot + 1) * self._tick_ms - 1

    def items_in_slot(self, run_at_ms: int) -> Iterator[Entry]:
        """The waiting entries that would fire together with an entry added now at
        `run_at_ms`: those of its slot, or the overdue ones if `run_at_ms` is already due.
        In the order they were added; O(entries of that slot). Reads a copy taken at the
        call, so the wheel may change while the result is iterated."""
        if run_at_ms <= self._fired_through_ms:
            chunks: list[bytes] = self._overdue_frozen
            buffer: bytearray | None = self._overdue
        else:
            slot = run_at_ms // self._tick_ms
            chunks = self._frozen.get(slot, [])
            if slot < self._ring_end:
                buffer = self._ring[slot % self._slots]
            else:
                buffer = self._overflow.get(slot)
        return _iter_entries(b"".join([*chunks, buffer or b""]))

    def clear(self) -> None:
        """Drop every waiting entry. `fired_through_ms` stays where it is."""
        self._ring = [None] * self._slots
        self._ring_due = []
        self._overflow = {}
        self._overflow_due = []
        self._frozen = {}
        self._frozen_nbytes = 0
        self._overdue = bytearray()
        self._overdue_frozen = []
        self._count = 0

    @property
    def nbytes(self) -> int:
        """Approximate bytes of memory held by the wheel's structures and packed entries
        (allocated size, growth slack included). O(non-empty slots)."""
        total = sys.getsizeof(self._ring) + sum(buffer.__sizeof__() for buffer in self._ring if buffer is not None)
        total += sys.getsizeof(self._overflow) + sum(buffer.__sizeof__() for buffer in self._overflow.values())
        for heap in (self._ring_due, self._overflow_due):
            total += sys.getsizeof(heap) + sum(sys.getsizeof(slot) for slot in heap)
        total += self._frozen_nbytes + sys.getsizeof(self._frozen)
        total += sum(sys.getsizeof(chunks) for chunks in self._frozen.values())
        total += sys.getsizeof(self._overdue) + sys.getsizeof(self._overdue_frozen)
        return total

    def __repr__(self) -> str:
        return (
            f"TimingWheel(tick_ms={self._tick_ms}, slots={self._slots}, "
            f"fired_through_ms={self._fired_through_ms}, entries={self._count})"
        )

    def _freeze(self, buffer: bytearray) -> bytes:
        """The buffer's contents as an exact-size chunk; the buffer is left empty (and its
        memory freed)."""
        chunk = bytes(buffer)
        buffer.clear()
        self._frozen_nbytes += _BYTES_OVERHEAD + len(chunk)
        return chunk

    def _unpack(self, chunks: list[bytes] | None, buffer: bytearray | None, out: list[Entry]) -> None:
        """Append the entries of a slot's frozen chunks, then of its buffer, to `out`."""
        if chunks:
            for chunk in chunks:
                self._frozen_nbytes -= _BYTES_OVERHEAD + len(chunk)
                _unpack_into(chunk, out)
        if buffer:
            _unpack_into(bytes(buffer), out)


def _unpack_into(data: bytes, out: list[Entry]) -> None:
    """Append the entries packed in `data` to `out`, in the order they were added."""
    append = out.append
    offset = 0
    end = len(data)
    while offset < end:
        run_at_ms, tag, length = _unpack_header(data, offset)
        offset += _HEADER_SIZE
        append((run_at_ms, tag, data[offset:offset + length]))
        offset += length


def _iter_entries(data: bytes) -> Iterator[Entry]:
    offset = 0
    end = len(data)
    while offset < end:
        run_at_ms, tag, length = _unpack_header(data, offset)
        offset += _HEADER_SIZE
        yield run_at_ms, tag, data[offset:offset + length]
        offset += length
