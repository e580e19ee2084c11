"""`scheduler dlq list|replay`: the dead letters on the dead-letter topic, and their replay
as new tasks."""

from __future__ import annotations

import json
from contextlib import ExitStack
from datetime import timezone
from pathlib import Path
from typing import Any

import click

from scheduler import backends
from scheduler.cli.options import Exit, backend_settings, store_options
from scheduler.model import from_ms


@click.group()
def dlq() -> None:
    """List and replay dead letters: tasks that failed for good or could not be run."""


def _letters(backend: str, db: Path, options: dict[str, Any]) -> tuple[list[Any], int, int]:
    from scheduler.worker.dead_letters import waiting

    settings = backend_settings(backend, db, **options)
    with backends.open_dead_letters(settings) as (scanner, _):
        deliveries = scanner.scan(settings.kafka.dead_letter_topic)
    letters, replayed, unreadable = waiting(deliveries)
    return letters, len(replayed), unreadable


def _matches(letter: Any, tenant: str | None, type_: str | None) -> bool:
    return (tenant is None or letter.tenant == tenant) and (type_ is None or letter.type == type_)


def _when(ms: int) -> str:
    return from_ms(ms).astimezone(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


@dlq.command("list")
@click.option("--tenant", "tenant", help="Only this tenant's letters.")
@click.option("--type", "type_", help="Only letters of this task type.")
@click.option("--limit", "limit", type=click.IntRange(1), default=100, show_default=True,
              help="Show at most this many letters.")
@click.option("--json", "as_json", is_flag=True, help="One JSON object per line.")
@store_options
def dlq_list(tenant: str | None, type_: str | None, limit: int, as_json: bool, backend: str, db: Path,
             **options: Any) -> None:
    """Show the dead letters not yet replayed, oldest first.

    Each line: the letter's name (partition:offset, for `dlq replay`), when it died,
    tenant, type, task id, attempt, reason, and the last line of the last error (the
    exception; `--json` has all of it).
    """
    letters, replayed, unreadable = _letters(backend, db, options)
    selected = [letter for letter in letters if _matches(letter, tenant, type_)]
    for letter in selected[:limit]:
        if as_json:
            click.echo(json.dumps({
                "letter": letter.letter, "dead_at": _when(letter.dead_at_ms), "tenant": letter.tenant,
                "type": letter.type, "task_id": None if letter.task_id is None else str(letter.task_id),
                "attempt": letter.attempt, "reason": letter.reason, "error": letter.error,
                "source_topic": letter.source_topic,
            }))
        else:
            first_line = (letter.error.strip().splitlines() or [""])[-1][:120]
            click.echo(f"{letter.letter}\t{_when(letter.dead_at_ms)}\t{letter.tenant or '-'}\t{letter.type or '-'}\t"
                       f"{letter.task_id or '-'}\tattempt {letter.attempt}\t{letter.reason}\t{first_line}")
    if not as_json:
        click.echo(f"{len(selected)} waiting ({min(len(selected), limit)} shown), {replayed} replayed"
                   + (f", {unreadable} unreadable records" if unreadable else ""), err=True)


@dlq.command("replay")
@click.argument("letters", nargs=-1)
@click.option("--all", "replay_all", is_flag=True, help="Replay every waiting letter (with --tenant/--type: those).")
@click.option("--tenant", "tenant", help="Only this tenant's letters.")
@click.option("--type", "type_", help="Only letters of this task type.")
@click.option("--dry-run", "dry_run", is_flag=True, help="Say what would be replayed, change nothing.")
@store_options
def dlq_replay(letters: tuple[str, ...], replay_all: bool, tenant: str | None, type_: str | None, dry_run: bool,
               backend: str, db: Path, **options: Any) -> None:
    """Submit dead letters again as new tasks, due now, with a fresh series of attempts.

    Name letters (as `dlq list` shows them) or pass --all. Each replayed letter gets a
    marker on the dead-letter topic, so it is no longer listed and not replayed twice.
    A letter whose message cannot be decoded cannot be replayed and is reported.
    Exits 1 if any named letter was not found or could not be replayed.
    """
    from scheduler.connecting import connect
    from scheduler.replay import replay

    if not letters and not replay_all:
        raise click.UsageError("name the letters to replay (see `scheduler dlq list`) or pass --all")
    settings = backend_settings(backend, db, **options)
    with ExitStack() as stack:
        # A dry run submits nothing: no producer (and no Kafka hand-off) is opened for it.
        client = None if dry_run else stack.enter_context(connect(
            backend=settings.backend, db=settings.db, cassandra=settings.cassandra, kafka=settings.kafka))
        scanner, publisher = stack.enter_context(backends.open_dead_letters(settings))
        outcomes = replay(client, scanner, publisher, settings.kafka.dead_letter_topic, letters,
                          every=replay_all, tenant=tenant, type_=type_, dry_run=dry_run)
    failed = 0
    for outcome in outcomes:
        info = outcome.letter_info
        if not outcome.ok:
            click.echo(f"{outcome.letter}: {outcome.problem}", err=True)
            failed += 1
        elif outcome.new_task_id is None and info is not None:
            click.echo(f"{outcome.letter}: would replay {info.tenant}/{info.type} (was {info.task_id})")
        elif info is not None:
            click.echo(f"{outcome.letter}: replayed as {outcome.new_task_id} (was {info.task_id})")
    if failed:
        raise click.exceptions.Exit(Exit.FAILURE)
