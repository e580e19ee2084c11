"""A partition with a row that is not a task after 2,000 good ones, for the tests that run
a real `scheduler dispatcher` on each backend: the good rows are published, the bad one
is dead-lettered with its columns, and the shard goes on past it."""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import dataclass

import msgpack

from scheduler.model import Partition, Task, TaskId, encode_payload, minute_bucket
from scheduler.ports import Delivery
from scheduler.worker.dead_letters import UNREADABLE_ROW, DeadLetter, decode_record

GOOD_BEFORE = 2000
"""Good rows ahead of the bad one: one whole chunk of a bucket read (`LOAD_CHUNK`)."""
GOOD_AFTER = 200
BAD_PRIORITY = 9
"""No priority has this code: a row holding it cannot be made a `Task`."""


@dataclass(frozen=True)
class BadPartition:
    partition: Partition
    before: list[Task]
    bad: Task
    """The key (run_at, id) and columns of the unreadable row; written with priority code 9."""
    after: list[Task]

    @property
    def good(self) -> list[Task]:
        return self.before + self.after

    @property
    def good_ids(self) -> set[TaskId]:
        return {task.id for task in self.good}


def due_in(shard_count: int, shard: int, run_at_ms: int) -> Task:
    while True:
        task_id = TaskId.new(run_at_ms)
        if task_id.shard(shard_count) == shard:
            return Task(task_id, "board", "sms", encode_payload({"at": run_at_ms}), run_at_ms)


def bad_partition(shard_count: int, shard: int, now_ms: int, lead_ms: int = 8_000) -> BadPartition:
    """2,000 good tasks due `lead_ms` from now, 1 ms apart, the bad row 0.5 s after them
    and 200 more good ones 0.5 s after it, all in one partition (one minute bucket: moved
    to the next one if the 3.5 s would straddle two)."""
    start = now_ms + lead_ms
    if minute_bucket(start) != minute_bucket(start + 3_500):
        start = minute_bucket(start + 3_500) + 100
    before = [due_in(shard_count, shard, start + n) for n in range(GOOD_BEFORE)]
    bad = due_in(shard_count, shard, start + GOOD_BEFORE + 500)
    after = [due_in(shard_count, shard, bad.run_at_ms + 500 + n) for n in range(GOOD_AFTER)]
    return BadPartition(Partition(minute_bucket(start), shard), before, bad, after)


def assert_dead_lettered(listed_json: str, deliveries: Sequence[Delivery], case: BadPartition) -> DeadLetter:
    """The bad row is listed by `scheduler dlq list --json` as an unreadable stored row of
    its partition, and its letter in the dead-letter topic holds the row's columns."""
    listed = [json.loads(line) for line in listed_json.splitlines() if line.strip()]
    mine = [entry for entry in listed if entry["task_id"] == str(case.bad.id)]
    assert len(mine) == 1, f"dlq list --json shows {listed}"
    [entry] = mine
    partition = case.partition
    assert entry["reason"] == UNREADABLE_ROW
    assert (entry["tenant"], entry["type"], entry["attempt"]) == ("board", "sms", 1)
    assert entry["source_topic"] == f"store:{partition.minute_bucket}/{partition.shard}"
    assert "priority" in entry["error"], entry["error"]
    letters = [record for record in map(decode_record, deliveries)
               if isinstance(record, DeadLetter) and record.task_id == case.bad.id]
    assert len(letters) == 1, f"the row was dead-lettered {len(letters)} times"
    [letter] = letters
    columns = msgpack.unpackb(letter.message, raw=False)
    assert columns["priority"] == BAD_PRIORITY, columns
    assert (columns["tenant"], columns["type"]) == ("board", "sms")
    assert columns["payload"] == case.bad.payload
    return letter
