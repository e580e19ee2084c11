"""`scheduler schema show|apply`: the Cassandra schema (schema.cql)."""

from __future__ import annotations

from typing import Any

import click

from scheduler.cli.options import cassandra_options, settings_from


@click.group()
def schema() -> None:
    """Show or apply the Cassandra schema (schema.cql)."""


@schema.command("show")
@cassandra_options
def schema_show(**options: Any) -> None:
    """Print the CQL that `schema apply` runs for the given keyspace and replication."""
    from scheduler.adapters.cassandra.schema import render

    settings = settings_from(**options)
    click.echo(";\n\n".join(render(settings.keyspace, settings.replication)) + ";")


@schema.command("apply")
@cassandra_options
def schema_apply(**options: Any) -> None:
    """Create the keyspace and tables if they are missing (safe to run again).

    The shard count is recorded in the keyspace the first time; asking for another
    count later is refused, since every task's partition depends on it.
    """
    from scheduler.adapters.cassandra import schema as cassandra_schema
    from scheduler.adapters.cassandra.connection import connect

    settings = settings_from(**options)
    with connect(settings) as connection:
        applied = cassandra_schema.apply(connection, settings)
    recorded = "recorded now" if applied.shard_count_recorded_now else "as recorded before"
    click.echo(
        f"schema applied to keyspace {applied.keyspace}: {applied.statements} statements, "
        f"{applied.shard_count} shards ({recorded})"
    )
