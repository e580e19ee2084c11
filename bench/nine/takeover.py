"""What the messages say about a failover or a pause: when the shards the victim held
were first published again under a new owner's lease token, how late their tasks were,
and whether anyone published under a token that was already stale.

Every message carries the fencing token of the lease it was fired under, and a task's
shard follows from its id (`TaskId.shard`), so the messages alone tell who fired what:
on a shard, a token newer than the victim's (`tokens` in its stats file just before
the event) is a new owner's. Two counts of stale publishing:

- `stale_token_messages`: messages of the victim's shards under the victim's token,
  stored by Kafka after its lease expired (event + lease timeout): the victim was
  firing shards it no longer held.
- `after_new_owner_first`: messages of any shard under a token older than one already
  published on that shard (by broker time): a superseded owner firing after the new
  one had begun.

Both must be 0 after a kill (the victim is dead); after a pause they show whether the
victim, continued, went on firing its old wheels.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from scheduler.errors import InvalidMessage
from scheduler.model import decode_message

from .reader import Record
from .report import lateness_figures
from .settings import SHARDS


def takeover_figures(records: Sequence[Record], expected: Mapping[bytes, int], event: Mapping[str, Any],
                     minute_ms: int) -> dict[str, Any]:
    """The takeover figures of one run; `event` is `Disruption.figures` (times after M)."""
    if event.get("at_ms") is None:
        return {"observed": False}
    event_ms = minute_ms + int(event["at_ms"])
    expiry_ms = event_ms + int(event["lease_timeout_s"]) * 1000
    victim_shards = {int(s) for s in event["shards"]}
    old_tokens = {int(s): int(t) for s, t in event["tokens"].items()}

    by_shard: dict[int, list[tuple[int, int, bytes]]] = {}
    for value, stamp, _ in records:
        try:
            message = decode_message(value)
        except InvalidMessage:
            continue
        key = message.task.id.bytes
        if key not in expected:
            continue
        by_shard.setdefault(message.task.id.shard(SHARDS), []).append((stamp, message.fence, key))

    stale = stale_after_new = old_after_event = 0
    first_new: dict[int, int] = {}
    first_publish: dict[bytes, int] = {}
    for shard, messages in by_shard.items():
        messages.sort()
        newest = -1
        for stamp, fence, key in messages:
            if fence < newest:
                stale_after_new += 1
            newest = max(newest, fence)
            if shard not in victim_shards:
                continue
            held = first_publish.get(key)
            if held is None or stamp < held:
                first_publish[key] = stamp
            old = old_tokens.get(shard)
            if old is None:
                continue
            if fence == old:
                old_after_event += stamp > event_ms
                stale += stamp > expiry_ms
            elif fence > old and shard not in first_new:
                first_new[shard] = stamp

    due_after = [stamp - expected[key] for key, stamp in first_publish.items() if expected[key] >= event_ms]
    first_times = sorted(first_new.values())
    return {
        "observed": True,
        "victim_shards": len(victim_shards),
        "shards_published_by_new_owner": len(first_new),
        "first_new_owner_publish_after_event_ms": first_times[0] - event_ms if first_times else None,
        "last_shard_first_publish_after_event_ms": first_times[-1] - event_ms if first_times else None,
        "old_owner_messages_after_event": old_after_event,
        "stale_token_messages": stale,
        "after_new_owner_first": stale_after_new,
        "lateness_ms_of_victim_shards_due_after_event": {
            "tasks": len(due_after), **lateness_figures(due_after)},
    }
