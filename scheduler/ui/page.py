"""The status page as a Flask application (`create_app`).

    GET  /                 tasks by tenant and state, the charts, lateness, shards,
                           processes, consumer lag; ?tenant= ?type= narrow it (rows by
                           type then), ?since= 15m|1h|6h|24h sets the charts' span
    GET  /live             the part of / that the page's script fetches again every
                           `refresh_s` (same arguments)
    GET  /api/status       the same status as `scheduler status --json`
    GET  /task?id=ID       a task, its status and the history of its attempts
    POST /task/cancel      cancels a task not finished (form fields: id, token)
    GET  /dead-letters     the dead letters waiting, ?tenant= for one tenant's
    POST /dead-letters/replay  replays one letter (form fields: letter, the name the
                           page gives it (`letters`); token)
    GET  /login, POST /login, POST /logout   with a credentials file (`access`)
    GET  /healthz          "ok"

A backend that fails a request (a server out of reach) answers 503 with what failed.

Flask, because it is small, kept up to date, and brings Jinja's autoescaping templates;
the page itself is server-rendered HTML.

Who may see and do what (`access`): without credentials, anyone who reaches the page
(loopback only) sees everything and the actions answer 403; with them, every page needs
a login, and a tenant's login is narrowed to its tenant on every route: the status is
read for that tenant whatever `?tenant=` says, what adds up every tenant is left out
(`scoped`), another tenant's task answers exactly as a missing one, and another
tenant's letter or task cannot be replayed or cancelled (not found, nothing changed);
a letter is named by an id that says nothing of the other tenants' (`letters`).

What keeps another site open in the same browser from using the page: every form
carries the login's own token, and a POST from another origin is refused; the session
cookie is `SameSite=Strict`; on a loopback address only the loopback host names are
answered (a hostile name re-pointed at 127.0.0.1 gets 400); no page may be framed
(clickjacking), and nothing but the page's own files is loaded. An action's outcome is
kept on the server, named in the address by a random id and shown only to the login
that took it, so a link cannot make the page claim one.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import logging
import secrets
import time
from datetime import UTC, datetime
from typing import Any

from flask import Flask, Response, abort, jsonify, redirect, render_template, request, url_for

from scheduler import retention
from scheduler.errors import InvalidTask, SchedulerError
from scheduler.model import TaskId, decode_payload
from scheduler.ports import StoredTask
from scheduler.replay import NO_SUCH_LETTER
from scheduler.visibility.counts import STATES
from scheduler.visibility.status import Status, status_document
from scheduler.worker.dead_letters import DeadLetter

from .access import NO_CREDENTIALS, Access, check_form, viewer
from .credentials import Credentials
from .letters import LetterNames
from .source import PageSource
from .views import overview

log = logging.getLogger(__name__)

SPANS_MS = {"15m": 15 * 60_000, "1h": 3_600_000, "6h": 6 * 3_600_000, "24h": 24 * 3_600_000}
DEFAULT_SPAN = "1h"
MAX_LETTERS = 200
MAX_NAME_CHARS = 64


def _clock(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _duration(ms: float | None) -> str:
    if ms is None:
        return "-"
    if ms >= 120_000:
        return f"{ms / 60_000:.0f} min"
    return f"{ms / 1000:.1f} s" if ms >= 10_000 else f"{ms:.0f} ms"


LOOPBACK_NAMES = ["localhost", "127.0.0.1", "::1", "[::1]"]
SECURITY_HEADERS = {
    "X-Frame-Options": "DENY",
    "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
    "X-Content-Type-Options": "nosniff",
    "Referrer-Policy": "same-origin",
}
MAX_OUTCOMES = 100


def trusted_hosts(host: str, address: str) -> list[str] | None:
    """The Host names the page answers: on a loopback address the loopback names (and
    `host` as given); elsewhere any (None), since the names it is reached by are not
    known here."""
    if ipaddress.ip_address(address).is_loopback:
        return sorted({*LOOPBACK_NAMES, host})
    return None


def scoped(status: Status, tenant: str | None) -> Status:
    """`status` as a login of `tenant` may see it (None: all of it). The counts, minutes
    and dead tasks are already that tenant's (read narrowed); what is of the whole
    deployment (lateness, shards, processes, consumer lag) is taken out, since it adds up
    the other tenants' tasks."""
    if tenant is None:
        return status
    return dataclasses.replace(status, shards=[], processes=[], consumer_lag={}, lateness_per_minute={})


DEPLOYMENT_WIDE = ("lateness", "shards", "processes", "consumer_lag")
"""The parts of `/api/status` a tenant's login does not get (see `scoped`)."""


def create_app(source: PageSource, *, refresh_s: float = 3.0, title: str = "scheduler",
               hosts: list[str] | None = None, credentials: Credentials | None = None,
               secure_cookie: bool = False) -> Flask:
    """The page for `source`; with `credentials`, every page needs a login (`access`),
    without them it is read-only."""
    app = Flask(__name__)
    if hosts is not None:
        app.config["TRUSTED_HOSTS"] = hosts
    Access(credentials, secure_cookie=secure_cookie).install(app)
    names = LetterNames()
    outcomes: dict[str, tuple[str | None, dict[str, str | None]]] = {}
    app.jinja_env.filters.update(clock=_clock, duration=_duration, num=lambda n: f"{n:,}")
    app.jinja_env.globals.update(STATES=STATES, SPANS=list(SPANS_MS), title=title, refresh_ms=int(refresh_s * 1000),
                                 backend=source.settings.backend, NO_CREDENTIALS=NO_CREDENTIALS)

    def narrowing() -> tuple[str | None, str | None, str]:
        tenant = request.args.get("tenant", "").strip() or None
        type_ = request.args.get("type", "").strip() or None
        span = request.args.get("since", DEFAULT_SPAN)
        if span not in SPANS_MS:
            abort(400, f"since must be one of {', '.join(SPANS_MS)}")
        own = viewer().tenant
        return (own if own is not None else tenant), type_, span

    def live_context() -> dict[str, Any]:
        tenant, type_, span = narrowing()
        status, lag_known = source.status(tenant, type_, SPANS_MS[span])
        return {"view": overview(scoped(status, viewer().tenant)), "lag_known": lag_known, "tenant": tenant,
                "type": type_, "span": span}

    def keep(outcome: dict[str, str | None]) -> str:
        """A key naming `outcome` in the address; only the login that took the action sees it."""
        if len(outcomes) >= MAX_OUTCOMES:
            outcomes.clear()
        key = secrets.token_urlsafe(8)
        outcomes[key] = (viewer().name, outcome)
        return key

    def kept(key: str) -> dict[str, str | None] | None:
        found = outcomes.get(key)
        return found[1] if found is not None and found[0] == viewer().name else None

    def no_task(raw: str, task_id: TaskId) -> tuple[str, int]:
        """A task the store does not have, or of a tenant this login does not see: the
        same answer for both, so a tenant learns nothing of another's tasks."""
        missing = retention.missing_task(task_id, source.store.retention_s, time.time_ns() // 1_000_000)
        return render_template("task.html", raw=raw, error=missing, stored=None, payload=None, history=[],
                               outcome=None), 404

    def of_tenant(letters: list[DeadLetter], tenant: str | None) -> list[DeadLetter]:
        return [letter for letter in letters if tenant is None or letter.tenant == tenant]

    def visible(stored: StoredTask | None) -> bool:
        own = viewer().tenant
        return stored is not None and (own is None or stored.task.tenant == own)

    @app.get("/")
    def index() -> str:
        return render_template("index.html", **live_context())

    @app.get("/live")
    def live() -> str:
        return render_template("_live.html", **live_context())

    @app.get("/api/status")
    def api_status() -> Response:
        tenant, type_, span = narrowing()
        status, _ = source.status(tenant, type_, SPANS_MS[span])
        document = status_document(status)
        if viewer().tenant is not None:
            for key in DEPLOYMENT_WIDE:
                del document[key]
        return jsonify(document)

    @app.get("/task")
    def task() -> tuple[str, int]:
        raw = request.args.get("id", "").strip()
        outcome = kept(request.args.get("outcome", ""))
        if not raw:
            return render_template("task.html", raw=raw, error=None, stored=None, payload=None, history=[],
                                   outcome=None), 200
        try:
            task_id = TaskId.parse(raw)
        except InvalidTask as exc:
            return render_template("task.html", raw=raw, error=str(exc), stored=None, payload=None, history=[],
                                   outcome=None), 400
        stored, history = source.task(task_id)
        if stored is None or not visible(stored):
            return no_task(raw, task_id)
        try:
            payload = repr(decode_payload(stored.task.payload))
        except Exception:  # a payload the SDK did not write: show that, not an error page
            payload = f"<{len(stored.task.payload)} bytes, not msgpack>"
        return render_template("task.html", raw=raw, error=None, stored=stored, payload=payload, history=history,
                               outcome=outcome), 200

    @app.post("/task/cancel")
    def cancel() -> Any:
        who = viewer()
        check_form(who, "a cancel")
        raw = request.form.get("id", "").strip()
        try:
            task_id = TaskId.parse(raw)
        except InvalidTask as exc:
            abort(400, str(exc))
        stored = source.store.get(task_id)
        if stored is None or not visible(stored):
            return no_task(raw, task_id)
        try:
            done = source.cancel(task_id, stored.task.tenant)
            outcome = {"task": str(task_id), "answer": done.value, "problem": None}
            log.info("status page: %s cancelled %s of %s: %s", who.name, task_id, stored.task.tenant, done.value)
        except SchedulerError as exc:
            outcome = {"task": str(task_id), "answer": None, "problem": f"not cancelled: {exc}"}
        return redirect(url_for("task", id=str(task_id), outcome=keep(outcome)), code=303)

    @app.get("/dead-letters")
    def dead_letters() -> str:
        own = viewer().tenant
        tenant = own if own is not None else request.args.get("tenant", "").strip() or None
        letters = source.dead_letters()
        shown = [(names.name(letter), letter) for letter in of_tenant(letters.waiting, tenant)]
        outcome = kept(request.args.get("outcome", ""))
        return render_template("dead_letters.html", letters=letters, shown=shown[:MAX_LETTERS], count=len(shown),
                               tenant=tenant, outcome=outcome, scoped=own is not None)

    @app.post("/dead-letters/replay")
    def replay() -> Any:
        """Replays the letter named (`letters`) among those this login sees: another
        tenant's is not found, as a missing one is."""
        who = viewer()
        check_form(who, "a replay")
        name = request.form.get("letter", "")[:MAX_NAME_CHARS]
        found = names.find(of_tenant(source.dead_letters().waiting, who.tenant), name)
        if found is None:
            return redirect(url_for("dead_letters", outcome=keep({"letter": name, "new": None,
                                                                  "problem": NO_SUCH_LETTER})), code=303)
        try:
            done = source.replay(found.letter)
            outcome = {"letter": name, "new": None if done.new_task_id is None else str(done.new_task_id),
                       "problem": done.problem}
            log.info("status page: %s replayed letter %s (%s on the topic): %s", who.name, name, found.letter,
                     outcome["new"] or done.problem)
        except SchedulerError as exc:
            outcome = {"letter": name, "new": None, "problem": f"not replayed: {exc}"}
        return redirect(url_for("dead_letters", outcome=keep(outcome)), code=303)

    @app.get("/healthz")
    def healthz() -> str:
        return "ok"

    @app.after_request
    def protect(response: Response) -> Response:
        response.headers.update(SECURITY_HEADERS)
        return response

    @app.errorhandler(SchedulerError)
    def unavailable(error: SchedulerError) -> tuple[str, int]:
        """A server out of reach (or a store that fails) is said on the page, as 503, and
        the live part keeps its last numbers, marked stale, until it answers again."""
        return render_template("unavailable.html", error=str(error)), 503

    return app
