from __future__ import annotations

import pytest

from scheduler.errors import ConfigError
from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings


def test_defaults_point_at_the_local_cluster() -> None:
    settings = CassandraSettings.from_env({})
    assert settings.hosts == ("127.0.0.1",)
    assert settings.port == 9042
    assert settings.consistency == "LOCAL_QUORUM"
    assert settings.shard_count == 64
    assert KafkaSettings.from_env({}).bootstrap == "127.0.0.1:9092"
    assert ZooKeeperSettings.from_env({}).hosts == "127.0.0.1:2181"


def test_environment_is_read_and_overrides_win() -> None:
    env = {
        "SCHEDULER_CASSANDRA_HOSTS": "10.0.0.1, 10.0.0.2",
        "SCHEDULER_CASSANDRA_PORT": "9142",
        "SCHEDULER_KEYSPACE": "prod",
        "SCHEDULER_CONSISTENCY": "QUORUM",
        "SCHEDULER_SHARDS_TOTAL": "128",
    }
    settings = CassandraSettings.from_env(env, keyspace="staging")
    assert settings.hosts == ("10.0.0.1", "10.0.0.2")
    assert settings.port == 9142
    assert settings.keyspace == "staging"
    assert settings.consistency == "QUORUM"
    assert settings.shard_count == 128


def test_the_password_never_shows_in_repr() -> None:
    settings = CassandraSettings.from_env({"SCHEDULER_CASSANDRA_USERNAME": "u", "SCHEDULER_CASSANDRA_PASSWORD": "hunter2"})
    assert settings.password == "hunter2"
    assert "hunter2" not in repr(settings)


@pytest.mark.parametrize(
    ("env", "match"),
    [
        ({"SCHEDULER_CASSANDRA_PORT": "ninety"}, "SCHEDULER_CASSANDRA_PORT"),
        ({"SCHEDULER_CONSISTENCY": "MOST"}, "consistency"),
        ({"SCHEDULER_SHARDS_TOTAL": "0"}, "shard count"),
        ({"SCHEDULER_CASSANDRA_HOSTS": " , "}, "host"),
        ({"SCHEDULER_KEYSPACE": "Bad-Name"}, "keyspace"),
    ],
)
def test_bad_settings_say_what_is_wrong(env: dict[str, str], match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        CassandraSettings.from_env(env)
