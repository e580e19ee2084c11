"""`scheduler.connect` on the embedded backend (no servers): where each setting comes
from, that the client hands tasks due soon off, that it closes what it opened, and that
a bad setting or an unreachable server fails `connect` itself with nothing left open or
created. The same on the real servers: tests/integration/test_connect_cluster.py."""

from __future__ import annotations

import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

import scheduler
from scheduler.adapters.embedded.queue import SqliteQueue
from scheduler.adapters.embedded.store import SqliteTaskStore
from scheduler.errors import ConfigError, QueueError, StoreError, StoreUnavailable
from scheduler.handoff import HandedTask, decode
from scheduler.model import TaskId
from scheduler.producer import Client, Submission
from scheduler.settings import CassandraSettings, KafkaSettings
from scheduler.worker import App, Context

pytestmark = pytest.mark.timeout(60)


def handed_off(db: Path, topic_prefix: str = KafkaSettings().topic_prefix) -> list[TaskId]:
    """The ids of the tasks in the embedded hand-off log beside `db`."""
    queue = SqliteQueue(db.with_name("queue.db"))
    try:
        items = [decode(value) for value in queue.read(KafkaSettings(topic_prefix=topic_prefix).handoff_topic)]
    finally:
        queue.close()
    return [item.task.id for item in items if isinstance(item, HandedTask)]


@pytest.fixture
def closes(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, int]]:
    """How many times an embedded store and an embedded queue were closed, by class name."""
    counts = {"SqliteTaskStore": 0, "SqliteQueue": 0}

    def counting(cls: type[Any]) -> None:
        close: Callable[[Any], None] = cls.close

        def counted(self: Any) -> None:
            counts[cls.__name__] += 1
            close(self)

        monkeypatch.setattr(cls, "close", counted)

    counting(SqliteTaskStore)
    counting(SqliteQueue)
    yield counts


def test_the_package_exports_connect_and_imports_no_driver() -> None:
    assert scheduler.connect.__module__ == "scheduler.connecting"
    assert (scheduler.Client, scheduler.Submission) == (Client, Submission)
    assert scheduler.__version__
    loaded = subprocess.run(
        [sys.executable, "-c", "import sys, scheduler; "
         "print(sorted({m.split('.')[0] for m in sys.modules} & {'cassandra', 'confluent_kafka', 'kazoo'}))"],
        capture_output=True, text=True, timeout=30, check=True,
    )
    assert loaded.stdout.strip() == "[]"


def test_the_public_api_is_the_package_and_names_nothing_private() -> None:
    assert scheduler.__all__ and all(not name.startswith("_") and hasattr(scheduler, name) for name in scheduler.__all__)
    assert (scheduler.App, scheduler.Context, scheduler.StoreError) == (App, Context, StoreError)


def test_by_default_the_embedded_backend_in_the_data_directory(tmp_path: Path) -> None:
    with scheduler.connect(env={"XDG_DATA_HOME": str(tmp_path)}) as client:
        assert isinstance(client.store, SqliteTaskStore)
        task_id = client.submit("sms", {"to": "+91"}, tenant="college")
    db = tmp_path / "scheduler" / "tasks.db"
    assert sorted(path.name for path in db.parent.iterdir() if path.suffix == ".db") == ["counts.db", "queue.db",
                                                                                         "tasks.db"]
    assert handed_off(db) == [task_id]


def test_settings_come_from_the_scheduler_variables(tmp_path: Path) -> None:
    db = tmp_path / "here" / "tasks.db"
    env = {"SCHEDULER_BACKEND": "embedded", "SCHEDULER_DB": str(db), "SCHEDULER_TENANT": "college",
           "SCHEDULER_TOPIC_PREFIX": "results", "SCHEDULER_SHARDS_TOTAL": "8"}
    with scheduler.connect(env=env) as client:
        assert client.store.shard_count == 8
        task_id = client.submit("sms", delay=5)  # the tenant is the variable's
        far = client.submit("sms", delay=3600)
        assert client.get(task_id).task.tenant == "college"  # type: ignore[union-attr]
    assert handed_off(db, "results") == [task_id]  # the task due in an hour needs no hand-off
    assert far not in handed_off(db, "results")


def test_arguments_win_over_the_variables(tmp_path: Path) -> None:
    mine = tmp_path / "mine" / "tasks.db"
    env = {"SCHEDULER_BACKEND": "cassandra", "SCHEDULER_DB": str(tmp_path / "theirs" / "tasks.db"),
           "SCHEDULER_TENANT": "board", "SCHEDULER_TOPIC_PREFIX": "theirs", "SCHEDULER_KEYSPACE": "Not-Used"}
    with scheduler.connect(backend="embedded", db=mine, tenant="college", kafka=KafkaSettings(topic_prefix="mine"),
                           cassandra=CassandraSettings(shard_count=16), default_max_attempts=7, env=env) as client:
        assert client.store.shard_count == 16
        task_id = client.submit("sms")
        stored = client.get(task_id)
    assert stored is not None and (stored.task.tenant, stored.task.max_attempts) == ("college", 7)
    assert handed_off(mine, "mine") == [task_id]
    assert not (tmp_path / "theirs").exists()


def test_close_closes_the_store_and_the_handoff_once(tmp_path: Path, closes: dict[str, int]) -> None:
    client = scheduler.connect(db=tmp_path / "tasks.db", env={})
    client.close()
    client.close()
    assert closes == {"SqliteTaskStore": 1, "SqliteQueue": 1}
    with pytest.raises(StoreError):
        client.submit("sms", tenant="college")


def test_a_client_made_by_hand_leaves_its_store_open(tmp_path: Path) -> None:
    store = SqliteTaskStore(tmp_path / "tasks.db")
    try:
        with Client(store, tenant="college") as client:
            client.submit("sms")
        client.close()
        assert store.count() == 1
    finally:
        store.close()


@pytest.mark.parametrize(("arguments", "env", "says"), [
    pytest.param({}, {"SCHEDULER_BACKEND": "mars"}, "backend 'mars' is not one of", id="backend"),
    pytest.param({"backend": "sqlite"}, {}, "backend 'sqlite' is not one of", id="backend-argument"),
    pytest.param({}, {"SCHEDULER_KEYSPACE": "Bad-Name"}, "keyspace 'Bad-Name' is not usable", id="keyspace"),
    pytest.param({}, {"SCHEDULER_CASSANDRA_PORT": "ninety"}, "is not an integer", id="port"),
    pytest.param({}, {"SCHEDULER_SHARDS_TOTAL": "0"}, "shard", id="shard-count"),
    pytest.param({}, {"SCHEDULER_TOPIC_PREFIX": "no spaces"}, "topic prefix", id="topic-prefix"),
    pytest.param({"default_max_attempts": 0}, {}, "max attempts must be from 1", id="max-attempts"),
])
def test_a_bad_setting_is_a_config_error_and_creates_nothing(
    tmp_path: Path, closes: dict[str, int], arguments: dict[str, Any], env: dict[str, str], says: str,
) -> None:
    data = tmp_path / "data"
    with pytest.raises(ConfigError, match=says):
        scheduler.connect(db=data / "tasks.db", env=env, **arguments)
    assert not data.exists()
    assert closes == {"SqliteTaskStore": 0, "SqliteQueue": 0}


def test_a_handoff_that_cannot_be_opened_closes_the_store_again(tmp_path: Path, closes: dict[str, int]) -> None:
    (tmp_path / "queue.db").mkdir()  # where the embedded hand-off log would be
    with pytest.raises(QueueError, match="cannot open the embedded queue"):
        scheduler.connect(db=tmp_path / "tasks.db", env={})
    assert closes == {"SqliteTaskStore": 1, "SqliteQueue": 0}


def test_an_unreachable_cassandra_fails_connect_itself(tmp_path: Path) -> None:
    with pytest.raises(StoreUnavailable, match="cannot reach Cassandra at 127.0.0.1:1"):
        scheduler.connect(backend="cassandra", cassandra=CassandraSettings(port=1, connect_timeout_s=5), env={})
