"""The status page as a person sees it: `scheduler ui` started as a user starts it, opened
in a real browser (Debian's chromium, driven by Playwright; no browser is downloaded,
`.ci/run` installs chromium), and read from what the page shows."""

from __future__ import annotations

import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from playwright.sync_api import Page, sync_playwright

from scheduler.visibility.counts import STATES
from tests.readme import section
from tests.support import wait_until

CHROMIUM_ENV = "SCHEDULER_TEST_CHROMIUM"
SCREENSHOT_ENV = "SCHEDULER_TEST_SCREENSHOT"
"""A path to also save the page's screenshot at (docs/status-page.png is made so)."""
TENANT_SCREENSHOT_ENV = "SCHEDULER_TEST_SCREENSHOT_TENANT"
"""The same for the page as a tenant's login sees it (docs/status-page-tenant.png)."""


def chromium() -> str | None:
    """The browser's path, None without one (then the page's checks are skipped, and under
    `CI` they fail: .ci/run installs it)."""
    path = os.environ.get(CHROMIUM_ENV) or shutil.which("chromium") or "/usr/bin/chromium"
    if Path(path).exists():
        return path
    if os.environ.get("CI"):
        pytest.fail(f"no chromium at {path}: .ci/run installs it (apt-get install chromium), or set {CHROMIUM_ENV}")
    return None


def skip_without_chromium() -> None:
    if chromium() is None:
        pytest.skip("the status page is checked in Debian's chromium, which is not installed (apt-get install "
                    "chromium)")


@contextmanager
def browser_page() -> Iterator[Page]:
    with sync_playwright() as playwright:
        path = chromium()
        assert path is not None, "no chromium (see skip_without_chromium)"
        browser = playwright.chromium.launch(executable_path=path)
        try:
            page = browser.new_page(viewport={"width": 1280, "height": 900})
            page.set_default_timeout(30_000)
            yield page
        finally:
            browser.close()


def readme_command() -> list[str]:
    """The README's command for the page: the one line of the second sh block of "Seeing
    what is going on"."""
    blocks = re.findall(r"```sh\n(.*?)```", section("## Seeing what is going on"), re.S)
    assert len(blocks) == 2, "the README's visibility section should have the status commands, then the page's"
    (line,) = [line for line in blocks[1].splitlines() if line.strip()]
    command = shlex.split(line, comments=True)
    assert command[:2] == ["scheduler", "ui"], command
    return command


def make_credentials(path: Path, credentials: Mapping[str, tuple[str, str]]) -> Path:
    """A credentials file of name -> (scope, secret), made with `scheduler ui
    add-credential` as an operator makes it (the secret given on its standard input)."""
    for name, (scope, secret) in credentials.items():
        subprocess.run([sys.executable, "-m", "scheduler", "ui", "add-credential", name, "--scope", scope,
                        "--credentials", str(path), "--secret-stdin"], input=secret + "\n", text=True, check=True,
                       capture_output=True, timeout=60)
    return path


@contextmanager
def status_page(env: Mapping[str, str], log: Path, credentials: Path | None = None) -> Iterator[str]:
    """The README's `scheduler ui`, run as written, on any free port (`SCHEDULER_UI_LISTEN`,
    which the command reads), until the end, when SIGTERM must end it with exit 0. Yields
    the address it prints; its stderr goes to `log` (a pipe nobody reads could fill and
    stall it). With `credentials`, the page is given that file (`SCHEDULER_UI_CREDENTIALS`)."""
    command = readme_command()
    extra = {} if credentials is None else {"SCHEDULER_UI_CREDENTIALS": str(credentials)}
    with log.open("w") as errors, subprocess.Popen(
            [sys.executable, "-m", "scheduler", *command[1:]],
            env={**env, "SCHEDULER_UI_LISTEN": "127.0.0.1:0", **extra},
            stdout=subprocess.PIPE, stderr=errors, text=True) as process:
        stdout = process.stdout
        assert stdout is not None
        lines: list[str] = []
        reader = threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True)
        reader.start()
        try:
            first = wait_until(lambda: next((line for line in lines if "status page at " in line), None)
                               or (f"exited {process.returncode}" if process.poll() is not None else None),
                               timeout_s=60, what="scheduler ui to print its address")
            assert first is not None and "status page at http://" in first, (first, log.read_text())
            yield first.split("status page at ")[1].split()[0]
        finally:
            process.send_signal(signal.SIGTERM)
            try:
                code: int | None = process.wait(30)
            except subprocess.TimeoutExpired:
                process.kill()
                code = None
            reader.join(5)
        assert code == 0, f"scheduler ui ended with {code}: {log.read_text()}"


def log_in(page: Page, base_url: str, name: str, secret: str) -> None:
    """Opens the page, which asks for a login first, and logs in with its form."""
    page.goto(base_url)
    page.wait_for_selector("form.login")
    page.fill("input[name=name]", name)
    page.fill("input[name=secret]", secret)
    page.click("form.login button")
    page.wait_for_selector("#logged-in")
    assert page.get_attribute("#logged-in", "data-name") == name


def _number(text: str) -> int:
    return int(text.strip().replace(",", ""))


def tenant_rows(page: Page) -> dict[str, dict[str, int]]:
    """The tenants table as shown: tenant -> state -> the number in its cell."""
    rows: list[list[Any]] = page.eval_on_selector_all(
        "#states tbody tr[data-tenant]",
        "rows => rows.map(r => [r.dataset.tenant, [...r.querySelectorAll('td[data-state]')]"
        ".map(td => [td.dataset.state, td.textContent])])")
    return {tenant: {state: _number(text) for state, text in cells} for tenant, cells in rows}


def totals(page: Page) -> dict[str, int]:
    cards: list[list[str]] = page.eval_on_selector_all(
        "[data-total]", "cards => cards.map(c => [c.dataset.total, c.querySelector('.n').textContent])")
    return {state: _number(text) for state, text in cards}


def by_tenant(expected: Mapping[tuple[str, str], Mapping[str, int]]) -> dict[str, dict[str, int]]:
    """The expected (tenant, type) states added up per tenant, every state shown."""
    result: dict[str, dict[str, int]] = {}
    for (tenant, _), states in expected.items():
        row = result.setdefault(tenant, dict.fromkeys(STATES, 0))
        for state, n in states.items():
            row[state] += n
    return result


def shows(page: Page, expected: Mapping[tuple[str, str], Mapping[str, int]]) -> bool:
    """Whether the page, as it is now, shows exactly `expected` per tenant and in total."""
    want = by_tenant(expected)
    total = {state: sum(row[state] for row in want.values()) for state in STATES}
    return tenant_rows(page) == want and totals(page) == total


def check_task(page: Page, task_id: str, status: str, error: str | None) -> None:
    """Looks the task up with the header's form, as a person would, and reads its one attempt."""
    page.fill("input[name=id]", task_id)
    page.click("form.lookup button")
    page.wait_for_selector("#task")
    assert page.text_content("[data-field=status]") == status
    assert page.text_content("#history tr[data-attempt='1'] [data-field=outcome]") == status
    assert page.text_content("#history tr[data-attempt='1'] [data-field=worker]") == "w1"
    shown_error = page.text_content("#history tr[data-attempt='1'] td.error") or ""
    assert (error is None and not shown_error) or (error is not None and error in shown_error), shown_error


def replay_from_page(page: Page, base_url: str, task_id: str) -> str:
    """Replays the dead letter of `task_id` with its button; the new task's id."""
    page.goto(base_url + "dead-letters")
    row = f"#letters tr[data-task='{task_id}']"
    page.wait_for_selector(row)
    page.click(f"{row} button")
    page.wait_for_selector("#replay-result")
    result = page.text_content("#replay-result") or ""
    assert " replayed as " in result, result
    new_id = page.get_attribute("#replay-result a", "data-new-task")
    assert new_id
    assert page.query_selector(row) is None  # the replayed letter is no longer listed
    return new_id


def screenshot(page: Page, tmp_path: Path, name: str = "status-page.png", env: str = SCREENSHOT_ENV) -> Path:
    path = tmp_path / name
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and path.stat().st_size > 20_000
    if os.environ.get(env):
        shutil.copyfile(path, os.environ[env])
    return path
