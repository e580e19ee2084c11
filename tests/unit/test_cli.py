from __future__ import annotations

import pytest
from click.testing import CliRunner

from scheduler.cli import Exit, cli, main
from tests.support import run_cli


def test_schema_show_prints_the_schema_for_the_chosen_keyspace() -> None:
    result = CliRunner().invoke(cli, ["schema", "show", "--keyspace", "results_day"])
    assert result.exit_code == 0, result.output
    assert "CREATE KEYSPACE IF NOT EXISTS results_day" in result.output
    assert "CREATE TABLE IF NOT EXISTS results_day.tasks_by_bucket" in result.output
    assert result.output.count(";") == 4


def test_schema_show_reads_the_keyspace_from_the_environment() -> None:
    result = CliRunner().invoke(cli, ["schema", "show"], env={"SCHEDULER_KEYSPACE": "from_env"})
    assert "CREATE KEYSPACE IF NOT EXISTS from_env" in result.output


@pytest.mark.parametrize("command", [[], ["schema"], ["schema", "show"], ["schema", "apply"], ["demo"]])
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


def test_demo_says_plainly_that_it_is_not_built_yet() -> None:
    result = CliRunner().invoke(cli, ["demo"])
    assert result.exit_code == 0
    assert "not built yet" in result.output


def test_main_turns_an_unknown_command_into_a_usage_exit() -> None:
    with pytest.raises(SystemExit) as exit_info:
        main(["no-such-command"])
    assert exit_info.value.code == Exit.USAGE
