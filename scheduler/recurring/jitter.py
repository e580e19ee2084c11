"""Jitter: a run's offset after its slot, so that many `0 * * * *` schedules do not all
fall due in the same second.

The offset is a hash of `(schedule id, slot)` reduced to `[0, jitter_s)` seconds, in
whole milliseconds: random-looking across schedules and slots, and the same in every
process, so a run created twice (a retry, a race, a new shard owner) gets the same
`run_at`, hence the same task id.
"""

from __future__ import annotations

import hashlib
import uuid


def jitter_ms(schedule_id: uuid.UUID, slot_ms: int, jitter_s: int) -> int:
    """The offset of the run of `slot_ms`: 0 without jitter, else in `[0, jitter_s * 1000)`."""
    if jitter_s <= 0:
        return 0
    digest = hashlib.blake2b(schedule_id.bytes + slot_ms.to_bytes(8, "big", signed=True), digest_size=8,
                             person=b"sched.jitter").digest()
    return int.from_bytes(digest) % (jitter_s * 1000)
