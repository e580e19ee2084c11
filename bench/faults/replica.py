"""What a Cassandra node that was down holds once it is back: the writes it missed
reach it as hints from the nodes that took them (hinted handoff), or by repair.

Asks the restarted node alone (a driver session that may use no other node), at
consistency ONE so nothing is read from, or repaired by, the other replicas, for each
given task's row: is it there, and does it have the status the task ended with. With
three nodes and RF 3 every node holds every row, so each must be there."""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from typing import Any

from cassandra import ConsistencyLevel
from cassandra.cluster import EXEC_PROFILE_DEFAULT, Cluster, ExecutionProfile
from cassandra.policies import WhiteListRoundRobinPolicy

from scheduler.model import TaskId, from_ms, minute_bucket


def rows_on_node(host: str, port: int, keyspace: str, tasks: Mapping[bytes, int], shard_count: int) -> dict[str, Any]:
    """Of `tasks` (id -> run_at ms): how many rows `host` holds, and how many say `done`."""
    profile = ExecutionProfile(load_balancing_policy=WhiteListRoundRobinPolicy([host]),
                               consistency_level=ConsistencyLevel.ONE, request_timeout=30)
    cluster = Cluster([host], port=port, execution_profiles={EXEC_PROFILE_DEFAULT: profile})
    try:
        session = cluster.connect(keyspace)
        query = session.prepare("SELECT status FROM tasks_by_bucket WHERE minute_bucket = ? AND shard = ? "
                                "AND run_at = ? AND task_id = ?")
        found = done = 0
        for key, run_at_ms in tasks.items():
            shard = TaskId(int.from_bytes(key)).shard(shard_count)
            row = session.execute(query, (from_ms(minute_bucket(run_at_ms)), shard,
                                          from_ms(run_at_ms), uuid.UUID(bytes=key))).one()
            if row is not None:
                found += 1
                done += row.status == "done"
        return {"node": host, "asked": len(tasks), "rows": found, "done": done}
    finally:
        cluster.shutdown()
