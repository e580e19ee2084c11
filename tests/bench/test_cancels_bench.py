"""`bench/cancels.py` end to end at a small scale, on the embedded backend with real
`scheduler dispatcher` and `scheduler worker` processes: cancels made from several
threads while every attempt of every task fails and retries; no attempt starts after
its cancel answered, and every task ends cancelled. (The 100-cancel, 20-thread run on
both backends is the bench's own; its figures are in bench/README.md.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import run_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "cancels.py"


@pytest.mark.timeout(150)
def test_no_attempt_starts_after_its_cancel_answered(tmp_path: Path) -> None:
    out = tmp_path / "cancels.json"
    code, _, stderr = run_script(BENCH, "--tasks", "30", "--threads", "6", "--spread-s", "3", "--after-s", "3",
                                 "--out", str(out), timeout_s=140, stop_timeout_s=30)
    assert code == 0, stderr[-3000:]
    document = json.loads(out.read_text())
    assert document["answers"] == {"cancelled": 30}
    assert document["late_starts"] == 0 and document["tasks_with_late_starts"] == 0
    assert document["final_statuses"] == {"cancelled": 30}
    # Cancels met tasks already retrying, not only tasks that had not begun.
    assert document["starts_before_cancel"]["tasks_started"] > 0 and document["starts"] > 30
    assert all(code == 0 for code in document["exits"]["workers"] + document["exits"]["dispatchers"])


def test_a_bad_option_is_a_usage_error_and_help_describes_every_option() -> None:
    shown = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=60)
    assert shown.returncode == 0, shown.stderr
    for option in ("--backend", "--tasks", "--threads", "--spread-s", "--retry-ms", "--workers", "--after-s",
                   "--out", "--json", "--keep"):
        assert option in shown.stdout
    refused = subprocess.run([sys.executable, str(BENCH), "--threads", "0"], capture_output=True, text=True,
                             timeout=60)
    assert refused.returncode == 2 and "--threads must be at least 1" in refused.stderr
