"""The ports the scheduler's core talks through; adapters implement them.

One module per side of the system: `tasks` (the task store), `schedules` (recurring
schedules), `coordination` (leases and fencing tokens), `queueing` (the producer's
hand-off, the ready topics, the hand-off log), `workers` (consuming, dead letters, the
effect ledger) and `limits` (the fairness limits) and `counts` (what `scheduler status` reads)
and `workflows` (workflows: their state, their members' outcomes, their claims). Every name is
re-exported here, so `from scheduler.ports import TaskStore` is how the rest of the package
imports them.

Each store port is kept by two adapters that meet one contract suite
(`tests/contract/`): Cassandra (`scheduler.adapters.cassandra`) and SQLite
(`scheduler.adapters.embedded`). Core modules import these ports, `model` and
`errors`, never a driver.

Fencing, in one paragraph
-------------------------
A dispatcher owns a shard under a lease whose fencing token grows with every new
lease. Each store write a dispatcher makes carries that token and is conditional: the
`shards` row is written only by a token at least as new as the recorded one, and rows
written into a task partition only by a token at least as new as the partition's
`fence`. A fenced operation returns `True` when it was applied and `False` when a newer
token got there first; `False` means "stop, someone else owns this now", never "retry".
"""

from __future__ import annotations

from scheduler.ports.coordination import Coordinator, Lease, SessionState
from scheduler.ports.counts import AGGREGATE_TENANT, CountStore, LatenessRow, ProcessReport
from scheduler.ports.limits import LimitsStore
from scheduler.ports.queueing import Handoff, HandoffLog, HandoffReader, HandoffRecord, Publisher
from scheduler.ports.schedules import AdvanceOutcome, ScheduleStore
from scheduler.ports.tasks import (
    ROW_ERRORS,
    BadRow,
    CancelMarks,
    CancelOutcome,
    HomeStatus,
    InsertFailure,
    ShardState,
    StatusReport,
    StoredTask,
    TaskStatus,
    TaskStore,
    hand_over,
    refusal_to_cancel,
    report_order,
)
from scheduler.ports.workers import Consumer, Delivery, EffectClaim, EffectLedger, TopicPartition, TopicScanner
from scheduler.ports.workflows import WHOLE, Claim, Member, MemberOutcome, WorkflowRecord, WorkflowState, WorkflowStore

__all__ = [
    "AGGREGATE_TENANT",
    "CountStore",
    "LatenessRow",
    "ProcessReport",
    "AdvanceOutcome",
    "BadRow",
    "CancelMarks",
    "CancelOutcome",
    "Claim",
    "Consumer",
    "Coordinator",
    "Delivery",
    "EffectClaim",
    "EffectLedger",
    "Handoff",
    "HandoffLog",
    "HandoffReader",
    "HandoffRecord",
    "InsertFailure",
    "Lease",
    "LimitsStore",
    "Member",
    "MemberOutcome",
    "Publisher",
    "ROW_ERRORS",
    "ScheduleStore",
    "SessionState",
    "ShardState",
    "StatusReport",
    "StoredTask",
    "HomeStatus",
    "TaskStatus",
    "TaskStore",
    "TopicPartition",
    "TopicScanner",
    "WHOLE",
    "WorkflowRecord",
    "WorkflowState",
    "WorkflowStore",
    "hand_over",
    "refusal_to_cancel",
    "report_order",
]
