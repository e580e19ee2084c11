"""Who is looking at the status page, and what they may see and do (`Access`).

Without a credentials file the page is read-only: anyone who reaches it (loopback only,
`serving.PageServer` refuses any other address) sees everything and no action is taken.
With one, every page but `/login` and `/healthz` needs a login; a login is kept in
Flask's signed session cookie (`HttpOnly`, `SameSite=Strict`, `Secure` unless the page
listens on loopback, where it is plain http) under a key made at start, so a restart
logs everyone out, and it lasts at most `SESSION_S`. Each login gets its own form token,
which every action (replay, cancel, logout) must carry. A login goes back to the page
first asked for only when that is a path of this page (`_safe_next`).

A failed login is logged with the name tried and the address, never the secret or a
cookie; past `MAX_FAILURES` failures from one address within `FAILURE_WINDOW_S`, that
address is answered 429 without a check until the window has passed.
"""

from __future__ import annotations

import hmac
import logging
import secrets
import threading
import time
from collections import deque
from dataclasses import dataclass
from urllib.parse import unquote, urlsplit

from flask import Flask, abort, g, redirect, render_template, request, session, url_for
from werkzeug.wrappers.response import Response as BaseResponse

from .credentials import Credentials

log = logging.getLogger(__name__)

SESSION_S = 12 * 3600
MAX_FAILURES = 10
FAILURE_WINDOW_S = 300.0
OPEN_ENDPOINTS = {"login", "static", "healthz"}
PAGES = {"index", "task", "dead_letters"}
"""Pages a browser is sent to log in from; the rest (the live part, the JSON, the
actions) answer 401 instead, so the page's script never puts a login form in place."""
NO_CREDENTIALS = ("actions are off: this page was started without --credentials, so no one is known to take them "
                  "(start it with `scheduler ui --credentials FILE`)")


@dataclass(frozen=True)
class Viewer:
    name: str | None
    """None when the page has no credentials (anonymous, read-only)."""
    tenant: str | None
    """The one tenant this viewer sees; None for every tenant."""
    token: str
    """The form token of this login; "" when the viewer may take no action."""

    @property
    def can_act(self) -> bool:
        return self.name is not None


ANONYMOUS = Viewer(None, None, "")


class Throttle:
    """Failed logins per address over the last `window_s`."""

    def __init__(self, limit: int | None = None, window_s: float | None = None) -> None:
        self.limit = MAX_FAILURES if limit is None else limit
        self.window_s = FAILURE_WINDOW_S if window_s is None else window_s
        self._failures: dict[str, deque[float]] = {}
        self._lock = threading.Lock()

    def _recent(self, address: str, now: float) -> deque[float]:
        times = self._failures.setdefault(address, deque())
        while times and now - times[0] > self.window_s:
            times.popleft()
        return times

    def blocked(self, address: str) -> bool:
        with self._lock:
            return len(self._recent(address, time.monotonic())) >= self.limit

    def failed(self, address: str) -> int:
        with self._lock:
            if len(self._failures) > 10_000:  # many addresses: forget the old ones rather than grow
                self._failures.clear()
            times = self._recent(address, time.monotonic())
            times.append(time.monotonic())
            return len(times)


MAX_NEXT_CHARS = 2000
MAX_DECODES = 4


def _safe_next(target: str) -> str:
    """A path of this page to go back to after login (`next`, from the address or the
    form, so anyone's link may set it); anything else goes to the overview, "/".

    Refused: a character that is not printable (a browser drops a tab or newline from an
    address, so `/<TAB>/host` is `//host`, another site; a newline cannot be in a header
    at all), a backslash (a browser reads it as a slash), anything but one slash then a
    character that is neither (so no scheme and no host), and the same once the path is
    percent-decoded (`/%2F/host`, `/%5Chost`, `/%09/host`), so that nothing that decodes
    it again makes it another site's. A query is kept as it came, percent-encoded."""
    if len(target) > MAX_NEXT_CHARS:
        return "/"
    form = target
    for _ in range(MAX_DECODES):
        if not form.isprintable() or "\\" in form or not form.startswith("/") or form[1:2] == "/":
            return "/"
        path = urlsplit(form).path  # one slash first: no scheme, no host
        decoded = unquote(path)
        if decoded == path:
            return target
        form = decoded
    return "/"  # still encoded after MAX_DECODES: no page of this site is named so


class Access:
    def __init__(self, credentials: Credentials | None, *, secure_cookie: bool) -> None:
        self.credentials = credentials
        self.secure_cookie = secure_cookie
        self.throttle = Throttle()

    def install(self, app: Flask) -> None:
        app.secret_key = secrets.token_bytes(32)
        app.config.update(SESSION_COOKIE_NAME="scheduler_page", SESSION_COOKIE_HTTPONLY=True,
                          SESSION_COOKIE_SAMESITE="Strict", SESSION_COOKIE_SECURE=self.secure_cookie)
        app.before_request(self._require_login)
        app.add_url_rule("/login", "login", self._login, methods=["GET", "POST"])
        app.add_url_rule("/logout", "logout", self._logout, methods=["POST"])
        app.jinja_env.globals.update(viewer=viewer, logins=self.credentials is not None)

    def _current(self) -> Viewer | None:
        if self.credentials is None:
            return ANONYMOUS
        name, token, at = session.get("name"), session.get("token"), session.get("at")
        if not isinstance(name, str) or not isinstance(token, str) or not isinstance(at, int | float):
            return None
        credential = self.credentials.get(name)
        if credential is None or not 0 <= time.time() - at <= SESSION_S:
            return None
        return Viewer(name, credential.tenant, token)

    def _require_login(self) -> BaseResponse | None:
        found = self._current()
        if found is not None:
            g.viewer = found
            return None
        g.viewer = ANONYMOUS
        if request.endpoint in OPEN_ENDPOINTS:
            return None
        if request.method == "GET" and request.endpoint in PAGES:
            return redirect(url_for("login", next=request.full_path.rstrip("?")))
        abort(401, "log in first (/login)")

    def _login(self) -> BaseResponse | tuple[str, int]:
        if self.credentials is None:
            abort(404, "this page has no logins: it was started without --credentials")
        target = _safe_next(request.values.get("next", "/"))
        if request.method == "GET":
            return render_template("login.html", next=target, error=None, name=""), 200
        address = request.remote_addr or "?"
        name = request.form.get("name", "").strip()
        if self.throttle.blocked(address):
            log.warning("status page: login as %r from %s refused: too many failed logins", name[:64], address)
            return render_template("login.html", next=target, name=name,
                                   error="too many failed logins from here: wait a few minutes"), 429
        credential = self.credentials.verify(name, request.form.get("secret", ""))
        if credential is None:
            failures = self.throttle.failed(address)
            log.warning("status page: failed login as %r from %s (%d in %d s)", name[:64], address, failures,
                        FAILURE_WINDOW_S)
            return render_template("login.html", next=target, name=name, error="wrong name or secret"), 401
        session.clear()
        session.update(name=credential.name, token=secrets.token_urlsafe(24), at=int(time.time()))
        log.info("status page: %s logged in (%s) from %s", credential.name, credential.scope, address)
        return redirect(target, code=303)

    def _logout(self) -> BaseResponse:
        check_form(viewer())
        session.clear()
        return redirect(url_for("login"), code=303)


def viewer() -> Viewer:
    """Who makes the current request (set before each request by `Access`)."""
    found: Viewer = g.get("viewer", ANONYMOUS)
    return found


def check_form(who: Viewer, action: str = "this action") -> None:
    """Aborts unless `who` may act and the request is a form of this page: 403 without
    credentials, from another origin, or without this login's token."""
    if not who.can_act:
        abort(403, NO_CREDENTIALS)
    origin = request.headers.get("Origin")
    if origin is not None and urlsplit(origin).netloc != request.host:
        abort(403, f"{action} must come from this page, not another site")
    if not hmac.compare_digest(request.form.get("token", "").encode(), who.token.encode()):
        abort(403, "this form is not from this page (reload the page and try again)")
