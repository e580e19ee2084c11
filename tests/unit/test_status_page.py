"""The status page's parts without a browser: what it computes from a status (rows by
tenant, owners, charts), and its answers to bad requests, over a real embedded store.
The page in a real browser against running processes: tests/embedded/test_status_embedded.py
and tests/integration/test_status_cluster.py."""

from __future__ import annotations

import http.client
import re
import time
from collections.abc import Iterator, Sequence
from datetime import timedelta
from pathlib import Path
from typing import cast
from urllib.parse import urlsplit

import pytest
from flask.testing import FlaskClient

import scheduler
from scheduler import backends
from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.connecting import backend_settings
from scheduler.errors import QueueError
from scheduler.model import Task, TaskId, encode_message, encode_payload
from scheduler.ports import Publisher
from scheduler.replay import replay
from scheduler.ui.charts import HEIGHT, TOP, Series, line_chart, nice_ceiling
from scheduler.ui.credentials import add_credential, load
from scheduler.ui.page import create_app, trusted_hosts
from scheduler.ui.serving import PageServer
from scheduler.ui.source import PageSource
from scheduler.ui.views import overview, shard_owners, state_rows
from scheduler.visibility.counts import Levels
from scheduler.visibility.status import Lateness, ShardRow, Status
from scheduler.worker.dead_letters import DeadLetter, encode_dead_letter

NO_LATENESS = {kind: Lateness(kind, 0, None, None, None) for kind in ("fire", "start")}


def status_of(levels: dict[tuple[str, str], Levels], tenant: str | None = None,
              shards: list[ShardRow] | None = None) -> Status:
    return Status(at_ms=0, since_ms=3_600_000, tenant=tenant, type=None, levels=levels,
                  total=Levels(0, 0, 0, 0, 0, 0, 0), per_minute=[(60_000 * m, {"fired": m, "refired": 0, "done": m,
                                                                               "dead": 0}) for m in range(3)],
                  lateness=NO_LATENESS, shards=shards or [], processes=[], stalest_ms=None)


def lv(waiting: int = 0, done: int = 0, dead: int = 0) -> Levels:
    return Levels(waiting, 0, 0, 0, done, dead, 0)


@pytest.mark.parametrize(("value", "ceiling"), [(0, 1), (0.3, 0.5), (1, 1), (7, 10), (11, 20), (123, 200),
                                                (2400, 2500), (25_001, 50_000)])
def test_the_scale_ends_on_a_round_number_at_or_above_the_top(value: float, ceiling: float) -> None:
    assert nice_ceiling(value) == ceiling


def test_a_chart_draws_each_run_of_minutes_and_breaks_where_one_has_no_value() -> None:
    svg = line_chart("late <p99>", [0, 60_000, 120_000, 180_000], [Series("fire", [5, None, 20, 10], "fire")],
                     unit="ms", floor=1)
    assert "late &lt;p99&gt;" in svg and "<p99>" not in svg
    assert svg.count("<circle") == 1 and svg.count("<polyline") == 1  # [5] alone, then [20, 10]
    (points,) = re.findall(r'<polyline class="line fire" points="([^"]+)"', svg)
    ys = [float(p.split(",")[1]) for p in points.split()]
    assert ys[0] == TOP  # 20 is the top of a 0..20 scale
    assert TOP < ys[1] < HEIGHT


def test_tenants_add_up_their_types_and_the_busiest_come_first() -> None:
    status = status_of({("a", "sms"): lv(done=10), ("a", "mail"): lv(waiting=1), ("b", "sms"): lv(waiting=5),
                        ("c", "sms"): lv(done=50)})
    rows = state_rows(status)
    assert [(r.tenant, r.type) for r in rows] == [("b", None), ("a", None), ("c", None)]
    assert rows[1].states["done"] == 10 and rows[1].states["waiting"] == 1


def test_one_tenant_is_shown_by_type() -> None:
    status = status_of({("a", "sms"): lv(done=10), ("a", "mail"): lv(waiting=1)}, tenant="a")
    assert [(r.tenant, r.type) for r in state_rows(status)] == [("a", "mail"), ("a", "sms")]


def test_past_the_row_limit_the_page_says_how_many_more() -> None:
    status = status_of({(f"t{n:03}", "sms"): lv(waiting=n) for n in range(250)})
    view = overview(status, max_rows=100)
    assert len(view.rows) == 100 and view.hidden_rows == 150
    assert view.rows[0].tenant == "t249"


def test_shards_are_grouped_by_owner_with_their_worst_cursor_lag() -> None:
    shards = [ShardRow(0, "d1", 3, 1000, 500), ShardRow(1, "d1", 3, 1000, 900), ShardRow(2, None, None, None, None),
              ShardRow(3, "d2", 4, None, None)]
    owners, unowned = shard_owners(shards)
    assert [(o.owner, o.shards, o.max_lag_ms) for o in owners] == [("d1", [0, 1], 900), ("d2", [3], None)]
    assert unowned == [2]
    view = overview(status_of({}, shards=shards))
    assert (view.colour("d1"), view.colour("d2"), view.colour(None)) == ("0", "1", "x")


@pytest.fixture
def page(tmp_path: Path) -> Iterator[FlaskClient]:
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db) as client:
        client.submit("sms", {}, tenant="acme", delay=timedelta(hours=1))
    with PageSource(backend_settings(backend="embedded", db=db)) as source:
        yield create_app(source).test_client()


def test_the_page_shows_a_waiting_task_counted_at_submit(page: FlaskClient) -> None:
    html = page.get("/").get_data(as_text=True)
    assert re.search(r'data-tenant="acme".*?data-state="waiting"[^>]*>1<', html, re.S)


@pytest.mark.parametrize(("path", "code", "says"), [
    ("/?since=3w", 400, "since must be one of"),
    ("/task?id=nonsense", 400, "is not a task id"),
    ("/task?id=01a244a5-3cd7-766c-b76a-50447abbfbc9", 404, "no task with id"),
])
def test_bad_requests_get_a_clear_answer(page: FlaskClient, path: str, code: int, says: str) -> None:
    response = page.get(path)
    assert response.status_code == code and says in response.get_data(as_text=True)


def park_a_dead_letter(db: Path, tenant: str = "beta") -> TaskId:
    """A dead letter on the embedded dead-letter topic, as a worker parks one; its task's id."""
    settings = backend_settings(backend="embedded", db=db)
    task = Task(TaskId.new(1_796_000_000_000), tenant, "sms", encode_payload({"to": "+91"}), 1_796_000_000_000)
    queue = SqliteQueue(settings.queue_path, handoff_topic=settings.kafka.handoff_topic)
    try:
        publisher = queue.publisher()
        publisher.publish(settings.kafka.dead_letter_topic, [encode_dead_letter(DeadLetter(
            encode_message(task, 1), task.id, task.tenant, task.type, 3, "attempts exhausted", "boom",
            "ready.normal", 1_796_000_001_000))])
        publisher.flush(10)
    finally:
        queue.close()
    return task.id


SECRETS = {"ops": "ops-secret-1", "acme-desk": "acme-secret-2", "beta-desk": "beta-secret-3"}
SCOPES = {"ops": "all", "acme-desk": "tenant:acme", "beta-desk": "tenant:beta"}


@pytest.fixture(scope="module")
def credentials_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("credentials") / "ui-credentials"
    for name, secret in SECRETS.items():
        add_credential(path, name, SCOPES[name], secret)
    return path


def login(client: FlaskClient, name: str, secret: str | None = None) -> None:
    response = client.post("/login", data={"name": name, "secret": SECRETS[name] if secret is None else secret})
    assert response.status_code == 303, response.get_data(as_text=True)


def page_token(client: FlaskClient) -> str:
    found = re.search(r'name="token" value="([^"]+)"', client.get("/dead-letters").get_data(as_text=True))
    assert found, "the dead-letter page has no form"
    return found.group(1)


def letter_name(client: FlaskClient, task_id: TaskId) -> str:
    """The name the dead-letter page gives the letter of `task_id`, as its Replay button sends it."""
    found = re.findall(rf'<tr data-letter="([^"]+)"[^>]* data-task="{task_id}"', client.get("/dead-letters").get_data(
        as_text=True))
    assert len(found) == 1, f"the dead-letter page should list one letter of {task_id}: {found}"
    return str(found[0])


@pytest.fixture
def letter_page(tmp_path: Path, credentials_file: Path) -> Iterator[tuple[FlaskClient, PageSource, TaskId]]:
    """The page with credentials, logged in as `ops` (every tenant), one dead letter of beta's."""
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db):
        pass
    dead = park_a_dead_letter(db)
    with PageSource(backend_settings(backend="embedded", db=db)) as source:
        client = create_app(source, credentials=load(credentials_file)).test_client()
        login(client, "ops")
        yield client, source, dead


def test_a_replay_without_the_page_s_token_is_refused_and_nothing_is_replayed(
        letter_page: tuple[FlaskClient, PageSource, TaskId]) -> None:
    client, source, dead = letter_page
    name = letter_name(client, dead)
    for token in ("guessed", "é"):
        response = client.post("/dead-letters/replay", data={"letter": name, "token": token})
        assert response.status_code == 403
    listing = client.get("/dead-letters").get_data(as_text=True)
    assert f'data-task="{dead}"' in listing and "1 waiting" in listing and "0 replayed" in listing


def test_a_replay_from_another_site_is_refused(letter_page: tuple[FlaskClient, PageSource, TaskId]) -> None:
    client, _, dead = letter_page
    response = client.post("/dead-letters/replay", data={"letter": letter_name(client, dead), "token": page_token(client)},
                           headers={"Origin": "https://evil.example"})
    assert response.status_code == 403
    assert f'data-task="{dead}"' in client.get("/dead-letters").get_data(as_text=True)


def test_a_letter_replayed_twice_is_one_new_task(letter_page: tuple[FlaskClient, PageSource, TaskId]) -> None:
    client, source, dead = letter_page
    token, name = page_token(client), letter_name(client, dead)
    first = client.post("/dead-letters/replay", data={"letter": name, "token": token}, follow_redirects=True)
    page = first.get_data(as_text=True)
    found = re.search(r'data-new-task="([^"]+)"', page)
    assert found and f'data-task="{dead}"' not in page
    stored = source.store.get(TaskId.parse(found.group(1)))
    assert stored is not None and (stored.task.tenant, stored.task.type) == ("beta", "sms")
    again = client.post("/dead-letters/replay", data={"letter": name, "token": token}, follow_redirects=True)
    assert "no such waiting letter" in again.get_data(as_text=True)
    assert "1 replayed" in again.get_data(as_text=True)


def test_a_marker_that_cannot_be_written_says_the_task_was_submitted(tmp_path: Path) -> None:
    """The new task is kept and named; the letter stays listed, with a warning not to
    replay it again (a failed flush of the real embedded publisher)."""
    db = tmp_path / "tasks.db"
    dead = park_a_dead_letter(db)
    settings = backend_settings(backend="embedded", db=db)

    class FailingFlush:
        def __init__(self, real: Publisher) -> None:
            self.real = real

        def publish(self, topic: str, messages: Sequence[bytes], key: bytes | None = None) -> None:
            self.real.publish(topic, messages)

        def flush(self, timeout_s: float) -> None:
            raise QueueError("the queue did not take the marker")

    with scheduler.connect(backend="embedded", db=db) as client, backends.open_dead_letters(settings) as (
            scanner, publisher):
        (outcome,) = replay(client, scanner, cast(Publisher, FailingFlush(publisher)),
                            settings.kafka.dead_letter_topic, ["0:0"])
        assert outcome.new_task_id is not None and client.get(outcome.new_task_id) is not None
        assert outcome.problem is not None and "do not replay it again" in outcome.problem
    assert outcome.letter_info is not None and outcome.letter_info.task_id == dead


def test_on_loopback_only_loopback_names_are_answered(tmp_path: Path) -> None:
    """A hostile name re-pointed at 127.0.0.1 (DNS rebinding) gets 400; every answer
    forbids framing."""
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db):
        pass
    with PageSource(backend_settings(backend="embedded", db=db)) as source:
        app = create_app(source, hosts=trusted_hosts("127.0.0.1", "127.0.0.1"))
        ok = app.test_client().get("/healthz", base_url="http://127.0.0.1:8470")
        assert ok.status_code == 200 and ok.headers["X-Frame-Options"] == "DENY"
        assert "frame-ancestors 'none'" in ok.headers["Content-Security-Policy"]
        assert app.test_client().get("/healthz", base_url="http://localhost:8470").status_code == 200
        assert app.test_client().get("/healthz", base_url="http://evil.example:8470").status_code == 400
    assert trusted_hosts("0.0.0.0", "0.0.0.0") is None


def test_a_store_that_fails_is_said_on_the_page_as_503(tmp_path: Path) -> None:
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db):
        pass
    with PageSource(backend_settings(backend="embedded", db=db)) as source:
        client = create_app(source).test_client()
        source.store.close()  # every read of it now fails
        response = client.get("/task?id=01a244a5-3cd7-766c-b76a-50447abbfbc9")
        assert response.status_code == 503
        assert "cannot be read now" in response.get_data(as_text=True)


@pytest.mark.timeout(60)
def test_the_server_stops_with_a_browser_s_connection_open(tmp_path: Path) -> None:
    """`localhost` (which can name two addresses) is served on one; `close()` ends an open
    keep-alive connection and the request threads, then closes the stores."""
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db):
        pass
    server = PageServer(backend_settings(backend="embedded", db=db), host="localhost", port=0).start()
    try:
        connection = http.client.HTTPConnection(urlsplit(server.url).hostname or "", server.port, timeout=10)
        connection.request("GET", "/healthz")
        response = connection.getresponse()
        assert response.status == 200 and response.read() == b"ok"
    finally:
        began = time.monotonic()
        server.close()
    assert time.monotonic() - began < 5
    assert not server._thread.is_alive()
    connection.close()


def test_an_address_that_names_nothing_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="names no address"):
        PageServer(backend_settings(backend="embedded", db=tmp_path / "tasks.db"), host="no-such-host.invalid")
