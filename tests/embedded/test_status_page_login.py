"""The status page with a credentials file, in a real browser (tests/status_page.py):
`scheduler ui` started as a user starts it on an embedded store, a tenant's login that
sees only its tenant, finds another tenant's task missing, and cancels one of its own
tasks from the task page, the store then saying it is cancelled."""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path

import pytest

import scheduler
from scheduler.ports import TaskStatus
from tests.status_page import (
    TENANT_SCREENSHOT_ENV,
    browser_page,
    log_in,
    make_credentials,
    screenshot,
    skip_without_chromium,
    status_page,
    tenant_rows,
    totals,
)
from tests.support import wait_until

ACME_SECRET = "acme-desk-secret-of-the-test"


@pytest.mark.timeout(180)
def test_a_tenant_s_login_sees_its_tenant_only_and_cancels_its_task(tmp_path: Path) -> None:
    skip_without_chromium()
    db = tmp_path / "tasks.db"
    env = {**os.environ, "SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db)}
    with scheduler.connect(env=env) as client:
        acme = [client.submit("reminder", {}, tenant="acme", delay=timedelta(hours=1)) for _ in range(3)]
        beta = client.submit("reminder", {}, tenant="beta", delay=timedelta(hours=1))
        for _ in range(2):
            client.submit("sms", {}, tenant="beta", delay=timedelta(hours=1))
    credentials = make_credentials(tmp_path / "ui-credentials", {
        "acme-desk": ("tenant:acme", ACME_SECRET), "ops": ("all", "ops-secret-of-the-test")})
    assert ACME_SECRET not in credentials.read_text()

    with status_page(env, tmp_path / "ui.log", credentials) as url, browser_page() as page:
        page.goto(url + "dead-letters")
        assert "/login" in page.url  # nothing shown before a login
        log_in(page, url, "acme-desk", ACME_SECRET)
        assert page.get_attribute("#logged-in", "data-tenant") == "acme"
        wait_until(lambda: tenant_rows(page) == {"acme": {**dict.fromkeys(totals(page), 0), "waiting": 3}},
                   timeout_s=30, interval_s=0.5, what="the page to show acme's 3 waiting tasks, and no other tenant")
        assert totals(page)["waiting"] == 3  # beta's 3 are in no total either
        assert page.query_selector("#deployment-hidden") and not page.query_selector("#processes")

        page.fill("input[name=id]", str(beta))
        page.click("form.lookup button")
        page.wait_for_selector("#task-error")
        assert (page.text_content("#task-error") or "").startswith(f"no task with id {beta}")

        page.fill("input[name=id]", str(acme[0]))
        page.click("form.lookup button")
        page.wait_for_selector("#task")
        assert page.text_content("[data-field=tenant]") == "acme"
        page.click("#cancel")
        page.wait_for_selector("#cancel-result")
        assert page.get_attribute("#cancel-result", "data-answer") == "cancelled"
        assert page.text_content("[data-field=status]") == "cancelled"
        assert page.query_selector("#cancel") is None

        page.goto(url)
        wait_until(lambda: tenant_rows(page).get("acme", {}).get("cancelled") == 1
                   and tenant_rows(page)["acme"]["waiting"] == 2, timeout_s=30, interval_s=0.5,
                   what="the overview to count the cancel")
        screenshot(page, tmp_path, "status-page-tenant.png", TENANT_SCREENSHOT_ENV)

    with scheduler.connect(env=env) as client:
        statuses = {task_id: client.get(task_id) for task_id in [*acme, beta]}
    assert [s.status if s else None for s in statuses.values()] == [
        TaskStatus.CANCELLED, TaskStatus.SCHEDULED, TaskStatus.SCHEDULED, TaskStatus.SCHEDULED]
