"""`bench/write_paths.py` documents its options, and runs end to end at a tiny scale on
the embedded backend: every task it wrote ran, none early, no cancelled task started,
its processes are stopped and its work directory removed. (Its lateness figures are not
asserted here: tests/write_paths.py holds the scenario to its bounds.)"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support import alive, run_script

BENCH = Path(__file__).resolve().parents[2] / "bench" / "write_paths.py"


@pytest.mark.timeout(60)
def test_help_describes_every_option_and_a_bad_one_is_a_usage_error() -> None:
    shown = subprocess.run([sys.executable, str(BENCH), "--help"], capture_output=True, text=True, timeout=50)
    assert shown.returncode == 0, shown.stderr
    for option in ("--backend", "--tasks", "--cli-tasks", "--schedules", "--cancel-tasks", "--sweep-interval",
                   "--worker-concurrency", "--cli-parallel", "--out", "--json", "--keep", "--work-dir"):
        assert option in shown.stdout
    refused = subprocess.run([sys.executable, str(BENCH), "--sweep-interval", "0.5"], capture_output=True,
                             text=True, timeout=50)
    assert refused.returncode == 2 and "--sweep-interval 1 to 600" in refused.stderr


@pytest.mark.timeout(150)
def test_a_tiny_embedded_run_accounts_for_every_task_and_cancel(tmp_path: Path) -> None:
    out = tmp_path / "write-paths.json"
    code, stdout, stderr = run_script(BENCH, "--backend", "embedded", "--tasks", "1", "--cli-tasks", "1",
                                      "--schedules", "0", "--cancel-tasks", "1", "--out", str(out),
                                      timeout_s=120, stop_timeout_s=30)
    assert code == 0, stderr
    assert "write path due offset" in stdout and "cancel by" in stdout
    document = json.loads(out.read_text())
    total = document["writes"]["total"]
    assert total["acknowledged"] == total["ran"] == 8 * 3 + 8 == len(document["tasks"])
    assert total["early"] == total["not_acknowledged"] == 0
    assert {row["path"] for row in document["writes"]["cells"]} == {"connect", "client", "insert", "cli"}
    cancels = document["cancels"]
    assert cancels["settled"] and cancels["problems"] == []
    assert sum(row["cancelled"] for row in cancels["rows"]) == 2 * 2 * 3
    assert all(row["started"] == 0 for row in cancels["rows"] if row["cancel_by"] != "kept")
    assert [p["exit_code"] for p in document["processes"]] == [0, 0, 0]
    assert not any(alive(p["pid"]) for p in document["processes"])
    assert document["work_dir"] is None and document["problems"] == []
