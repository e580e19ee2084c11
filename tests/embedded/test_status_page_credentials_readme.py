"""The README's status-page credentials block, run as written (with a home of the test's
own): two `add-credential` commands each print a secret once and write only its hash,
and `scheduler ui --credentials` then lets each login in, the tenant's to its tenant."""

from __future__ import annotations

import http.cookiejar
import os
import re
import shlex
import signal
import subprocess
import sys
import threading
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from tests.readme import section
from tests.support import wait_until


def _blocks() -> list[list[str]]:
    blocks = re.findall(r"```text\n(.*?)```", section("## Seeing what is going on"), re.S)
    assert len(blocks) == 1, f"the README's status page section has {len(blocks)} text blocks, not one"
    return [shlex.split(line) for line in blocks[0].splitlines() if line.strip()]


def _logged_in(base: str, name: str, secret: str) -> str:
    """The page after logging in as `name`, or the login page's answer."""
    opener = urllib.request.build_opener(urllib.request.HTTPCookieProcessor(http.cookiejar.CookieJar()))
    form = urllib.parse.urlencode({"name": name, "secret": secret, "next": "/"}).encode()
    request = urllib.request.Request(base + "login", data=form, headers={"Origin": base.rstrip("/")})
    try:
        with opener.open(request, timeout=30) as answer:
            return str(answer.read().decode())
    except urllib.error.HTTPError as refused:
        return f"{refused.code}: {refused.read().decode()}"


@pytest.mark.timeout(120)
def test_the_readmes_credentials_commands_run_as_written(tmp_path: Path) -> None:
    commands = _blocks()
    assert [command[:3] for command in commands] == [["scheduler", "ui", "add-credential"]] * 2 + [
        ["scheduler", "ui", "--credentials"]]
    home = tmp_path / "home"
    home.mkdir()
    env = {**os.environ, "HOME": str(home), "SCHEDULER_BACKEND": "embedded",
           "SCHEDULER_DB": str(tmp_path / "db" / "tasks.db")}
    expand = {"~": str(home)}

    def args(command: list[str]) -> list[str]:
        return [expand["~"] + arg[1:] if arg.startswith("~/") else arg for arg in command[1:]]

    secrets = {}
    for command in commands[:2]:
        made = subprocess.run([sys.executable, "-m", "scheduler", *args(command)], env=env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert made.returncode == 0, made.stderr
        secret = made.stdout.strip().splitlines()[-1].split()[-1]
        assert len(secret) >= 16
        secrets[command[3]] = secret
    credentials = home / ".config" / "scheduler" / "ui-credentials"
    stored = credentials.read_text()
    assert oct(credentials.stat().st_mode & 0o777) == "0o600"
    assert all(name in stored and secret not in stored for name, secret in secrets.items())

    submitted = subprocess.run([sys.executable, "-m", "scheduler", "submit", "reminder", "--tenant", "acme",
                                "--delay", "1h"], env=env, capture_output=True, text=True, timeout=60, check=False)
    assert submitted.returncode == 0, submitted.stderr  # the page reads a store that exists

    lines: list[str] = []
    with (tmp_path / "ui.log").open("w") as log, subprocess.Popen([sys.executable, "-m", "scheduler", *args(commands[2])], stdout=subprocess.PIPE,
                          stderr=log, text=True,
                          env={**env, "SCHEDULER_UI_LISTEN": "127.0.0.1:0"}) as page:
        stdout = page.stdout
        assert stdout is not None
        threading.Thread(target=lambda: lines.extend(iter(stdout.readline, "")), daemon=True).start()
        try:
            first = wait_until(lambda: next((line for line in lines if "status page at " in line), None)
                               or (f"exited {page.returncode}" if page.poll() is not None else None),
                               timeout_s=60, what="scheduler ui to print its address")
            assert first is not None and "status page at " in first, (first, (tmp_path / "ui.log").read_text())
            base = first.split("status page at ")[1].split()[0]
            assert 'id="logged-in"' in _logged_in(base, "ops", secrets["ops"])
            tenant = _logged_in(base, "acme-desk", secrets["acme-desk"])
            assert 'data-tenant="acme"' in tenant
            assert _logged_in(base, "ops", secrets["acme-desk"]).startswith("401")
        finally:
            page.send_signal(signal.SIGTERM)
            assert page.wait(30) == 0, (tmp_path / "ui.log").read_text()
