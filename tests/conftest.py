"""Suite-wide rules: tests under tests/integration are marked `integration`, and when
the `CI` variable is set a skipped integration test fails the run, so a missing server
can never pass for a green build."""

from __future__ import annotations

import os
from collections.abc import Generator
from pathlib import Path

import pytest

pytest_plugins = ["pytester"]

INTEGRATION_DIR = Path(__file__).parent / "integration"


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if INTEGRATION_DIR in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.integration)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo[None]) -> Generator[None, pytest.TestReport, pytest.TestReport]:
    report = yield
    if report.skipped and os.environ.get("CI") and item.get_closest_marker("integration"):
        report.outcome = "failed"
        report.longrepr = f"integration test skipped while CI is set: {report.longrepr}"
    return report
