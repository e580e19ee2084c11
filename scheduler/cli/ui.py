"""`scheduler ui`: the status page, served until Ctrl-C or SIGTERM; `scheduler ui
add-credential`: a line for its credentials file."""

from __future__ import annotations

import signal
import sys
import threading
from pathlib import Path
from typing import Any

import click

from scheduler.cli.options import Exit, backend_settings, parse_listen, store_options

CREDENTIALS_ENV = "SCHEDULER_UI_CREDENTIALS"


@click.group(invoke_without_command=True)
@click.option("--listen", "listen", default="127.0.0.1:8470", envvar="SCHEDULER_UI_LISTEN", show_envvar=True,
              show_default=True, help="HOST:PORT to serve on (port 0: any free port; the address is printed). "
              "An address that is not loopback needs --credentials, and HTTPS in front of the page (its login "
              "cookie is Secure there).")
@click.option("--credentials", "credentials_path", type=click.Path(dir_okay=False, path_type=Path),
              envvar=CREDENTIALS_ENV, show_envvar=True,
              help="File of the credentials that may log in (`scheduler ui add-credential` writes its lines). "
              "With it every page needs a login, and replay and cancel are allowed, a tenant's credential "
              "seeing and acting on that tenant only; without it the page is read-only.")
@click.option("--refresh", "refresh_s", type=click.FloatRange(1, 300), default=3.0, show_default=True,
              help="Seconds between the page's live updates.")
@store_options
@click.pass_context
def ui(ctx: click.Context, /, listen: str, credentials_path: Path | None, refresh_s: float, backend: str, db: Path,
       **options: Any) -> None:
    """Serve the status page: tasks by tenant and state with their per-minute rate and
    lateness charts, shards and owners, live processes, consumer lag, the dead letters
    with a replay button, and any task with its attempts by id, with a cancel button. It
    refreshes itself every --refresh seconds and reads only what `scheduler status` reads.

    Prints the page's address, then serves until Ctrl-C or SIGTERM. Exit 1 when there is
    no embedded store to read, 2 when the port is taken, the address is not loopback and
    there is no --credentials, or the credentials file cannot be used.
    """
    if ctx.invoked_subcommand is not None:
        return
    from scheduler.ui.credentials import CredentialsError, load
    from scheduler.ui.serving import PageServer

    host, port = parse_listen(listen)
    credentials = None
    if credentials_path is not None:
        try:
            credentials = load(credentials_path)
        except CredentialsError as exc:
            raise click.BadParameter(str(exc), param_hint="--credentials") from None
    settings = backend_settings(backend, db, **options)
    if settings.backend == "embedded" and not settings.db.exists():
        click.echo(f"no embedded store at {settings.db}: nothing has been submitted there yet", err=True)
        raise click.exceptions.Exit(Exit.FAILURE)
    try:
        server = PageServer(settings, host=host, port=port, refresh_s=refresh_s, credentials=credentials)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise click.BadParameter(f"cannot listen on {host}:{port}: {reason}", param_hint="--listen") from None
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda signum, frame: stop.set())
    with server:
        logins = "" if credentials is None else f"; {len(credentials)} credential(s) may log in"
        click.echo(f"status page at {server.url} (Ctrl-C stops it){logins}")
        try:
            server.wait(stop)
        except KeyboardInterrupt:
            pass


@ui.command("add-credential")
@click.argument("name")
@click.option("--scope", "scope", required=True,
              help="`all` (every tenant, any replay or cancel) or `tenant:NAME` (that tenant's tasks and letters "
                   "only).")
@click.option("--credentials", "credentials_path", type=click.Path(dir_okay=False, path_type=Path), required=True,
              envvar=CREDENTIALS_ENV, show_envvar=True, help="The credentials file (made, mode 600, when missing).")
@click.option("--secret-stdin", "secret_stdin", is_flag=True,
              help="Read the secret from the first line of standard input instead of making one.")
def add_credential(name: str, scope: str, credentials_path: Path, secret_stdin: bool) -> None:
    """Add the credential NAME to the page's credentials file: a random secret is made
    and printed once on standard output (or read with --secret-stdin), and only its
    salted hash is written. Exit 2 when the name is taken, the scope unknown or the file
    cannot be used."""
    from scheduler.ui.credentials import CredentialsError, new_secret
    from scheduler.ui.credentials import add_credential as add

    secret = sys.stdin.readline().rstrip("\r\n") if secret_stdin else new_secret()
    try:
        credential = add(credentials_path, name, scope, secret)
    except CredentialsError as exc:
        raise click.UsageError(str(exc)) from None
    click.echo(f"added {credential.name} ({credential.scope}) to {credentials_path}", err=True)
    if not secret_stdin:
        click.echo(secret)
