"""`rig`: an embedded worker rig (`tests/worker/rig.py`) in the test's directory, closed after."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.worker.rig import EmbeddedRig


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[EmbeddedRig]:
    opened = EmbeddedRig(tmp_path)
    try:
        yield opened
    finally:
        opened.close()
