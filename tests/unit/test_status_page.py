"""The status page's parts without a browser: what it computes from a status (rows by
tenant, owners, charts), and its answers to bad requests, over a real embedded store.
The page in a real browser against running processes: tests/embedded/test_status_embedded.py
and tests/integration/test_status_cluster.py."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import timedelta
from pathlib import Path

import pytest
from flask.testing import FlaskClient

import scheduler
from scheduler.connecting import backend_settings
from scheduler.ui.charts import HEIGHT, TOP, Series, line_chart, nice_ceiling
from scheduler.ui.page import create_app
from scheduler.ui.source import PageSource
from scheduler.ui.views import overview, shard_owners, state_rows
from scheduler.visibility.counts import Levels
from scheduler.visibility.status import Lateness, ShardRow, Status

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


def test_a_replay_without_the_page_s_token_is_refused_and_nothing_is_replayed(page: FlaskClient) -> None:
    response = page.post("/dead-letters/replay", data={"letter": "0:0", "token": "guessed"})
    assert response.status_code == 403
    listing = page.get("/dead-letters").get_data(as_text=True)
    assert "0 waiting" in listing and "0 replayed" in listing


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
