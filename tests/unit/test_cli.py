from __future__ import annotations

import json
import os
import socket
import time
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from scheduler.adapters.cassandra.schema import render
from scheduler.cli import Exit, cli, exit_code_for, main
from scheduler.errors import SchedulerError
from scheduler.model import TaskId
from scheduler.settings import CassandraSettings
from tests.support import run_cli


def test_schema_show_prints_the_schema_for_the_chosen_keyspace() -> None:
    result = CliRunner().invoke(cli, ["schema", "show", "--keyspace", "results_day"])
    assert result.exit_code == 0, result.output
    assert "CREATE KEYSPACE IF NOT EXISTS results_day" in result.output
    assert "CREATE TABLE IF NOT EXISTS results_day.tasks_by_bucket" in result.output
    # Every statement of schema.cql, each ended by a ";" (the keyspace, the tables, the columns added since).
    assert result.output.count(";") == len(render("results_day", CassandraSettings().replication))
    assert "CREATE TABLE IF NOT EXISTS results_day.tenant_limits" in result.output


def test_schema_show_reads_the_keyspace_from_the_environment() -> None:
    result = CliRunner().invoke(cli, ["schema", "show"], env={"SCHEDULER_KEYSPACE": "from_env"})
    assert "CREATE KEYSPACE IF NOT EXISTS from_env" in result.output


@pytest.mark.parametrize("command", [[], ["schema"], ["schema", "show"], ["schema", "apply"], ["demo"],
                                     ["limits"], ["limits", "set"], ["limits", "show"], ["limits", "reset"]])
def test_every_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "Usage:" in result.output


def test_a_bad_keyspace_is_a_usage_error_with_the_reason() -> None:
    result = run_cli("schema", "show", "--keyspace", "Bad-Name")
    assert result.returncode == Exit.USAGE
    assert "keyspace 'Bad-Name' is not usable" in result.stderr


def test_an_unreachable_cassandra_is_its_own_exit_code_with_advice() -> None:
    result = run_cli("schema", "apply", "--port", "1")
    assert result.returncode == Exit.UNAVAILABLE
    assert "cannot reach Cassandra at 127.0.0.1:1" in result.stderr
    assert "deploy/local/cluster.py start" in result.stderr


def test_demo_help_names_every_flag_of_the_story() -> None:
    """The demo itself runs in tests/embedded/test_demo.py; here, that it documents itself."""
    result = CliRunner().invoke(cli, ["demo", "--help"])
    assert result.exit_code == 0
    for flag in ("--results", "--batch", "--reminders", "--reminder-delay", "--lead", "--workers", "--backend",
                 "--dir", "--keep", "--json"):
        assert flag in result.output


def test_main_turns_an_unknown_command_into_a_usage_exit() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == Exit.USAGE


@pytest.mark.parametrize("command", [["submit"], ["get"], ["cancel"]])
def test_every_task_command_has_help(command: list[str]) -> None:
    result = CliRunner().invoke(cli, [*command, "--help"])
    assert result.exit_code == 0
    assert "SCHEDULER_BACKEND" in result.output


def embedded_env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "SCHEDULER_DB": str(tmp_path / "tasks.db"), "SCHEDULER_BACKEND": "embedded"}


def test_submit_get_and_cancel_on_the_embedded_store(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    submitted = run_cli("submit", "sms", "--tenant", "college", "--payload", '{"to": "+91"}', "--delay", "15m",
                        "--priority", "high", env=env)
    assert submitted.returncode == Exit.OK, submitted.stderr
    task_id = submitted.stdout.strip()
    TaskId.parse(task_id)

    shown = run_cli("get", task_id, "--json", env=env)
    assert shown.returncode == Exit.OK, shown.stderr
    fields = json.loads(shown.stdout)
    assert (fields["tenant"], fields["priority"], fields["status"], fields["payload"]) == (
        "college", "high", "scheduled", {"to": "+91"})

    assert run_cli("cancel", task_id, "--tenant", "board", env=env).returncode == Exit.FAILURE
    cancelled = run_cli("cancel", task_id, "--tenant", "college", env=env)
    assert (cancelled.returncode, cancelled.stdout.strip()) == (Exit.OK, f"{task_id}: cancelled")
    assert json.loads(run_cli("get", task_id, "--json", env=env).stdout)["status"] == "cancelled"


def test_submit_with_a_key_twice_prints_the_same_id(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    args = ("submit", "cancel_hold", "--tenant", "shop", "--key", "order-9", "--run-at", "2030-01-01T10:15:00+05:30")
    first, second = run_cli(*args, env=env), run_cli(*args, env=env)
    assert first.returncode == second.returncode == Exit.OK
    assert first.stdout == second.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--run-at", "2030-01-01T10:00"], "has no time zone"),
        (["--delay", "soon"], "is not a delay"),
        (["--payload", "{oops"], "payload is not JSON"),
        (["--key", "k"], "needs an explicit run_at"),
    ],
)
def test_bad_submit_input_is_a_usage_error_and_writes_nothing(tmp_path: Path, args: list[str], message: str) -> None:
    env = embedded_env(tmp_path)
    result = run_cli("submit", "sms", "--tenant", "t", *args, env=env)
    assert result.returncode == Exit.USAGE
    assert message in result.stderr
    assert not (tmp_path / "tasks.db").exists()


def test_submit_file_reports_every_line_not_stored(tmp_path: Path) -> None:
    lines = [
        {"type": "sms", "payload": {"n": 1}},
        "not json",
        {"type": "sms", "run_at": "2030-01-01T10:00:00"},
        {"type": "sms", "tenant": "board", "run_at": "2030-01-01T10:00:00Z", "idempotency_key": "a"},
    ]
    path = tmp_path / "tasks.jsonl"
    text = "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines)
    path.write_text(text.replace("\n", "\n\n", 1) + "\n\n")  # blank lines are not tasks
    result = run_cli("submit", "--file", str(path), "--tenant", "college", env=embedded_env(tmp_path))
    assert result.returncode == Exit.FAILURE
    assert "2 stored, 2 invalid, 0 not stored for certain" in result.stdout
    assert "line 3: not stored, invalid: not JSON" in result.stderr
    assert "line 4: not stored, invalid: run_at 2030-01-01T10:00:00 has no time zone" in result.stderr


def test_get_of_an_unknown_id_is_a_failure_and_of_garbage_a_usage_error(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    missing = run_cli("get", str(TaskId.new(1_796_202_000_000)), env=env)
    assert missing.returncode == Exit.FAILURE
    assert "no task with id" in missing.stderr
    assert run_cli("get", "nope", env=env).returncode == Exit.USAGE


def test_submit_without_a_tenant_is_a_usage_error_but_a_file_may_name_its_own(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    env.pop("SCHEDULER_TENANT", None)
    missing = run_cli("submit", "sms", env=env)
    assert missing.returncode == Exit.USAGE
    assert "missing --tenant" in missing.stderr

    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"type": "sms", "tenant": "board"}) + "\n" + json.dumps({"type": "sms"}) + "\n")
    result = run_cli("submit", "--file", str(path), env=env)
    assert result.returncode == Exit.FAILURE
    assert "1 stored, 1 invalid" in result.stdout
    assert "line 2: not stored, invalid: a task needs a tenant" in result.stderr


@pytest.mark.parametrize("delay", ["inf", "nan", "99999999999d", "-"])
def test_an_impossible_delay_is_a_usage_error(tmp_path: Path, delay: str) -> None:
    result = run_cli("submit", "sms", "--tenant", "t", "--delay", delay, env=embedded_env(tmp_path))
    assert result.returncode == Exit.USAGE
    assert "delay" in result.stderr
    assert not (tmp_path / "tasks.db").exists()


def test_get_with_a_tenant_shows_only_that_tenants_task(tmp_path: Path) -> None:
    env = embedded_env(tmp_path)
    task_id = run_cli("submit", "sms", "--tenant", "college", env=env).stdout.strip()
    assert run_cli("get", task_id, "--tenant", "college", env=env).returncode == Exit.OK
    other = run_cli("get", task_id, "--tenant", "board", env=env)
    assert other.returncode == Exit.FAILURE
    assert "no task with id" in other.stderr


def test_a_bad_default_max_attempts_for_a_file_is_a_usage_error(tmp_path: Path) -> None:
    path = tmp_path / "tasks.jsonl"
    path.write_text(json.dumps({"type": "sms"}) + "\n")
    result = run_cli("submit", "--file", str(path), "--tenant", "t", "--max-attempts", "0", env=embedded_env(tmp_path))
    assert result.returncode == Exit.USAGE
    assert "max attempts must be from 1 to 100" in result.stderr


LONG_PAYLOAD = json.dumps({"text": "x" * 70_000})


@pytest.mark.parametrize("args", [
    pytest.param(["sms", "--tenant", "t", "--payload", "{oops"], id="payload-not-json"),
    pytest.param(["sms", "--tenant", "t", "--payload", LONG_PAYLOAD], id="payload-over-64-kib"),
    pytest.param(["sms", "--tenant", "t", "--run-at", "2030-01-01T10:00"], id="run-at-without-zone"),
    pytest.param(["sms", "--tenant", "t", "--run-at", "tomorrow"], id="run-at-not-iso"),
    pytest.param(["sms", "--tenant", "t", "--run-at", "2030-01-01T10:00Z", "--delay", "1m"], id="run-at-and-delay"),
    pytest.param(["sms", "--tenant", "t", "--delay", "soon"], id="delay-not-a-delay"),
    pytest.param(["sms", "--tenant", "t", "--delay", "inf"], id="delay-infinite"),
    pytest.param(["sms", "--tenant", "t", "--priority", "urgent"], id="unknown-priority"),
    pytest.param(["sms", "--tenant", "t", "--key", "k"], id="key-without-run-at"),
    pytest.param(["sms", "--tenant", "t", "--key", "k", "--delay", "15m"], id="key-with-delay"),
    pytest.param(["sms", "--tenant", "t", "--key", ""], id="empty-key"),
    pytest.param(["sms", "--tenant", ""], id="empty-tenant"),
    pytest.param(["sms", "--tenant", "t" * 101], id="over-long-tenant"),
    pytest.param(["sms", "--tenant", "a\nb"], id="tenant-with-a-newline"),
    pytest.param(["", "--tenant", "t"], id="empty-type"),
    pytest.param(["--tenant", "t"], id="no-type"),
    pytest.param(["sms", "--tenant", "t", "--max-attempts", "0"], id="max-attempts"),
    pytest.param(["sms", "--tenant", "t", "--cost", "0"], id="cost"),
    pytest.param(["sms", "--tenant", "t", "--keyspace", "Bad-Name"], id="bad-setting"),
    pytest.param(["sms", "--tenant", "t", "--topic-prefix", "no spaces"], id="bad-topic-prefix"),
    pytest.param(["sms", "--tenant", "t", "--backend", "mars"], id="unknown-backend"),
    pytest.param(["sms", "--file", "FILE", "--tenant", "t"], id="type-and-file"),
    pytest.param(["--file", "FILE", "--tenant", "t", "--max-attempts", "0"], id="file-with-bad-max-attempts"),
])
def test_a_failed_submit_creates_no_database_file(tmp_path: Path, args: list[str]) -> None:
    tasks = tmp_path / "tasks.jsonl"
    tasks.write_text(json.dumps({"type": "sms"}) + "\n")
    data = tmp_path / "data"
    data.mkdir()
    result = CliRunner().invoke(
        cli, ["submit", *(str(tasks) if arg == "FILE" else arg for arg in args), "--db", str(data / "tasks.db")],
        env={"SCHEDULER_BACKEND": "embedded", "SCHEDULER_TENANT": None},
    )
    error = result.exception
    usage = result.exit_code == Exit.USAGE or isinstance(error, SchedulerError) and exit_code_for(error) == Exit.USAGE
    assert usage, (result.output, error)
    assert list(data.iterdir()) == []


def test_a_good_submit_creates_the_database_files_where_the_failed_ones_did_not(tmp_path: Path) -> None:
    """The other side of the test above: that directory is where a submit writes."""
    data = tmp_path / "data"
    result = CliRunner().invoke(cli, ["submit", "sms", "--tenant", "t", "--db", str(data / "tasks.db")],
                                env={"SCHEDULER_BACKEND": "embedded"})
    assert result.exit_code == Exit.OK, (result.output, result.exception)
    assert TaskId.parse(result.output.strip())
    assert {"tasks.db", "queue.db"} <= {path.name for path in data.iterdir()}


def test_a_keyed_submit_due_long_ago_is_accepted_since_the_command_hands_it_off(tmp_path: Path) -> None:
    old = (datetime.now(timezone.utc) - timedelta(hours=2)).isoformat()
    result = CliRunner().invoke(cli, ["submit", "hold", "--tenant", "exam-fees", "--key", "hold-1042", "--run-at", old,
                                      "--db", str(tmp_path / "tasks.db")])
    assert result.exit_code == 0, result.output
    assert TaskId.parse(result.output.strip()).run_at_ms < time.time() * 1000 - 3_600_000


def _commands(group: click.Group, path: tuple[str, ...] = ()) -> Iterator[tuple[tuple[str, ...], click.Command]]:
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            yield from _commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_every_option_of_every_command_says_what_it_does() -> None:
    undocumented = [f"scheduler {' '.join(path)} {option.opts[0]}" for path, command in _commands(cli)
                    for option in command.params
                    if isinstance(option, click.Option) and not option.hidden and not option.help]
    assert undocumented == []


@pytest.mark.parametrize("command", ["dispatcher", "worker"])
def test_the_processes_document_their_metrics_endpoint_in_help_and_readme(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--help"])
    assert result.exit_code == 0
    for shown in ("--metrics-port", "SCHEDULER_METRICS_PORT", "--metrics-host", "SCHEDULER_METRICS_HOST"):
        assert shown in result.output
    readme = (Path(__file__).parents[2] / "README.md").read_text()
    row = next(line for line in readme.splitlines() if line.startswith(f"| `scheduler {command} "))
    assert "--metrics-port" in row and "--metrics-host" in row


@pytest.mark.parametrize("command", [["dispatcher"], ["worker", "--app", "tests.worker.apps:app"]])
def test_a_metrics_port_in_use_is_a_usage_error_before_anything_is_opened(command: list[str], tmp_path: Path) -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        result = run_cli(*command, "--metrics-port", str(port), env=embedded_env(tmp_path))
    assert result.returncode == Exit.USAGE, result.stderr
    assert f"--metrics-port {port}: the port is already in use on 127.0.0.1" in result.stderr
    assert not (tmp_path / "tasks.db").exists()  # nothing was opened, let alone joined


@pytest.mark.parametrize("content", [None, "dispatcher-no-colon-s3cret\n", "dispatcher:\n"])
def test_a_dispatcher_with_a_bad_zookeeper_auth_file_exits_2_naming_the_file_not_its_contents(
    tmp_path: Path, content: str | None
) -> None:
    path = tmp_path / "zookeeper-auth"
    if content is not None:
        path.write_text(content)
        path.chmod(0o600)
    # Nothing listens on these ports: the file is checked before any server is touched.
    env = {**os.environ, "SCHEDULER_CASSANDRA_HOSTS": "127.0.0.1", "SCHEDULER_CASSANDRA_PORT": "1",
           "SCHEDULER_KAFKA_BOOTSTRAP": "127.0.0.1:1", "SCHEDULER_ZOOKEEPER_HOSTS": "127.0.0.1:1"}
    by_option = run_cli("dispatcher", "--backend", "cassandra", "--zookeeper-auth-file", str(path), env=env,
                        timeout_s=60)
    by_variable = run_cli("dispatcher", "--backend", "cassandra",
                          env={**env, "SCHEDULER_ZOOKEEPER_AUTH_FILE": str(path)}, timeout_s=60)

    for result in (by_option, by_variable):
        assert result.returncode == Exit.USAGE, result.stderr
        assert f"error: ZooKeeper auth file {path} " in result.stderr
        assert "s3cret" not in result.stderr + result.stdout
