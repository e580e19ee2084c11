"""`scheduler demo`: results day on this machine (the story is `scheduler.demo`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from scheduler.cli.options import Exit, parse_delay, parse_listen


@click.command()
@click.option("--results", "results", type=click.IntRange(1, 1_000_000), default=20_000, show_default=True,
              help="Result SMS the state board sends.")
@click.option("--batch", "batch", type=click.IntRange(1, 1000), default=250, show_default=True,
              help="SMS per board task (its cost). With two dispatchers each holds half of --sms-rate: a task "
                   "larger than that holds the rate on average, not in every second.")
@click.option("--reminders", "reminders", type=click.IntRange(2, 100_000), default=50, show_default=True,
              help="Exam reminders the college books (one of them to an unreachable number).")
@click.option("--reminder-delay", "reminder_delay", default="30s", show_default=True,
              help="How long after the results the reminders are due (at least 10s): 60, 45s, 2m.")
@click.option("--sms-rate", "sms_rate", type=click.FloatRange(0, 1_000_000), default=500, show_default=True,
              help="The provider's limit in SMS a second, shared by every tenant (`scheduler limits set --global "
                   "--rate`); each board task costs its SMS. 0: no limit.")
@click.option("--lead", "lead", default="10s", show_default=True,
              help="How long after the submit the results are due (at least 3s).")
@click.option("--workers", "workers", type=click.IntRange(2, 16), default=2, show_default=True,
              help="Worker processes (one is killed mid-batch).")
@click.option("--concurrency", "concurrency", type=click.IntRange(1, 64), default=4, show_default=True,
              help="Handler threads per worker.")
@click.option("--backend", "backend", type=click.Choice(["embedded", "local"]), default="embedded",
              show_default=True, help="embedded: SQLite files, no servers. local: the real Cassandra, Kafka and "
              "ZooKeeper (deploy/local, or the servers SCHEDULER_* variables name), in a keyspace, topics and "
              "ZooKeeper root of the demo's own, removed afterwards.")
@click.option("--dir", "directory", type=click.Path(file_okay=False, path_type=Path),
              help="Keep the databases, logs and stats files here (an empty or new directory). Default: a "
              "temporary directory, removed afterwards unless something went wrong.")
@click.option("--keep", "keep", is_flag=True, help="Keep the directory (and with --backend local the keyspace, "
              "topics and ZooKeeper root).")
@click.option("--page-listen", "page_listen", default="127.0.0.1:0", show_default=True,
              help="HOST:PORT of the status page while the demo plays (port 0: any free port; the address is "
              "printed). 'off': no page.")
@click.option("--json", "json_path", type=click.Path(dir_okay=False, path_type=Path),
              help="Also write the summary as a JSON document to this file.")
def demo(results: int, batch: int, reminders: int, reminder_delay: str, sms_rate: float, lead: str, workers: int,
         concurrency: int, backend: str, directory: Path | None, keep: bool, page_listen: str,
         json_path: Path | None) -> None:
    """Play results day on this machine, end to end, in about a minute.

    \b
    A state board's result SMS go out as tasks of --batch, due --lead from now; a college
    books --reminders exam reminders for --reminder-delay later, one of them to a number
    the provider cannot reach (retried with backoff, then dead-lettered). The provider
    takes --sms-rate SMS a second: the board's SMS drain at that limit, and the
    reminders, due while they drain, go out on their time all the same. Two dispatchers
    share the shards and two workers send through a fake SMS provider that refuses to
    send a key twice. A worker is killed (kill -9) in the middle of a batch, and later
    dispatcher-1 with the reminders loaded; the others take over. A live board shows
    every tenant's tasks by status, and the status page (`scheduler ui`) is served at the
    address printed first; the summary reconciles every task and SMS: delivered, lost,
    repeats the provider absorbed, how late handlers started, and what `scheduler status`
    shows beside it.

    Exit status 0 when everything was delivered as it should be, 1 otherwise.
    """
    from rich.console import Console

    from scheduler.demo.outcome import render
    from scheduler.demo.play import DemoOptions, play
    from scheduler.demo.story import Story

    delay_s, lead_s = parse_delay(reminder_delay).total_seconds(), parse_delay(lead).total_seconds()
    if delay_s < 10:
        raise click.BadParameter(f"{reminder_delay!r} is under 10s", param_hint="--reminder-delay")
    if lead_s < 3:
        raise click.BadParameter(f"{lead!r} is under 3s", param_hint="--lead")
    if 0 < sms_rate < 1:
        raise click.BadParameter(f"{sms_rate} is under 1 SMS a second (0 for no limit)", param_hint="--sms-rate")
    page = None if page_listen == "off" else parse_listen(page_listen, "--page-listen")
    options = DemoOptions(Story(results=results, batch=batch, reminders=reminders, reminder_delay_s=delay_s,
                                sms_rate=sms_rate or None),
                          backend=backend, directory=directory, lead_s=lead_s, workers=workers,
                          concurrency=concurrency, keep=keep, page=page)
    console = Console(highlight=False, soft_wrap=True)
    summary = play(options, console)
    for line in render(summary):
        console.print(line)
    if json_path is not None:
        json_path.write_text(json.dumps(summary, indent=2) + "\n")
    if not summary["ok"]:
        raise click.exceptions.Exit(Exit.FAILURE)
