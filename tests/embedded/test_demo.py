"""`scheduler demo` end to end on the embedded backend, as a new user runs it (a small
story, so it takes about half a minute): its summary says everything was delivered,
and the document behind it agrees count by count; bad flags are usage errors."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from scheduler.cli import Exit
from tests.support import run_cli, wait_until

SMALL = ("--results", "1500", "--batch", "300", "--reminders", "8", "--reminder-delay", "12s", "--lead", "4s",
         "--sms-rate", "300")


def check_status_beside(summary: dict[str, Any]) -> None:
    """`scheduler status`, read by the demo at the end, shows what the tasks did: the dead
    task exactly, every done task but those a killed worker had not yet counted, and in
    another state no more than those and the tasks the killed dispatcher may have fired
    without counting them (a process killed with kill -9 loses its last ~2 s of counts)."""
    status = summary["status"]
    assert status["verdict"] in ("same", "within_kill"), status
    extra = 0
    for tenant, figures in summary["tenants"].items():
        shown = status["tenants"][tenant]
        assert shown["dead"] == figures["dead"], status
        short = figures["done"] - shown["done"]
        assert 0 <= short <= status["killed_worker_tasks"], status
        extra += max(sum(n for state, n in shown.items() if state not in ("done", "dead")) - short, 0)
    assert extra <= status["killed_dispatcher_tasks"], status
    assert (status["verdict"] == "same") == (not status["differences"])


def check_small_story(summary: dict[str, Any]) -> None:
    assert summary["ok"], summary
    # The board's workflow: 5 renders, 5 sends, 1 report; the college's 8 reminders.
    assert summary["tasks"] == {"submitted": 11 + 8, "as_expected": 19, "lost": 0, "not_as_expected": []}
    assert summary["sms"]["expected"] == summary["sms"]["delivered"] == 1500 + 1 + 7
    assert summary["sms"]["missing"] == summary["sms"]["unexpected"] == 0
    assert summary["tenants"]["state-board"]["done"] == 11
    assert (summary["tenants"]["city-college"]["done"], summary["tenants"]["city-college"]["dead"]) == (7, 1)
    (letter,) = summary["dead_letters"]
    assert (letter["tenant"], letter["type"], letter["attempt"]) == ("city-college", "reminder", 3)
    assert "unreachable" in letter["error"]
    events = [event["what"] for event in summary["events"]]
    assert any(what.startswith("dispatcher-1 killed (kill -9)") for what in events), events
    assert any("reowned_after_s" in event for event in summary["events"]), events
    # Every handler start is counted; those beyond the first are re-runs the provider absorbed.
    assert summary["handler_runs"]["total"] >= 19
    fairness = summary["fairness"]
    assert fairness["sms_rate_limit"] == 300 and fairness["reminders"] >= 8
    assert fairness["board_sms_per_s"] is not None
    check_status_beside(summary)


@pytest.mark.timeout(200)
def test_a_small_demo_delivers_everything_and_says_so(tmp_path: Path) -> None:
    """Run as a user runs it; while it plays, the status page it names answers and shows
    the demo's tenants; it closes with the demo."""
    out = tmp_path / "summary.json"
    lines: list[str] = []
    with subprocess.Popen([sys.executable, "-m", "scheduler", "demo", *SMALL, "--json", str(out), "--dir",
                           str(tmp_path / "run")], stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          text=True) as demo:
        assert demo.stdout is not None
        reader = threading.Thread(target=lambda: lines.extend(iter(demo.stdout.readline, "")),  # type: ignore[union-attr]
                                  daemon=True)
        reader.start()
        try:
            first = wait_until(lambda: lines[0] if lines else None, timeout_s=60, what="the demo's first line")
            assert first is not None and first.startswith("status page at http://127.0.0.1:"), first
            url = first.split()[3]
            page = wait_until(lambda: _page_with(url, 'data-tenant="state-board"'), timeout_s=60, interval_s=0.5,
                              what="the demo's status page to show the board's tasks")
            assert page is not None
            demo.wait(timeout=150)
        finally:
            if demo.poll() is None:
                demo.kill()
        reader.join(10)
    stdout = "".join(lines)
    assert demo.returncode == Exit.OK, stdout
    assert "all delivered, none lost: 19 of 19 tasks ended as expected" in stdout
    assert "state-board submitted its results day as a workflow" in stdout
    assert "the other dispatcher holds all 64 shards" in stdout
    assert "scheduler status shows state-board " in stdout
    check_small_story(json.loads(out.read_text()))
    assert not any(line.startswith("Traceback") for line in lines)
    with pytest.raises(urllib.error.URLError):  # the page closed with the demo
        urllib.request.urlopen(url, timeout=5)


def _page_with(url: str, text: str) -> str | None:
    """The page, if it answers and shows `text` (a slow or failed answer: not yet)."""
    try:
        with urllib.request.urlopen(url, timeout=10) as response:
            page: str = response.read().decode()
    except (OSError, urllib.error.URLError):
        return None
    return page if text in page else None


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
