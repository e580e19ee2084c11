"""Counting published messages by (tenant, type) without decoding them.

The dispatcher publishes up to 100,000 messages a second and keeps them as encoded bytes
(`scheduler.model.encode_message`); decoding each to count it would cost more than the
rest of its firing. A message's tenant and type are its 3rd and 4th fields, right after
the fixed-size id, so `group_key` slices them out as raw msgpack bytes (plus whether the
attempt is a retry: a first attempt's run_at delta, the 6th field, is always 0), and
only each distinct key is decoded, once per batch. Measured: ~250 ns a message.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable

import msgpack

from scheduler.model import MESSAGE_ID_SLICE
from scheduler.visibility.counts import Pair

_TENANT_AT = MESSAGE_ID_SLICE.stop
_INT_SIZES = {0xCC: 2, 0xCD: 3, 0xCE: 5, 0xCF: 9, 0xD0: 2, 0xD1: 3, 0xD2: 5, 0xD3: 9}
"""Bytes of a msgpack int by its first byte, beyond the fixints."""
RETRY = b"r"
FIRST = b"f"


def _str_end(item: bytes, at: int) -> int:
    """Where the msgpack string starting at `at` ends, or -1 if none starts there."""
    head = item[at]
    if 0xA0 <= head <= 0xBF:
        return at + 1 + (head & 0x1F)
    if head == 0xD9:
        return at + 2 + item[at + 1]
    if head == 0xDA:
        return at + 3 + int.from_bytes(item[at + 1:at + 3], "big")
    return -1


def group_key(item: bytes) -> bytes:
    """The message's tenant and type as raw msgpack, then `RETRY` or `FIRST`; empty for
    bytes that are not a message of this layout."""
    try:
        head = item[_TENANT_AT]
        if 0xA0 <= head <= 0xBF:  # the usual case, inline: short tenant and type, first attempt
            type_at = _TENANT_AT + 1 + (head & 0x1F)
            head = item[type_at]
            if 0xA0 <= head <= 0xBF:
                end = type_at + 1 + (head & 0x1F)
                if item[end + 1] == 0 and item[end + 2] == 1:
                    return item[_TENANT_AT:end] + FIRST
        return _slow_key(item)
    except IndexError:
        return b""


def _slow_key(item: bytes) -> bytes:
    type_at = _str_end(item, _TENANT_AT)
    if type_at < 0:
        return b""
    end = _str_end(item, type_at)
    if end < 0:
        return b""
    # item[end] is the priority (a fixint), then the run_at delta (any int), then the attempt.
    head = item[end + 1]
    size = 1 if head < 0x80 or head >= 0xE0 else _INT_SIZES.get(head, 0)
    if not size:
        return b""
    return item[_TENANT_AT:end] + (FIRST if item[end + 1 + size] == 1 else RETRY)


def tally(messages: Iterable[bytes]) -> Counter[bytes]:
    return Counter(map(group_key, messages))


def decode_tally(keys: Counter[bytes]) -> tuple[dict[Pair, int], dict[Pair, int]]:
    """(first attempts, retries) per (tenant, type) from `tally`'s keys; keys that are
    not a tenant and a type are left out."""
    first: dict[Pair, int] = {}
    retries: dict[Pair, int] = {}
    for key, n in keys.items():
        if not key:
            continue
        try:
            unpacker = msgpack.Unpacker(raw=False)
            unpacker.feed(key[:-1])
            tenant, type_ = next(unpacker), next(unpacker)
        except Exception:  # msgpack raises several unrelated types on garbage
            continue
        if not isinstance(tenant, str) or not isinstance(type_, str):
            continue
        into = retries if key[-1:] == RETRY else first
        into[(tenant, type_)] = into.get((tenant, type_), 0) + n
    return first, retries

