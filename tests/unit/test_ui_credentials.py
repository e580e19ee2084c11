"""The status page's credentials file (`scheduler.ui.credentials`), `scheduler ui
add-credential`, and `scheduler ui` refusing to start (exit 2, nothing served) on a file
it cannot use or on an address off loopback without credentials."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

import scheduler
from scheduler.cli import cli
from scheduler.ui.credentials import CredentialsError, add_credential, hash_secret, load, parse

HASH = hash_secret("s3cret-for-tests")


def test_a_secret_is_kept_only_as_a_salted_hash_and_checked_against_it(tmp_path: Path) -> None:
    path = tmp_path / "creds"
    add_credential(path, "ops", "all", "right-secret")
    add_credential(path, "acme-desk", "tenant:acme", "right-secret")
    content = path.read_text()
    assert "right-secret" not in content
    ops_hash, acme_hash = (line.split()[2] for line in content.splitlines())
    assert ops_hash != acme_hash  # salted: the same secret hashes differently
    assert os.stat(path).st_mode & 0o777 == 0o600
    credentials = load(path)
    ops = credentials.verify("ops", "right-secret")
    assert ops is not None and ops.tenant is None
    acme = credentials.verify("acme-desk", "right-secret")
    assert acme is not None and acme.tenant == "acme"
    assert credentials.verify("ops", "wrong-secret") is None
    assert credentials.verify("nobody", "right-secret") is None
    with pytest.raises(CredentialsError, match="already has a credential named 'ops'"):
        add_credential(path, "ops", "all", "another")


@pytest.mark.parametrize(("text", "says"), [
    ("ops all\n", "line 1: expected `NAME SCOPE HASH`, got 2"),
    (f"# people\n\nops everyone {HASH}\n", "line 3: unknown scope 'everyone'"),
    (f"ops tenant: {HASH}\n", "line 1: unknown scope 'tenant:'"),
    (f"ops all {HASH}\nops tenant:acme {HASH}\n", "line 2: the name 'ops' is given twice"),
    ("ops all plain-secret\n", "line 1: the hash is not scrypt"),
    (f"-ops all {HASH}\n", "line 1: bad credential name"),
])
def test_a_bad_line_is_an_error_naming_it(text: str, says: str) -> None:
    with pytest.raises(CredentialsError, match=re.escape(f"creds, {says}")):
        parse(text, "creds")


def write(path: Path, text: str, mode: int = 0o600) -> Path:
    path.write_text(text)
    path.chmod(mode)
    return path


def ui(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """`scheduler ui ...` as a user runs it; one that served instead of refusing would be
    ended by the timeout and fail the test."""
    return subprocess.run([sys.executable, "-m", "scheduler", "ui", *args], capture_output=True, text=True,
                          env=env, timeout=60, check=False)


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    db = tmp_path / "tasks.db"
    with scheduler.connect(backend="embedded", db=db):
        pass
    return {**os.environ, "SCHEDULER_DB": str(db), "SCHEDULER_BACKEND": "embedded",
            "SCHEDULER_UI_LISTEN": "127.0.0.1:0"}


@pytest.mark.parametrize(("name", "says"), [
    ("missing", "cannot read"),
    ("bad-line", "line 1: expected `NAME SCOPE HASH`"),
    ("unknown-scope", "unknown scope 'root'"),
    ("duplicate", "given twice"),
    ("writable", "writable by group or others"),
    ("empty", "holds no credential"),
])
def test_a_credentials_file_that_cannot_be_used_stops_the_page_at_start(
        tmp_path: Path, env: dict[str, str], name: str, says: str) -> None:
    files = {
        "bad-line": lambda p: write(p, f"ops {HASH}\n"),
        "unknown-scope": lambda p: write(p, f"ops root {HASH}\n"),
        "duplicate": lambda p: write(p, f"ops all {HASH}\nops all {HASH}\n"),
        "writable": lambda p: write(p, f"ops all {HASH}\n", 0o666),
        "empty": lambda p: write(p, "# nobody yet\n"),
    }
    path = tmp_path / name
    if name in files:
        files[name](path)
    result = ui("--credentials", str(path), env=env)
    assert result.returncode == 2, result.stderr
    assert says in result.stderr and "--credentials" in result.stderr
    assert "status page at" not in result.stdout
    # The same file named by the variable.
    assert ui(env={**env, "SCHEDULER_UI_CREDENTIALS": str(path)}).returncode == 2


def test_an_address_off_loopback_without_credentials_is_refused(tmp_path: Path, env: dict[str, str]) -> None:
    result = ui("--listen", "0.0.0.0:0", env=env)
    assert result.returncode == 2, result.stderr
    assert "not a loopback address" in result.stderr and "--credentials" in result.stderr
    assert "status page at" not in result.stdout


def test_add_credential_prints_a_made_secret_once_and_writes_only_its_hash(tmp_path: Path) -> None:
    path = tmp_path / "creds"
    runner = CliRunner()
    made = runner.invoke(cli, ["ui", "add-credential", "ops", "--scope", "all", "--credentials", str(path)])
    assert made.exit_code == 0, made.output
    secret = made.stdout.strip()
    assert len(secret) >= 32 and secret not in path.read_text()
    assert load(path).verify("ops", secret) is not None

    given = runner.invoke(cli, ["ui", "add-credential", "acme-desk", "--scope", "tenant:acme", "--credentials",
                                str(path), "--secret-stdin"], input="typed-secret-9\n")
    assert given.exit_code == 0 and given.stdout == ""
    found = load(path).verify("acme-desk", "typed-secret-9")
    assert found is not None and found.tenant == "acme"

    for args, says in ((["ops", "--scope", "all"], "already has a credential named 'ops'"),
                       (["x", "--scope", "tenant"], "unknown scope 'tenant'")):
        refused = runner.invoke(cli, ["ui", "add-credential", *args, "--credentials", str(path)])
        assert refused.exit_code == 2 and says in refused.output
    assert len(path.read_text().splitlines()) == 2
