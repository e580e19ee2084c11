"""`scheduler status` on the embedded backend against a real dispatcher and worker: the
counts by tenant, type and state, the minutes, lateness and processes equal what the
test made happen (tests/visibility.py). The same on the real servers:
tests/integration/test_status_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dispatchers import Fleet
from tests.status_page import chromium, skip_without_chromium
from tests.support import run_cli
from tests.visibility import run_status_scenario
from tests.workers import Workers


@pytest.mark.timeout(240)
def test_status_and_the_status_page_show_what_happened(embedded: tuple[Fleet, Workers], tmp_path: Path) -> None:
    """`scheduler status`, and the status page in a browser: the same counts, the page
    following live to the end state, a task looked up, a dead letter replayed."""
    fleet, workers = embedded
    final = run_status_scenario(fleet.env, fleet, workers, tmp_path, page=chromium() is not None)
    assert len(final["shards"]) == 64
    skip_without_chromium()  # the status part passed; say that the page's was not checked


def test_status_without_a_store_says_so_and_creates_nothing(tmp_path: Path) -> None:
    db = tmp_path / "none" / "tasks.db"
    result = run_cli("status", env={"SCHEDULER_DB": str(db), "SCHEDULER_BACKEND": "embedded"})
    assert result.returncode == 1
    assert "no embedded store" in result.stderr
    assert not db.parent.exists()


@pytest.mark.parametrize("since", ["0s", "3d", "soon"])
def test_a_bad_since_is_a_usage_error(since: str, tmp_path: Path) -> None:
    result = run_cli("status", "--since", since, env={"SCHEDULER_DB": str(tmp_path / "tasks.db")})
    assert result.returncode == 2, result.stderr
    assert "--since" in result.stderr or "delay" in result.stderr
    assert not (tmp_path / "tasks.db").exists()
