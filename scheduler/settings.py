"""Connection settings for the distributed backend, read from `SCHEDULER_*` variables.

Every CLI flag that sets one of these reads the same variable, so a deployment can be
configured once in the environment. Defaults point at the local cluster that
`deploy/local/cluster.py start` runs on loopback.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from dataclasses import dataclass, field

from scheduler.errors import ConfigError
from scheduler.model import DEFAULT_SHARD_COUNT, check_shard_count

LOCAL_REPLICATION = "{'class': 'SimpleStrategy', 'replication_factor': 1}"

CONSISTENCY_LEVELS = ("ONE", "TWO", "THREE", "QUORUM", "ALL", "LOCAL_QUORUM", "EACH_QUORUM", "LOCAL_ONE")

_IDENTIFIER = re.compile(r"[a-z][a-z0-9_]{0,47}")


def check_keyspace(name: str) -> str:
    """A keyspace name we can splice into CQL: lower-case, unquoted, at most 48 chars."""
    if not _IDENTIFIER.fullmatch(name):
        raise ConfigError(
            f"keyspace {name!r} is not usable: start with a lower-case letter, then up to 47 "
            "lower-case letters, digits or underscores"
        )
    return name


def check_replication(text: str) -> str:
    """A CQL replication map, checked only for shape: Cassandra judges its contents."""
    stripped = text.strip()
    if not (stripped.startswith("{") and stripped.endswith("}")) or ";" in stripped or "'class'" not in stripped:
        raise ConfigError(
            f"replication {text!r} is not a CQL map with a 'class', e.g. "
            "{'class': 'NetworkTopologyStrategy', 'dc1': 3}"
        )
    return stripped


@dataclass(frozen=True)
class CassandraSettings:
    hosts: tuple[str, ...] = ("127.0.0.1",)
    port: int = 9042
    keyspace: str = "scheduler"
    replication: str = LOCAL_REPLICATION
    consistency: str = "LOCAL_QUORUM"
    local_dc: str | None = None
    shard_count: int = DEFAULT_SHARD_COUNT
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check_keyspace(self.keyspace)
        check_replication(self.replication)
        check_shard_count(self.shard_count)
        if self.consistency not in CONSISTENCY_LEVELS:
            raise ConfigError(f"consistency {self.consistency!r} is not one of {', '.join(CONSISTENCY_LEVELS)}")
        if not self.hosts:
            raise ConfigError("at least one Cassandra contact point is needed")

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **overrides: object) -> CassandraSettings:
        """Settings from the variables in `CASSANDRA_ENV`; keyword overrides win over them."""
        values: dict[str, object] = {}
        for key, variable in CASSANDRA_ENV.items():
            if text := env.get(variable):
                if key == "hosts":
                    values[key] = split_hosts(text)
                elif key in ("port", "shard_count"):
                    values[key] = parse_int(variable, text)
                else:
                    values[key] = text
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]


CASSANDRA_ENV = {
    "hosts": "SCHEDULER_CASSANDRA_HOSTS",
    "port": "SCHEDULER_CASSANDRA_PORT",
    "keyspace": "SCHEDULER_KEYSPACE",
    "replication": "SCHEDULER_REPLICATION",
    "consistency": "SCHEDULER_CONSISTENCY",
    "local_dc": "SCHEDULER_CASSANDRA_LOCAL_DC",
    "shard_count": "SCHEDULER_SHARDS_TOTAL",
    "username": "SCHEDULER_CASSANDRA_USERNAME",
    "password": "SCHEDULER_CASSANDRA_PASSWORD",
}
"""The environment variable of each `CassandraSettings` field; the CLI's options read the same."""


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = "127.0.0.1:9092"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> KafkaSettings:
        return cls(bootstrap=env.get("SCHEDULER_KAFKA_BOOTSTRAP") or cls.bootstrap)


@dataclass(frozen=True)
class ZooKeeperSettings:
    hosts: str = "127.0.0.1:2181"
    root: str = "/scheduler"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ) -> ZooKeeperSettings:
        return cls(
            hosts=env.get("SCHEDULER_ZOOKEEPER_HOSTS") or cls.hosts,
            root=env.get("SCHEDULER_ZOOKEEPER_ROOT") or cls.root,
        )


def split_hosts(text: str) -> tuple[str, ...]:
    hosts = tuple(part.strip() for part in text.split(",") if part.strip())
    if not hosts:
        raise ConfigError(f"no host names in {text!r}: give a comma-separated list such as 10.0.0.1,10.0.0.2")
    return hosts


def parse_int(name: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{name}={text!r} is not an integer") from None
