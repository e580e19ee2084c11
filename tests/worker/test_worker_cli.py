"""`scheduler worker` and `scheduler dlq` as a user runs them, on the embedded backend:
clear errors for a bad `--app`, and dead letters listed and replayed once."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from scheduler.cli import Exit
from scheduler.model import Priority, Task, TaskId, encode_message, encode_payload
from scheduler.ports import Delivery
from scheduler.worker import dead_letters
from tests.support import run_cli
from tests.worker.rig import KAFKA, EmbeddedRig


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "raises_on_import.py").write_text("raise RuntimeError('config missing')\n")
    (tmp_path / "not_an_app.py").write_text("app = 42\n")
    return {**os.environ, "SCHEDULER_DB": str(tmp_path / "tasks.db"), "PYTHONPATH": str(tmp_path)}


@pytest.mark.parametrize(("spec", "says"), [
    ("no_such_module:app", "cannot import 'no_such_module'"),
    ("raises_on_import:app", "RuntimeError: config missing"),
    ("not_an_app:app", "not a scheduler.worker.App"),
    ("no_colon", "module:attribute"),
])
def test_a_bad_app_is_a_clear_usage_error(env: dict[str, str], spec: str, says: str) -> None:
    result = run_cli("worker", "--app", spec, env=env)
    assert result.returncode == Exit.USAGE, result.stderr
    assert says in result.stderr and "Traceback" not in result.stderr


def test_dead_letters_are_listed_and_a_letter_named_twice_is_replayed_once(env: dict[str, str], tmp_path: Path) -> None:
    rig = EmbeddedRig(tmp_path)
    try:
        task = Task(TaskId.new(1_796_202_000_000), "board", "sms", encode_payload({"to": "+1"}), 1_796_202_000_000,
                    Priority.HIGH, 2, 3, "order-9")
        for copy in range(2):  # the same attempt dead-lettered twice (a worker died between letter and status)
            letter = dead_letters.DeadLetter(encode_message(task, 4), task.id, "board", "sms", 2,
                                             dead_letters.PERMANENT, "PermanentError: bad number", KAFKA.ready_topic("high"),
                                             1_796_202_000_000 + copy)
            rig.publisher.publish(KAFKA.dead_letter_topic, [dead_letters.encode_dead_letter(letter)])
        rig.publisher.flush(10)
    finally:
        rig.close()

    listed = run_cli("dlq", "list", "--json", env=env)
    assert listed.returncode == Exit.OK, listed.stderr
    (shown,) = [json.loads(line) for line in listed.stdout.splitlines()]
    assert (shown["task_id"], shown["attempt"], shown["reason"]) == (str(task.id), 2, dead_letters.PERMANENT)

    assert run_cli("dlq", "replay", env=env).returncode == Exit.USAGE
    replayed = run_cli("dlq", "replay", shown["letter"], shown["letter"], env=env)
    assert replayed.returncode == Exit.OK, replayed.stderr
    (line,) = replayed.stdout.splitlines()
    new_id = line.split("replayed as ")[1].split()[0]
    got = json.loads(run_cli("get", new_id, "--json", "--tenant", "board", env=env).stdout)
    assert (got["type"], got["payload"], got["status"]) == ("sms", {"to": "+1"}, "scheduled")
    assert run_cli("dlq", "list", "--json", env=env).stdout == ""
    again = run_cli("dlq", "replay", shown["letter"], env=env)
    assert again.returncode == Exit.FAILURE and "no such waiting letter" in again.stderr


def test_a_dead_letter_of_a_huge_message_is_cut_to_fit() -> None:
    letter = dead_letters.DeadLetter(b"x" * 2_000_000, None, None, None, 0, dead_letters.UNDECODABLE, "not msgpack",
                                     "t", 0)
    encoded = dead_letters.encode_dead_letter(letter)
    assert len(encoded) < 300_000
    (read,), _, _ = dead_letters.waiting([Delivery("dead", 0, 0, encoded, 0)])
    assert len(read.message) == dead_letters.MAX_MESSAGE_BYTES and "cut from 2000000" in read.error
