"""The named statements of `queries.cql`, one per operation, loaded for a keyspace.

`CassandraTaskStore` prepares them once when it opens. `insert_task_statement` is the one that
tools outside the adapters may use: it writes a task row as `CassandraTaskStore`
does, for measuring what the table takes with no store in between.
"""

from __future__ import annotations

import re
from importlib import resources

_NAME = re.compile(r"^-- name: (\w+)\s*$", re.MULTILINE)


def named_queries(keyspace: str) -> dict[str, str]:
    """The statements of `queries.cql` by name, for `keyspace`, comment lines removed."""
    text = resources.files("scheduler.adapters.cassandra").joinpath("queries.cql").read_text(encoding="utf-8")
    parts = _NAME.split(text)
    queries: dict[str, str] = {}
    for name, body in zip(parts[1::2], parts[2::2], strict=True):
        lines = [line for line in body.splitlines() if line.strip() and not line.lstrip().startswith("--")]
        queries[name] = "\n".join(lines).format(keyspace=keyspace)
    return queries


def insert_task_statement(keyspace: str) -> str:
    """The CQL with which `CassandraTaskStore` writes a task into `keyspace`'s
    `tasks_by_bucket` (`insert_task`), to prepare and bind without the store, e.g. for
    `bench/ingest.py`'s raw ceiling: the same rows in the same shape, written straight by
    the driver. Its values, in order (`rows.INSERT_COLUMNS`): minute_bucket, shard, run_at
    (the two times in ms or as datetimes), task_id (a `uuid.UUID`), tenant, type, priority
    code, payload (msgpack bytes), attempt, max_attempts, idempotency_key (`UNSET_VALUE`
    when there is none: a bound null would write a tombstone) and cost. Status columns are not written,
    so writing a task again keeps its status."""
    return named_queries(keyspace)["insert_task"]
