"""`scheduler demo` end to end on the embedded backend, as a new user runs it (a small
story, so it takes about half a minute): its summary says everything was delivered,
and the document behind it agrees count by count; bad flags are usage errors."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import Exit
from tests.support import run_cli

SMALL = ("--results", "1500", "--batch", "300", "--reminders", "8", "--reminder-delay", "12s", "--lead", "4s",
         "--sms-rate", "300")


def check_small_story(summary: dict[str, Any]) -> None:
    assert summary["ok"], summary
    assert summary["tasks"] == {"submitted": 5 + 8, "as_expected": 13, "lost": 0, "not_as_expected": []}
    assert summary["sms"]["expected"] == summary["sms"]["delivered"] == 1500 + 7
    assert summary["sms"]["missing"] == summary["sms"]["unexpected"] == 0
    assert summary["tenants"]["state-board"]["done"] == 5
    assert (summary["tenants"]["city-college"]["done"], summary["tenants"]["city-college"]["dead"]) == (7, 1)
    (letter,) = summary["dead_letters"]
    assert (letter["tenant"], letter["type"], letter["attempt"]) == ("city-college", "reminder", 3)
    assert "unreachable" in letter["error"]
    events = [event["what"] for event in summary["events"]]
    assert any(what.startswith("dispatcher-1 killed (kill -9)") for what in events), events
    assert any("reowned_after_s" in event for event in summary["events"]), events
    # Every handler start is counted; those beyond the first are re-runs the provider absorbed.
    assert summary["handler_runs"]["total"] >= 13
    fairness = summary["fairness"]
    assert fairness["sms_rate_limit"] == 300 and fairness["reminders"] >= 8
    assert fairness["board_sms_per_s"] is not None


@pytest.mark.timeout(150)
def test_a_small_demo_delivers_everything_and_says_so(tmp_path: Path) -> None:
    out = tmp_path / "summary.json"
    result = run_cli("demo", *SMALL, "--json", str(out), "--dir", str(tmp_path / "run"),
                     timeout_s=140)
    assert result.returncode == Exit.OK, result.stdout + result.stderr
    assert "all delivered, none lost: 13 of 13 tasks ended as expected" in result.stdout
    assert "the other dispatcher holds all 64 shards" in result.stdout
    check_small_story(json.loads(out.read_text()))
    assert not any(line.startswith("Traceback") for line in result.stdout.splitlines())


@pytest.mark.parametrize(("args", "says"), [
    (("--reminder-delay", "5s"), "under 10s"),
    (("--lead", "soon"), "is not a delay"),
    (("--results", "0"), "--results"),
    (("--backend", "mars"), "--backend"),
])
def test_bad_flags_are_usage_errors(args: tuple[str, ...], says: str) -> None:
    result = run_cli("demo", *args)
    assert result.returncode == Exit.USAGE and says in result.stderr, result.stderr


def test_a_directory_that_is_not_empty_is_refused_and_left_alone(tmp_path: Path) -> None:
    (tmp_path / "notes.txt").write_text("mine")
    result = run_cli("demo", "--dir", str(tmp_path))
    assert result.returncode == Exit.FAILURE and "is not empty" in result.stderr, result.stderr
    assert [p.name for p in tmp_path.iterdir()] == ["notes.txt"]
