"""The suite's own rule: under CI a skipped integration test fails the run."""

from __future__ import annotations

from pathlib import Path

import pytest

TESTS = Path(__file__).parents[1]
SUITE_FILES = ("__init__.py", "conftest.py", "support.py", "cluster.py", "secure_cluster.py")
"""The real suite's conftest and the plugins it loads, copied as they are."""
SKIPPING_TEST = """
import pytest

def test_needs_a_server():
    pytest.skip("no server")
"""


@pytest.fixture
def suite(pytester: pytest.Pytester) -> pytest.Pytester:
    tests = pytester.mkdir("tests")
    for name in SUITE_FILES:
        (tests / name).write_text((TESTS / name).read_text(encoding="utf-8"))
    (tests / "integration").mkdir()
    (tests / "integration" / "test_server.py").write_text(SKIPPING_TEST)
    (tests / "unit").mkdir()
    (tests / "unit" / "test_plain.py").write_text(SKIPPING_TEST)
    return pytester


def test_under_ci_a_skipped_integration_test_fails(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("CI", "true")
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(failed=1, skipped=1)
    result.stdout.fnmatch_lines(["*integration test skipped while CI is set*"])


def test_outside_ci_a_skipped_integration_test_is_a_skip(suite: pytest.Pytester, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("CI", raising=False)
    result = suite.runpytest_subprocess("-p", "no:cacheprovider")
    result.assert_outcomes(skipped=2)
