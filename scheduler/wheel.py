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

`poll_started` is the one way out before an entry's time: it also takes the slot that
`now_ms` falls in as soon as that slot begins, so that a caller can fire each entry at its
own millisecond rather than at the end of its slot. Never early is then the caller's to
keep: the dispatcher holds those entries (`OwnedShard.soon`) and publishes each only once
its `run_at_ms` has come.

Worked example, `tick_ms=100`, `slots=2048` (a ring of 204.8 s), the cursor at
2026-12-02T08:59:59.999Z (`fired_through_ms = 1796201999999`):

- an entry due 09:00:00.250 (`1796202000250`) lies in slot `17962020002`, ring index
  `17962020002 % 2048 = 1186`, and fires at the first poll with
  `now_ms >= 1796202000299` (09:00:00.299), or is taken by the first `poll_started` with
  `now_ms >= 1796202000200` (09:00:00.200), its slot's start;
- an entry due 08:59:59.900 is already due: the next poll returns it;
- an entry due 09:03:30.000 lies 2100 slots ahead, beyond the ring's 2048: it waits in
  the overflow and moves into the ring once the cursor reaches 09:00:05.299.

Memory: no Python object per waiting entry. A slot's entries are packed into `bytes`
chunks, each entry a 4-byte header (tag, item length, and `run_at_ms` less the slot's
first millisecond, in one byte for a tick of up to 256 ms, else two) then the item's
bytes, unpacked only when the slot fires or is inspected; overdue entries carry a
13-byte header with the whole `run_at_ms`. Adds are packed into the wheel's one open
buffer (`_OPEN_BYTES`, allocated with the wheel) for as long as they go to the same
slot, which is how a bucket read arrives, in `run_at` order; an add to another slot, or
a full buffer, seals what the buffer holds into its slot as an exact-size chunk, joined
to the slot's last chunk while that is under `_CHUNK_BYTES`. So no slot keeps spare
room, a slot costs a chunk's fixed part (33 bytes, ~50 with the allocator's) per 4 KiB
or less that it holds, and a non-empty slot is a byte in a flags array (found with
`bytearray.find`, in C) rather than a heap entry. With 8 entries of 140 bytes a slot (a
60 s spread of 5,000 tasks a second over 64 shards) that is about 4 + 6 bytes an entry;
with 47 a slot (10 s), 4 + 1. Adds that alternate between slots cost a join (a copy of
up to 4 KiB) each, not memory. `nbytes` tells the total.

The long-lived parts are made with the wheel (the ring, the flags, the open buffer) or
are the chunks themselves, mostly over 512 bytes, which Python hands to malloc: a load
leaves few small objects behind among the transient ones it freed, which would keep
their allocator arenas resident (see `scheduler.dispatcher.memory`).

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

_LONG_HEADER = struct.Struct("<qBI")
"""An overdue entry's header: run_at_ms, tag, length of the item that follows."""

_SLOT_HEADERS = (struct.Struct("<BHB"), struct.Struct("<BHH"))
"""A slot's entry's header: tag, length of the item (`_LONG_ITEM`: a 4-byte length
follows), run_at_ms less the slot's first millisecond, in one byte for a tick of up to
256 ms, else two."""

_LONG_HEADER_SIZE = _LONG_HEADER.size
_pack_long = _LONG_HEADER.pack
_unpack_long = _LONG_HEADER.unpack_from
_LONG_ITEM = 0xFFFF
_MAX_OFFSET = 0xFFFF
_by_run_at = itemgetter(0)

_OPEN_BYTES = 8 * 1024
"""Capacity of the wheel's one open buffer, where consecutive adds to one slot are packed."""

_CHUNK_BYTES = 4 * 1024
"""A sealed run of entries is joined to its slot's last chunk while that is smaller."""

_OVERDUE = -(1 << 70)
"""The open buffer's key while it holds overdue entries (no slot number is this low)."""

_BYTES_OVERHEAD = sys.getsizeof(b"")

Entry = tuple[int, int, bytes]
"""What the wheel returns: `(run_at_ms, tag, item)`."""

Chunks = bytes | list[bytes]
"""A slot's sealed entries: one chunk, or several (all but the last at least `_CHUNK_BYTES`)."""


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
        self._short = tick_ms <= _MAX_OFFSET + 1
        """Slot entries carry their offset in the slot in 1 or 2 bytes; with a longer tick
        they carry the long header, as overdue ones do."""
        self._slot_header = _SLOT_HEADERS[0] if tick_ms <= 0x100 else _SLOT_HEADERS[1]
        self._pack_slot = self._slot_header.pack
        self._fired_through_ms = start_ms - 1
        self._cursor = start_ms // tick_ms
        """The first slot number not fired yet; the ring holds `_cursor` up to `_ring_end - 1`."""
        self._ring_end = self._cursor + slots
        self._ring: list[Chunks | None] = [None] * slots
        self._ring_used = bytearray(slots)
        """1 at the ring index of each non-empty slot, so no poll visits an empty slot."""
        self._overflow: dict[int, Chunks] = {}
        self._overflow_due: list[int] = []
        """The overflow's slot numbers (a heap)."""
        self._overdue: Chunks | None = None
        self._open = bytearray(_OPEN_BYTES)
        self._open_view = memoryview(self._open)
        self._open_used = 0
        self._open_key: int | None = None
        """The slot number (or `_OVERDUE`) whose latest entries the open buffer holds."""
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
        """Hold `item` until `run_at_ms`. O(1) (a join of up to `_CHUNK_BYTES` when adds
        alternate between slots); `ValueError` for a tag outside 0 to 255.

        The wheel does not de-duplicate: the same item added twice fires twice (see
        `items_in_slot`).
        """
        length = len(item)
        try:
            if run_at_ms <= self._fired_through_ms:
                key = _OVERDUE
                header = _pack_long(run_at_ms, tag, length)
            else:
                key = run_at_ms // self._tick_ms
                if not self._short:
                    header = _pack_long(run_at_ms, tag, length)
                elif length < _LONG_ITEM:
                    header = self._pack_slot(tag, length, run_at_ms - key * self._tick_ms)
                else:
                    header = (self._pack_slot(tag, _LONG_ITEM, run_at_ms - key * self._tick_ms)
                              + length.to_bytes(4, "little"))
        except struct.error:
            raise ValueError(f"a wheel entry's tag is an integer from 0 to 255, got {tag!r}") from None
        self._count += 1
        if key != self._open_key:
            if self._open_used:
                self._seal()
            self._open_key = key
            if key != _OVERDUE:
                self._mark(key)
        used = self._open_used
        size = len(header) + length
        if used + size > _OPEN_BYTES:
            if used:
                self._seal()
                used = 0
            if size > _OPEN_BYTES:
                self._put(key, header + item)
                return
        end = used + len(header)
        view = self._open_view
        view[used:end] = header
        view[end:end + length] = item
        self._open_used = end + length

    def poll(self, now_ms: int) -> list[Entry]:
        """Fire and return every overdue entry, then every entry of every slot whose whole
        span has passed by `now_ms`, in `run_at_ms` order (equal times in the order they
        were added). Advances `fired_through_ms` to the end of the last slot fired; a
        `now_ms` before the cursor fires the overdue entries only.

        Cost: the entries fired, plus the non-empty slots fired or moved from the
        overflow into the ring, plus a scan of the ring's flags (in C); never the entries
        still waiting.
        """
        fired: list[Entry] = []
        if self._overdue is not None or self._open_key == _OVERDUE:
            self._take(_OVERDUE, self._overdue, fired)
            self._overdue = None
        last = (now_ms + 1) // self._tick_ms - 1
        if last >= self._cursor:
            ring = self._ring
            used = self._ring_used
            slots = self._slots
            slot = self._next_in_ring(self._cursor)
            while slot is not None and slot <= last:
                index = slot % slots
                self._take(slot, ring[index], fired)
                ring[index] = None
                used[index] = 0
                slot = self._next_in_ring(slot + 1)
            overflow = self._overflow
            overflow_due = self._overflow_due
            while overflow_due and overflow_due[0] <= last:
                slot = heappop(overflow_due)
                self._take(slot, overflow.pop(slot), fired)
            self._cursor = last + 1
            self._fired_through_ms = self._cursor * self._tick_ms - 1
            self._ring_end = self._cursor + slots
            while overflow_due and overflow_due[0] < self._ring_end:
                slot = heappop(overflow_due)
                index = slot % slots
                ring[index] = overflow.pop(slot)
                used[index] = 1
        self._count -= len(fired)
        # Overdue entries are all due before any slot's, and slots fire in order, so one
        # stable sort orders the whole batch; it is linear on runs already in order.
        fired.sort(key=_by_run_at)
        return fired

    def poll_started(self, now_ms: int) -> list[Entry]:
        """`poll`, and also take the slot that `now_ms` falls in, whose span has begun but
        not passed: what is returned may not be due yet. The caller holds each entry until
        its `run_at_ms` (`OwnedShard` does), which lets a task fire at its own millisecond
        rather than at the end of its slot. `fired_through_ms` moves to the end of that
        slot: an entry added at or before it is taken by the next poll, due or not, so the
        caller keeps those too. Same order and cost as `poll`."""
        return self.poll(now_ms - now_ms % self._tick_ms + self._tick_ms - 1)

    def next_due_ms(self) -> int | None:
        """The earliest `now_ms` at which `poll` would return something: `fired_through_ms`
        when entries are overdue, None when the wheel is empty. A scan of the ring's flags
        (in C), O(1) in Python."""
        if self._overdue is not None or self._open_key == _OVERDUE:
            return self._fired_through_ms
        slot = self._next_in_ring(self._cursor)
        if slot is None:
            if not self._overflow_due:
                return None
            slot = self._overflow_due[0]
        return (slot + 1) * self._tick_ms - 1

    def items_in_slot(self, run_at_ms: int) -> Iterator[Entry]:
        """The waiting entries that would fire together with an entry added now at
        `run_at_ms`: those of its slot, or the overdue ones if `run_at_ms` is already due.
        In the order they were added; O(entries of that slot). Reads a copy taken at the
        call, so the wheel may change while the result is iterated."""
        out: list[Entry] = []
        if run_at_ms <= self._fired_through_ms:
            self._read(_OVERDUE, self._overdue, out)
        else:
            slot = run_at_ms // self._tick_ms
            self._read(slot, self._get(slot), out)
        return iter(out)

    def clear(self) -> None:
        """Drop every waiting entry. `fired_through_ms` stays where it is."""
        self._ring = [None] * self._slots
        self._ring_used = bytearray(self._slots)
        self._overflow = {}
        self._overflow_due = []
        self._overdue = None
        self._open_used = 0
        self._open_key = None
        self._count = 0

    @property
    def nbytes(self) -> int:
        """Approximate bytes of memory held by the wheel's structures and packed entries
        (allocated size, the open buffer included). O(slots)."""
        total = sys.getsizeof(self._ring) + sys.getsizeof(self._ring_used) + sys.getsizeof(self._open)
        total += sum(_chunks_nbytes(chunks) for chunks in self._ring if chunks is not None)
        total += sys.getsizeof(self._overflow) + sum(_chunks_nbytes(chunks) for chunks in self._overflow.values())
        total += sys.getsizeof(self._overflow_due) + sum(sys.getsizeof(slot) for slot in self._overflow_due)
        if self._overdue is not None:
            total += _chunks_nbytes(self._overdue)
        return total

    def __repr__(self) -> str:
        return (
            f"TimingWheel(tick_ms={self._tick_ms}, slots={self._slots}, "
            f"fired_through_ms={self._fired_through_ms}, entries={self._count})"
        )

    def _next_in_ring(self, start: int) -> int | None:
        """The first non-empty slot number from `start` (at or after the cursor) to the
        ring's end, or None."""
        count = self._ring_end - start
        if count <= 0:
            return None
        slots = self._slots
        first = start % slots
        used = self._ring_used
        if first + count <= slots:
            index = used.find(1, first, first + count)
            return None if index < 0 else start + index - first
        index = used.find(1, first)
        if index >= 0:
            return start + index - first
        index = used.find(1, 0, first + count - slots)
        return None if index < 0 else start + slots - first + index

    def _mark(self, slot: int) -> None:
        """Make `slot` non-empty (its chunks may stay empty while the open buffer holds its entries)."""
        if slot < self._ring_end:
            index = slot % self._slots
            if self._ring[index] is None:
                self._ring[index] = b""
                self._ring_used[index] = 1
        elif slot not in self._overflow:
            self._overflow[slot] = b""
            heappush(self._overflow_due, slot)

    def _get(self, key: int) -> Chunks | None:
        if key == _OVERDUE:
            return self._overdue
        if key < self._ring_end:
            return self._ring[key % self._slots]
        return self._overflow.get(key)

    def _put(self, key: int, data: bytes | memoryview) -> None:
        """Append packed entries to the chunks of `key` (a slot made non-empty, or `_OVERDUE`)."""
        chunks = self._get(key)
        if chunks is None or not chunks:
            chunks = bytes(data)
        elif isinstance(chunks, bytes):
            chunks = chunks + data if len(chunks) < _CHUNK_BYTES else [chunks, bytes(data)]
        elif len(chunks[-1]) < _CHUNK_BYTES:
            chunks[-1] += data
            return
        else:
            chunks.append(bytes(data))
            return
        if key == _OVERDUE:
            self._overdue = chunks
        elif key < self._ring_end:
            self._ring[key % self._slots] = chunks
        else:
            self._overflow[key] = chunks

    def _seal(self) -> None:
        """Move the open buffer's entries into their slot's chunks; the buffer is then empty."""
        assert self._open_key is not None
        self._put(self._open_key, self._open_view[:self._open_used])
        self._open_used = 0

    def _take(self, key: int, chunks: Chunks | None, out: list[Entry]) -> None:
        """Append the entries of `key` (its chunks, then the open buffer's if it is
        `key`'s) to `out`; the open buffer is left free."""
        self._read(key, chunks, out)
        if self._open_key == key:
            self._open_key = None
            self._open_used = 0

    def _read(self, key: int, chunks: Chunks | None, out: list[Entry]) -> None:
        parts: list[bytes] = []
        if chunks:
            parts = [chunks] if isinstance(chunks, bytes) else chunks
        if self._open_key == key and self._open_used:
            parts = [*parts, bytes(self._open_view[:self._open_used])]
        if key == _OVERDUE or not self._short:
            for data in parts:
                _unpack_long_into(data, out)
        else:
            base = key * self._tick_ms
            for data in parts:
                _unpack_slot_into(data, base, self._slot_header, out)


def _chunks_nbytes(chunks: Chunks) -> int:
    if isinstance(chunks, bytes):
        return _BYTES_OVERHEAD + len(chunks) if chunks else 0
    return sys.getsizeof(chunks) + sum(_BYTES_OVERHEAD + len(chunk) for chunk in chunks)


def _unpack_long_into(data: bytes, out: list[Entry]) -> None:
    """Append the entries packed with long headers in `data` to `out`, in the order they were added."""
    append = out.append
    offset = 0
    end = len(data)
    while offset < end:
        run_at_ms, tag, length = _unpack_long(data, offset)
        offset += _LONG_HEADER_SIZE
        append((run_at_ms, tag, data[offset:offset + length]))
        offset += length


def _unpack_slot_into(data: bytes, base_ms: int, header: struct.Struct, out: list[Entry]) -> None:
    """Append the entries of a slot starting at `base_ms`, packed in `data` with
    `header`s, to `out`."""
    append = out.append
    unpack = header.unpack_from
    size = header.size
    offset = 0
    end = len(data)
    while offset < end:
        tag, length, at = unpack(data, offset)
        offset += size
        if length == _LONG_ITEM:
            length = int.from_bytes(data[offset:offset + 4], "little")
            offset += 4
        append((base_ms + at, tag, data[offset:offset + length]))
        offset += length
