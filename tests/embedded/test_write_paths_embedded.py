"""Every write path and every cancel path on the embedded backend (SQLite store, log and
coordinator; no servers), with a real `scheduler dispatcher` and `scheduler worker`: see
tests/write_paths.py for what is held. The same on the real servers:
tests/integration/test_write_paths_cluster.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.dispatchers import Fleet
from tests.workers import Workers
from tests.write_paths import check_cancels, check_write_paths


@pytest.mark.timeout(180)
def test_every_write_path_runs_every_task_never_early_and_within_the_bound(
    embedded: tuple[Fleet, Workers],
) -> None:
    check_write_paths(*embedded)


@pytest.mark.timeout(150)
def test_a_cancelled_task_never_starts_whoever_cancelled_it_and_wherever_it_was(
    embedded: tuple[Fleet, Workers], tmp_path: Path
) -> None:
    check_cancels(*embedded, tmp_path)
