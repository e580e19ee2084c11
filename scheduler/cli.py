"""The `scheduler` command: the one place that wires adapters to settings.

Every option also reads a `SCHEDULER_*` environment variable, shown in `--help`.
Exit codes are the named constants below, so scripts can tell a bad flag from a
server that is down.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from enum import IntEnum
from typing import Any, TypeVar

import click

from scheduler import __version__
from scheduler.errors import ConfigError, SchedulerError, SchemaConflict, StoreUnavailable
from scheduler.settings import CASSANDRA_ENV, CONSISTENCY_LEVELS, CassandraSettings, split_hosts


class Exit(IntEnum):
    OK = 0
    FAILURE = 1
    USAGE = 2  # click's own code for a bad flag
    UNAVAILABLE = 3  # a server could not be reached
    CONFLICT = 4  # the store holds something that contradicts the request


F = TypeVar("F", bound=Callable[..., Any])


def cassandra_options(function: F) -> F:
    """The options that say where the Cassandra cluster and keyspace are; their defaults
    and variables are those of `CassandraSettings`."""
    defaults = CassandraSettings()

    def option(flag: str, field: str, help: str, **kwargs: Any) -> Callable[[F], F]:
        kwargs.setdefault("default", getattr(defaults, field))
        return click.option(flag, field, envvar=CASSANDRA_ENV[field], show_envvar=True, show_default=True,
                            help=help, **kwargs)

    options = [
        option("--hosts", "hosts", "Cassandra contact points, comma-separated.", default=",".join(defaults.hosts)),
        option("--port", "port", "Cassandra native-protocol port.", type=int),
        option("--keyspace", "keyspace", "Keyspace holding the scheduler's tables."),
        option("--replication", "replication",
               "CQL replication map used when the keyspace is created, e.g. "
               "\"{'class': 'NetworkTopologyStrategy', 'dc1': 3}\" in production."),
        option("--consistency", "consistency", "Consistency of reads and writes.",
               type=click.Choice(CONSISTENCY_LEVELS)),
        option("--shards", "shard_count", "Shards per keyspace; fixed when the keyspace is created.", type=int),
    ]
    for decorate in reversed(options):
        function = decorate(function)
    return function


def settings_from(hosts: str, port: int, keyspace: str, replication: str, consistency: str,
                  shard_count: int) -> CassandraSettings:
    return CassandraSettings.from_env(
        hosts=split_hosts(hosts), port=port, keyspace=keyspace, replication=replication,
        consistency=consistency, shard_count=shard_count,
    )


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="scheduler")
def cli() -> None:
    """A distributed task scheduler: tasks stored in Cassandra, leased shards in ZooKeeper,
    due tasks published to Kafka. `scheduler demo` runs on one machine with no servers."""


@cli.group()
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


@cli.command()
def demo() -> None:
    """Play results day on this machine with no servers (embedded backend).

    Not built yet: for now this command says so plainly and exits.
    """
    click.echo(
        "scheduler demo is not built yet: the embedded store, dispatcher and workers it plays "
        "are still to come. What works today: `scheduler schema show`, `scheduler schema apply`, "
        "and the local cluster in deploy/local (see README.md)."
    )


def exit_code_for(error: SchedulerError) -> Exit:
    if isinstance(error, SchemaConflict):
        return Exit.CONFLICT
    if isinstance(error, StoreUnavailable):
        return Exit.UNAVAILABLE
    if isinstance(error, ConfigError):
        return Exit.USAGE
    return Exit.FAILURE


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the CLI and turns scheduler errors into exit codes."""
    try:
        cli.main(args=argv, prog_name="scheduler", standalone_mode=False)
    except click.exceptions.Exit as done:
        sys.exit(done.exit_code)
    except click.ClickException as error:
        error.show()
        sys.exit(error.exit_code)
    except click.exceptions.Abort:
        click.echo("aborted", err=True)
        sys.exit(Exit.FAILURE)
    except SchedulerError as error:
        click.echo(f"error: {error}", err=True)
        sys.exit(exit_code_for(error))
