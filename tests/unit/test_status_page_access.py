"""Who may see and do what on the status page (`scheduler.ui.access`), with Flask's test
client over a real embedded store and dead-letter topic: read-only without credentials,
a login for every page with them, a tenant's login seeing and acting on its own tenant
only, and nothing changed by an action refused. `scheduler ui` refusing to start:
tests/unit/test_ui_credentials.py; in a browser: tests/embedded/test_status_page_login.py."""

from __future__ import annotations

import http.client
import logging
import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from urllib.parse import urlencode

import pytest
from flask import Flask
from flask.testing import FlaskClient

import scheduler
from scheduler.connecting import backend_settings
from scheduler.model import TaskId
from scheduler.ports import TaskStatus
from scheduler.ui import access
from scheduler.ui.credentials import load
from scheduler.ui.page import create_app
from scheduler.ui.serving import PageServer
from scheduler.ui.source import PageSource
from tests.unit.test_status_page import (
    SECRETS,
    credentials_file,
    letter_name,
    login,
    page_token,
    park_a_dead_letter,
)

__all__ = ["credentials_file"]  # a fixture, used by name


@dataclass
class World:
    """Two tenants' tasks and dead letters in one embedded store, and the page's source on it."""

    source: PageSource
    acme_task: TaskId
    beta_task: TaskId
    acme_dead: TaskId
    beta_dead: TaskId

    def app(self, credentials: Path | None = None, secure_cookie: bool = False) -> Flask:
        return create_app(self.source, credentials=None if credentials is None else load(credentials),
                          secure_cookie=secure_cookie)

    def place_of(self, task_id: TaskId) -> str:
        """Where the letter of `task_id` sits on the topic (`partition:offset`)."""
        (letter,) = [x.letter for x in self.source.dead_letters().waiting if x.task_id == task_id]
        return letter

    def status(self, task_id: TaskId) -> TaskStatus:
        stored = self.source.store.get(task_id)
        assert stored is not None
        return stored.status


@pytest.fixture
def world(tmp_path: Path) -> Iterator[World]:
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db) as client:
        acme = client.submit("sms", {}, tenant="acme", delay=timedelta(hours=1))
        client.submit("sms", {}, tenant="acme", delay=timedelta(hours=1))
        beta = client.submit("mail", {}, tenant="beta", delay=timedelta(hours=1))
    acme_dead, beta_dead = park_a_dead_letter(db, "acme"), park_a_dead_letter(db, "beta")
    with PageSource(backend_settings(backend="embedded", db=db)) as source:
        yield World(source, acme, beta, acme_dead, beta_dead)


def text(client: FlaskClient, path: str) -> str:
    response = client.get(path)
    assert response.status_code == 200, (path, response.status_code)
    return response.get_data(as_text=True)


def tenants_shown(html: str) -> set[str]:
    return set(re.findall(r'<tr data-tenant="([^"]+)"', html))


# Without credentials: read-only.

def test_without_credentials_everything_is_seen_and_no_action_is_taken(world: World) -> None:
    client = world.app().test_client()
    assert tenants_shown(text(client, "/")) == {"acme", "beta"}
    letters = text(client, "/dead-letters")
    assert f'data-task="{world.beta_dead}"' in letters and f'data-task="{world.acme_dead}"' in letters
    assert "Replay</button>" not in letters and "--credentials" in letters
    task_page = text(client, f"/task?id={world.acme_task}")
    assert 'id="cancel"' not in task_page and "--credentials" in task_page

    replayed = client.post("/dead-letters/replay", data={"letter": letter_name(client, world.beta_dead), "token": ""})
    assert replayed.status_code == 403 and "--credentials" in replayed.get_data(as_text=True)
    cancelled = client.post("/task/cancel", data={"id": str(world.acme_task), "token": ""})
    assert cancelled.status_code == 403 and "--credentials" in cancelled.get_data(as_text=True)
    assert len(world.source.dead_letters().waiting) == 2
    assert world.status(world.acme_task) is TaskStatus.SCHEDULED
    assert client.get("/login").status_code == 404


# With credentials: a login for everything.

def test_with_credentials_every_page_needs_a_login(world: World, credentials_file: Path) -> None:
    client = world.app(credentials_file).test_client()
    first = client.get("/?since=15m")
    assert first.status_code == 302 and first.headers["Location"].startswith("/login?next=")
    assert client.get(f"/task?id={world.beta_task}").status_code == 302
    for path in ("/live", "/api/status"):  # the page's script and scripts get 401, not a login form
        assert client.get(path).status_code == 401
    assert client.get("/healthz").status_code == 200 and client.get("/login").status_code == 200
    letter = world.place_of(world.beta_dead)
    assert client.post("/dead-letters/replay", data={"letter": letter, "token": ""}).status_code == 401
    assert client.post("/task/cancel", data={"id": str(world.beta_task), "token": ""}).status_code == 401
    assert len(world.source.dead_letters().waiting) == 2 and world.status(world.beta_task) is TaskStatus.SCHEDULED

    back = client.post("/login", data={"name": "ops", "secret": SECRETS["ops"], "next": "/?since=15m"})
    assert back.status_code == 303 and back.headers["Location"] == "/?since=15m"
    assert tenants_shown(text(client, "/")) == {"acme", "beta"}


def test_a_wrong_secret_or_name_logs_nobody_in_and_the_secret_is_not_logged(
        world: World, credentials_file: Path, caplog: pytest.LogCaptureFixture) -> None:
    client = world.app(credentials_file).test_client()
    with caplog.at_level(logging.INFO, logger="scheduler.ui"):
        for name, secret in (("ops", "guessed-secret-x"), ("nobody", SECRETS["ops"]), ("ops", "")):
            response = client.post("/login", data={"name": name, "secret": secret})
            assert response.status_code == 401 and "wrong name or secret" in response.get_data(as_text=True)
            assert "Set-Cookie" not in response.headers
            assert client.get("/").status_code == 302
    logged = caplog.text
    assert "failed login as 'ops'" in logged and "failed login as 'nobody'" in logged
    assert "guessed-secret-x" not in logged and SECRETS["ops"] not in logged


def test_past_the_failure_limit_an_address_is_refused_even_with_the_right_secret(
        world: World, credentials_file: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(access, "MAX_FAILURES", 3)
    client = world.app(credentials_file).test_client()
    for _ in range(3):
        assert client.post("/login", data={"name": "ops", "secret": "wrong"}).status_code == 401
    refused = client.post("/login", data={"name": "ops", "secret": SECRETS["ops"]})
    assert refused.status_code == 429 and client.get("/").status_code == 302


@pytest.mark.parametrize("secure", [False, True])
def test_the_session_cookie_is_http_only_same_site_strict_and_secure_off_loopback(
        world: World, credentials_file: Path, secure: bool) -> None:
    client = world.app(credentials_file, secure_cookie=secure).test_client()
    response = client.post("/login", data={"name": "ops", "secret": SECRETS["ops"]})
    cookie = response.headers["Set-Cookie"]
    assert "HttpOnly" in cookie and "SameSite=Strict" in cookie
    assert ("Secure" in cookie) is secure
    assert SECRETS["ops"] not in cookie


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory, credentials_file: Path) -> Iterator[PageServer]:
    """The page as `scheduler ui --credentials` serves it (waitress, on a free loopback port)."""
    db = tmp_path_factory.mktemp("served") / "tasks.db"
    with scheduler.connect(backend="embedded", db=db):
        pass
    with PageServer(backend_settings(backend="embedded", db=db), credentials=load(credentials_file)) as server:
        yield server


def over_http(server: PageServer, method: str, path: str, form: dict[str, str] | None = None
              ) -> tuple[int, str | None, str]:
    """One request on its own connection: the status, the Location header and the body."""
    connection = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    try:
        body = None if form is None else urlencode(form)
        headers = {} if form is None else {"Content-Type": "application/x-www-form-urlencoded"}
        connection.request(method, path, body, headers)
        response = connection.getresponse()
        return response.status, response.getheader("Location"), response.read().decode()
    finally:
        connection.close()


REFUSED_NEXT = [
    "/\t/evil.example/", "/\n/evil.example/", "/\r/evil.example/", "/\r\n/evil.example/", "/\x00/evil.example/",
    "\t//evil.example/", "/\x0b/evil.example/", "/\x0c/evil.example/", "/\x1f/evil.example/", "/\x7f/evil.example/",
    "/\x85/evil.example/", "/\u2028/evil.example/", "/\\evil.example", "\\/evil.example", "/\\/evil.example",
    "//evil.example/", "///evil.example/", "http://evil.example/", "https://evil.example/x", "HTTP:evil.example",
    "javascript:alert(1)", " /evil.example", "evil.example", "/%2F/evil.example/", "%2F%2Fevil.example/",
    "/%09/evil.example/", "/%0A/evil.example/", "/%5Cevil.example", "/%5C/evil.example", "/%252F/evil.example/",
    "/" + "a" * 5000, "",
]
"""`next` values the login refuses, going back to the overview instead: control
characters, backslashes, another host or scheme, the same percent-encoded, too long."""


@pytest.mark.parametrize("target", REFUSED_NEXT, ids=lambda target: ascii(target)[:40])
def test_after_login_only_a_path_of_this_page_is_gone_back_to(served: PageServer, target: str) -> None:
    """Whatever `next` says, the login form carries, and the login answers, a path of
    this page: a browser drops a tab or newline from an address (`/<TAB>/host` is
    `//host`, another site), reads a backslash as a slash, and a newline cannot be in a
    header at all (it was a 500)."""
    status, _, html = over_http(served, "GET", "/login?" + urlencode({"next": target}))
    assert status == 200
    assert re.findall(r'name="next" value="([^"]*)"', html) == ["/"], target
    status, location, _ = over_http(served, "POST", "/login",
                                    {"name": "ops", "secret": SECRETS["ops"], "next": target})
    assert (status, location) == (303, "/"), target


@pytest.mark.parametrize("target", ["/?tenant=acme&since=15m", "/task?id=01a244a5-3cd7-766c-b76a-50447abbfbc9",
                                    "/dead-letters?tenant=a%2Fb", "/"])
def test_after_login_a_path_of_this_page_with_its_query_is_gone_back_to(served: PageServer, target: str) -> None:
    status, _, html = over_http(served, "GET", "/login?" + urlencode({"next": target}))
    assert status == 200
    assert re.findall(r'name="next" value="([^"]*)"', html) == [target.replace("&", "&amp;")]
    status, location, _ = over_http(served, "POST", "/login",
                                    {"name": "ops", "secret": SECRETS["ops"], "next": target})
    assert (status, location) == (303, target)


def test_a_page_asked_for_before_login_is_gone_back_to_after_it(served: PageServer) -> None:
    status, location, _ = over_http(served, "GET", "/dead-letters?tenant=acme")
    assert status == 302 and location is not None and location.startswith("/login?next=")
    status, _, html = over_http(served, "GET", location)
    (target,) = re.findall(r'name="next" value="([^"]*)"', html)
    assert target == "/dead-letters?tenant=acme"
    status, location, _ = over_http(served, "POST", "/login",
                                    {"name": "ops", "secret": SECRETS["ops"], "next": target})
    assert (status, location) == (303, "/dead-letters?tenant=acme")


def test_logout_needs_the_form_token_and_ends_the_session(world: World, credentials_file: Path) -> None:
    client = world.app(credentials_file).test_client()
    login(client, "ops")
    assert client.post("/logout", data={"token": "guessed"}).status_code == 403
    assert client.get("/").status_code == 200
    assert client.post("/logout", data={"token": page_token(client)}).status_code == 303
    assert client.get("/").status_code == 302


# A tenant's login: its own tenant only.

def test_a_tenant_s_login_sees_only_its_tenant(world: World, credentials_file: Path) -> None:
    client = world.app(credentials_file).test_client()
    login(client, "acme-desk")
    for path in ("/", "/?tenant=beta", "/live", "/live?tenant=beta"):
        html = text(client, path)
        assert tenants_shown(html) == {"acme"}, path
        assert 'id="processes"' not in html and 'id="owners"' not in html and 'id="lateness"' not in html
        assert "deployment-hidden" in html
    document = client.get("/api/status?tenant=beta").get_json()
    assert {row["tenant"] for row in document["counts"]} == {"acme"}
    assert document["total"]["waiting"] == 2
    assert not {"shards", "processes", "lateness", "consumer_lag"} & set(document)

    letters = text(client, "/dead-letters?tenant=beta")
    assert f'data-task="{world.acme_dead}"' in letters and f'data-task="{world.beta_dead}"' not in letters
    assert "replayed" not in letters.split('id="letter-count"')[1].split("</p>")[0]  # the topic's totals are not its own

    assert 'id="cancel"' in text(client, f"/task?id={world.acme_task}")
    other = client.get(f"/task?id={world.beta_task}")
    missing = client.get(f"/task?id={TaskId.new(world.beta_task.run_at_ms)}")
    assert other.status_code == missing.status_code == 404
    said = re.search(r'id="task-error">no task with id [^<]+<', other.get_data(as_text=True))
    assert said and "mail" not in other.get_data(as_text=True)


def test_a_tenant_s_login_sees_letter_names_that_say_nothing_of_other_tenants(
        world: World, credentials_file: Path) -> None:
    """One topic holds every tenant's letters: a letter's place on it (`partition:offset`)
    would tell acme that beta's letter exists and died after its own. The page names a
    letter by an id keyed by a secret of the page, so no place is shown to a tenant, and
    the same letter is named differently by another page (nothing is computed from the
    place alone)."""
    places = {world.place_of(world.acme_dead), world.place_of(world.beta_dead)}
    assert places == {"0:0", "0:1"}  # acme's died first, beta's after
    app = world.app(credentials_file)
    acme, beta, ops = app.test_client(), app.test_client(), app.test_client()
    for client, name in ((acme, "acme-desk"), (beta, "beta-desk"), (ops, "ops")):
        login(client, name)
    html = text(acme, "/dead-letters")
    shown = re.findall(r'<tr data-letter="([^"]+)"', html)
    assert shown == [letter_name(acme, world.acme_dead)]
    assert re.fullmatch(r"[0-9a-f]{16}", shown[0]), shown
    for place in places:
        assert f'"{place}"' not in html and f">{place}<" not in html, place
    assert "data-place" not in html and "on the topic" not in html
    again = world.app(credentials_file).test_client()
    login(again, "acme-desk")
    assert letter_name(again, world.acme_dead) != shown[0]

    # An all-tenants login sees every letter's place too, to name it to `scheduler dlq`.
    every = text(ops, "/dead-letters")
    assert sorted(re.findall(r'data-place="([^"]+)"', every)) == sorted(places)
    assert letter_name(ops, world.beta_dead) == letter_name(beta, world.beta_dead)


def test_a_tenant_s_login_cannot_replay_or_cancel_another_tenant_s(world: World, credentials_file: Path) -> None:
    """Another tenant's letter, by its name on the page or its place on the topic, is not
    found, exactly as a name never given is; nothing is replayed."""
    app = world.app(credentials_file)
    client, beta = app.test_client(), app.test_client()
    login(client, "acme-desk")
    login(beta, "beta-desk")
    token = page_token(client)
    answers = []
    for name in (letter_name(beta, world.beta_dead), world.place_of(world.beta_dead), "0" * 16):
        replayed = client.post("/dead-letters/replay", data={"letter": name, "token": token})
        assert replayed.status_code == 303
        page = text(client, replayed.headers["Location"]).replace(name, "NAME")
        found = re.search(r'id="replay-result">([^<]*)<', page)
        assert found is not None, page
        answers.append(found.group(1))
    assert answers == ["NAME: no such waiting letter (already replayed, or never there)"] * 3
    cancelled = client.post("/task/cancel", data={"id": str(world.beta_task), "token": token})
    assert cancelled.status_code == 404 and "no task with id" in cancelled.get_data(as_text=True)
    assert [x.task_id for x in world.source.dead_letters().waiting] == [world.acme_dead, world.beta_dead]
    assert world.status(world.beta_task) is TaskStatus.SCHEDULED
    assert world.source.dead_letters().replayed == 0


def test_a_tenant_s_login_replays_and_cancels_its_own(world: World, credentials_file: Path) -> None:
    client = world.app(credentials_file).test_client()
    login(client, "acme-desk")
    token = page_token(client)
    done = client.post("/task/cancel", data={"id": str(world.acme_task), "token": token}, follow_redirects=True)
    page = done.get_data(as_text=True)
    assert done.status_code == 200 and 'data-answer="cancelled"' in page
    assert 'id="cancel"' not in page  # a cancelled task is finished: no button
    assert world.status(world.acme_task) is TaskStatus.CANCELLED
    assert world.status(world.beta_task) is TaskStatus.SCHEDULED

    replayed = client.post("/dead-letters/replay", data={"letter": letter_name(client, world.acme_dead),
                                                         "token": token}, follow_redirects=True)
    found = re.search(r'data-new-task="([^"]+)"', replayed.get_data(as_text=True))
    assert found
    new = world.source.store.get(TaskId.parse(found.group(1)))
    assert new is not None and new.task.tenant == "acme"
    assert [x.task_id for x in world.source.dead_letters().waiting] == [world.beta_dead]


def test_an_all_tenants_login_cancels_any_tenant_s_task_and_says_a_second_cancel(
        world: World, credentials_file: Path) -> None:
    app = world.app(credentials_file)
    client = app.test_client()
    login(client, "ops")
    token = page_token(client)
    first = client.post("/task/cancel", data={"id": str(world.beta_task), "token": token})
    assert first.status_code == 303
    assert world.status(world.beta_task) is TaskStatus.CANCELLED
    assert 'data-answer="cancelled"' in text(client, first.headers["Location"])
    # The outcome is the login's own: another login given the address does not see it.
    other = app.test_client()
    login(other, "beta-desk")
    assert "cancel-result" not in text(other, first.headers["Location"])
    again = client.post("/task/cancel", data={"id": str(world.beta_task), "token": token}, follow_redirects=True)
    assert 'data-answer="already cancelled"' in again.get_data(as_text=True)


def test_a_cancel_needs_this_login_s_token_and_this_page_s_origin(world: World, credentials_file: Path) -> None:
    app = world.app(credentials_file)
    client = app.test_client()
    login(client, "ops")
    assert client.post("/task/cancel", data={"id": str(world.acme_task), "token": "guessed"}).status_code == 403
    elsewhere = client.post("/task/cancel", data={"id": str(world.acme_task), "token": page_token(client)},
                            headers={"Origin": "https://evil.example"})
    assert elsewhere.status_code == 403
    other = app.test_client()  # another session's token is not this one's
    login(other, "acme-desk")
    assert client.post("/task/cancel", data={"id": str(world.acme_task), "token": page_token(other)}).status_code == 403
    assert world.status(world.acme_task) is TaskStatus.SCHEDULED
