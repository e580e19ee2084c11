"""Suite-wide rules: tests under tests/integration are marked `integration`, and when
the `CI` variable is set a skipped integration test fails the run, so a missing server
can never pass for a green build. Tests of deploy/local itself are marked
`local_cluster`."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

from tests.support import EXTERNAL_CLUSTER_VARIABLES

pytest_plugins = ["pytester", "tests.cluster", "tests.secure_cluster"]

INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Marks integration tests; against a cluster named by SCHEDULER_* variables, leaves
    out (deselects, not skips) the tests of deploy/local, which is then not in use."""
    external = any(os.environ.get(variable) for variable in EXTERNAL_CLUSTER_VARIABLES)
    kept: list[pytest.Item] = []
    deselected: list[pytest.Item] = []
    for item in items:
        if INTEGRATION_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)
        (deselected if external and item.get_closest_marker("local_cluster") else kept).append(item)
    if deselected:
        config.hook.pytest_deselected(items=deselected)
        items[:] = kept


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and os.environ.get("CI") and item.get_closest_marker("integration"):
        report.outcome = "failed"
        report.longrepr = f"integration test skipped while CI is set: {report.longrepr}"
    return report
