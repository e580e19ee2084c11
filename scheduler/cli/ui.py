"""`scheduler ui`: the status page, served until Ctrl-C or SIGTERM."""

from __future__ import annotations

import signal
import threading
from pathlib import Path
from typing import Any

import click

from scheduler.cli.options import Exit, backend_settings, parse_listen, store_options


@click.command()
@click.option("--listen", "listen", default="127.0.0.1:8470", envvar="SCHEDULER_UI_LISTEN", show_envvar=True,
              show_default=True, help="HOST:PORT to serve on (port 0: any free port; the address is printed). "
              "Loopback by default: the page has no login, and its replay button submits tasks, so expose it "
              "only where the network decides who can reach it.")
@click.option("--refresh", "refresh_s", type=click.FloatRange(1, 300), default=3.0, show_default=True,
              help="Seconds between the page's live updates.")
@store_options
def ui(listen: str, refresh_s: float, backend: str, db: Path, **options: Any) -> None:
    """Serve the status page: tasks by tenant and state with their per-minute rate and
    lateness charts, shards and owners, live processes, consumer lag, the dead letters
    with a replay button, and any task with its attempts by id. It refreshes itself every
    --refresh seconds and reads only what `scheduler status` reads.

    Prints the page's address, then serves until Ctrl-C or SIGTERM. Exit 1 when there is
    no embedded store to read, 2 when the port is taken.
    """
    from scheduler.ui.serving import PageServer

    host, port = parse_listen(listen)
    settings = backend_settings(backend, db, **options)
    if settings.backend == "embedded" and not settings.db.exists():
        click.echo(f"no embedded store at {settings.db}: nothing has been submitted there yet", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    try:
        server = PageServer(settings, host=host, port=port, refresh_s=refresh_s)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise click.BadParameter(f"cannot listen on {host}:{port}: {reason}", param_hint="--listen") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with server:
        click.echo(f"status page at {server.url} (Ctrl-C stops it)")
        try:
            server.wait(stop)
        except KeyboardInterrupt:
            pass
