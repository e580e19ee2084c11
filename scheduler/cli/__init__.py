"""The `scheduler` command: the top-level group, assembled here from the command modules,
and `main`, which turns the scheduler's errors into exit codes.

    options.py       what the commands share: backend options, value parsers, `Exit`
    schema.py        schema show|apply
    tasks.py         submit, get, cancel
    dispatcher.py    dispatcher
    worker.py        worker
    dead_letters.py  dlq list|replay
    limits.py        limits set|show|reset
    retention.py     retention show|set
    schedules.py     schedule add|list|pause|resume|delete|preview
    workflows.py     workflow submit|show|cancel
    status.py        status
    ui.py            ui (the status page)
    demo.py          demo

A command's options become settings in its module; `backends` opens the adapters, and
producers come from `scheduler.connect`, as applications get theirs. The command
modules import what they share from `options`, never from here.
"""

from __future__ import annotations

import sys

import click

from scheduler import __version__
from scheduler.cli import (
    dead_letters,
    demo,
    dispatcher,
    limits,
    retention,
    schedules,
    schema,
    status,
    tasks,
    ui,
    worker,
    workflows,
)
from scheduler.cli.options import Exit
from scheduler.errors import (
    ConfigError,
    CoordinatorUnavailable,
    InvalidTask,
    QueueUnavailable,
    SchedulerError,
    SchemaConflict,
    StoreUnavailable,
)

__all__ = ["Exit", "cli", "exit_code_for", "main"]


@click.group(context_settings={"help_option_names": ["-h", "--help"], "max_content_width": 100})
@click.version_option(__version__, prog_name="scheduler")
def cli() -> None:
    """A distributed task scheduler: tasks stored in Cassandra, leased shards in ZooKeeper,
    due tasks published to Kafka. `scheduler demo` runs on one machine with no servers."""


for command in (schema.schema, tasks.submit, tasks.get, tasks.cancel, dispatcher.dispatcher, worker.worker,
                dead_letters.dlq, limits.limits, retention.retention, schedules.schedule, workflows.workflow, status.status, ui.ui,
                demo.demo):
    cli.add_command(command)


def exit_code_for(error: SchedulerError) -> Exit:
    if isinstance(error, SchemaConflict):
        return Exit.CONFLICT
    if isinstance(error, StoreUnavailable | QueueUnavailable | CoordinatorUnavailable):
        return Exit.UNAVAILABLE
    if isinstance(error, ConfigError | InvalidTask):
        return Exit.USAGE
    return Exit.FAILURE


def main(argv: list[str] | None = None) -> None:
    """Console entry point: runs the CLI and turns scheduler errors into exit codes."""
    try:
        code = cli.main(args=argv, prog_name="scheduler", standalone_mode=False)
        if isinstance(code, int):  # a command's click.exceptions.Exit, returned in this mode
            sys.exit(code)
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
