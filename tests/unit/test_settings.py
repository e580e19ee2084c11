from __future__ import annotations

import logging
from pathlib import Path

import pytest

from scheduler.errors import ConfigError
from scheduler.settings import CassandraSettings, KafkaSettings, ZooKeeperSettings, environment


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


SECRET = "s3cret:with-colon"


def auth_file(tmp_path: Path, text: str, mode: int = 0o600) -> Path:
    path = tmp_path / "zookeeper-auth"
    path.write_text(text)
    path.chmod(mode)
    return path


@pytest.mark.parametrize("ending", ["", "\n", "\r\n"])
def test_the_zookeeper_identity_is_read_from_its_file_when_asked(tmp_path: Path, ending: str) -> None:
    path = auth_file(tmp_path, f"scheduler:{SECRET}{ending}")
    settings = ZooKeeperSettings.from_env({"SCHEDULER_ZOOKEEPER_AUTH_FILE": str(path)})

    assert settings.auth_file == path
    identity = settings.identity()
    assert identity is not None
    assert (identity.user, identity.password) == ("scheduler", SECRET)
    assert identity.credential == f"scheduler:{SECRET}"
    assert SECRET not in repr(settings)
    assert SECRET not in repr(identity)


def test_without_an_auth_file_there_is_no_identity() -> None:
    assert ZooKeeperSettings.from_env({}).identity() is None


@pytest.mark.parametrize(
    ("text", "match"),
    [
        ("", "does not hold one line user:password"),
        ("\n", "does not hold one line user:password"),
        ("schedulers3cret\n", "does not hold one line user:password"),
        (f":{SECRET}\n", "does not hold one line user:password"),
        ("scheduler:\n", "does not hold one line user:password"),
        (f"scheduler:{SECRET}\nsecond:line\n", "does not hold one line user:password"),
    ],
)
def test_a_malformed_auth_file_is_named_and_its_contents_are_not_shown(tmp_path: Path, text: str,
                                                                        match: str) -> None:
    path = auth_file(tmp_path, text)
    with pytest.raises(ConfigError, match=match) as raised:
        ZooKeeperSettings(auth_file=path).identity()
    assert str(path) in str(raised.value)
    assert "s3cret" not in str(raised.value)


def test_a_missing_or_undecodable_auth_file_is_named(tmp_path: Path) -> None:
    missing = tmp_path / "nowhere"
    with pytest.raises(ConfigError, match=f"ZooKeeper auth file {missing} cannot be read: No such file"):
        ZooKeeperSettings(auth_file=missing).identity()
    binary = tmp_path / "binary"
    binary.write_bytes(b"scheduler:\xff\xfes3cret")
    with pytest.raises(ConfigError, match="is not UTF-8 text") as raised:
        ZooKeeperSettings(auth_file=binary).identity()
    assert "s3cret" not in str(raised.value) and "xff" not in str(raised.value)


def test_an_auth_file_others_may_read_is_used_with_a_warning(tmp_path: Path,
                                                             caplog: pytest.LogCaptureFixture) -> None:
    path = auth_file(tmp_path, f"scheduler:{SECRET}\n", mode=0o644)
    with caplog.at_level(logging.WARNING, logger="scheduler.settings"):
        identity = ZooKeeperSettings(auth_file=path).identity()
    assert identity is not None and identity.password == SECRET
    assert f"ZooKeeper auth file {path} may be read by other users (mode 644)" in caplog.text
    assert SECRET not in caplog.text


def test_the_environment_of_child_processes_names_the_auth_file_not_the_secret(tmp_path: Path) -> None:
    path = auth_file(tmp_path, f"scheduler:{SECRET}\n")
    zookeeper = ZooKeeperSettings(auth_file=path)
    env = environment(CassandraSettings(), KafkaSettings(), zookeeper)
    assert env["SCHEDULER_ZOOKEEPER_AUTH_FILE"] == str(path)
    assert "SCHEDULER_ZOOKEEPER_AUTH_FILE" not in environment(CassandraSettings(), KafkaSettings(),
                                                               ZooKeeperSettings())
    assert not any(SECRET in value for value in env.values())
