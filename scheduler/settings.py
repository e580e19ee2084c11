"""Connection settings for the distributed backend, read from `SCHEDULER_*` variables.

Every CLI flag that sets one of these reads the same variable, so a deployment can be
configured once in the environment. Defaults point at the local cluster that
`deploy/local/cluster.py start` runs on loopback.
"""

from __future__ import annotations

import logging
import os
import re
import stat
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scheduler.errors import ConfigError
from scheduler.model import DEFAULT_SHARD_COUNT, check_shard_count

log = logging.getLogger(__name__)

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


def read_secret(path: Path, what: str, shape: str = "one non-empty line") -> str:
    """The one-line secret in the file at `path` (a trailing newline dropped). `ConfigError`
    names the file and `what` it should hold, never what it holds. A file others may read
    is used, with a warning: the secret is already out, and refusing would only stop the
    service."""
    problem = f"{what} file {path}"
    try:
        data = path.read_bytes()
        mode = path.stat().st_mode
    except OSError as exc:
        raise ConfigError(f"{problem} cannot be read: {exc.strerror or type(exc).__name__}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise ConfigError(f"{problem} is not UTF-8 text") from None
    line = text.removesuffix("\n").removesuffix("\r")
    if not line or "\n" in line or "\r" in line:
        raise ConfigError(f"{problem} does not hold {shape}")
    if mode & (stat.S_IRWXG | stat.S_IRWXO):
        log.warning("%s may be read by other users (mode %o): chmod 600 it", problem, stat.S_IMODE(mode))
    return line


@dataclass(frozen=True)
class TlsFiles:
    """The PEM files of an encrypted connection to one server: the CA that signed the
    server's certificate (the connection is refused unless the server proves it holds a
    certificate from it for the address dialled), and, for servers that ask for one, this
    client's certificate and its private key. Paths only: the files are read when a
    connection is made."""

    ca: Path
    cert: Path | None = None
    key: Path | None = None

    def __post_init__(self) -> None:
        if (self.cert is None) != (self.key is None):
            raise ConfigError("a client certificate needs its key and a key its certificate: give both or neither")

    def check(self, server: str) -> None:
        """`ConfigError` naming the first of the files that cannot be read."""
        for label, path in (("CA", self.ca), ("certificate", self.cert), ("key", self.key)):
            if path is not None and not os.access(path, os.R_OK):
                raise ConfigError(f"the {server} TLS {label} file {path} cannot be read")

    @classmethod
    def from_env(cls, env: Mapping[str, str], prefix: str) -> TlsFiles | None:
        """`<prefix>_TLS_CA`, `_TLS_CERT` and `_TLS_KEY`; None without a CA (no TLS)."""
        ca, cert, key = (env.get(f"{prefix}_TLS_{part}") for part in ("CA", "CERT", "KEY"))
        if not ca:
            if cert or key:
                raise ConfigError(f"{prefix}_TLS_CERT and _TLS_KEY need {prefix}_TLS_CA: TLS starts from the CA "
                                  "that signed the server's certificate")
            return None
        return cls(Path(ca), Path(cert) if cert else None, Path(key) if key else None)

    def variables(self, prefix: str) -> dict[str, str]:
        """The variables `from_env` reads back into these files."""
        found = {f"{prefix}_TLS_CA": str(self.ca)}
        if self.cert is not None and self.key is not None:
            found |= {f"{prefix}_TLS_CERT": str(self.cert), f"{prefix}_TLS_KEY": str(self.key)}
        return found


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
    """A password given in code or SCHEDULER_CASSANDRA_PASSWORD; `password_file` is the
    way to give one that no process listing or log shows."""
    password_file: Path | None = None
    """A file holding the password of `username` (PasswordAuthenticator)."""
    tls: TlsFiles | None = None
    """Encrypt the connection (client_encryption_options), with these files."""
    connect_timeout_s: float = 10.0

    def __post_init__(self) -> None:
        check_keyspace(self.keyspace)
        check_replication(self.replication)
        check_shard_count(self.shard_count)
        if self.consistency not in CONSISTENCY_LEVELS:
            raise ConfigError(f"consistency {self.consistency!r} is not one of {', '.join(CONSISTENCY_LEVELS)}")
        if not self.hosts:
            raise ConfigError("at least one Cassandra contact point is needed")
        if (self.password is not None or self.password_file is not None) and not self.username:
            raise ConfigError("a Cassandra password needs a user name (SCHEDULER_CASSANDRA_USERNAME)")
        if self.password is not None and self.password_file is not None:
            raise ConfigError("give the Cassandra password once: in a file (SCHEDULER_CASSANDRA_PASSWORD_FILE) "
                              "or in SCHEDULER_CASSANDRA_PASSWORD, not both")

    def credentials(self) -> tuple[str, str] | None:
        """(user, password), the file read now (`ConfigError` if it cannot be); None
        without a user name."""
        if not self.username:
            return None
        if self.password_file is not None:
            return self.username, read_secret(self.password_file, "Cassandra password")
        return self.username, self.password or ""

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
                elif key == "password_file":
                    values[key] = Path(text)
                else:
                    values[key] = text
        if tls := TlsFiles.from_env(env, "SCHEDULER_CASSANDRA"):
            values["tls"] = tls
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
    "password_file": "SCHEDULER_CASSANDRA_PASSWORD_FILE",
}
"""The environment variable of each `CassandraSettings` field; the CLI's options read the same."""


READY_TOPICS = ("high", "normal", "low", "long")
"""The ready topics' short names: one per priority, and `long` for task types declared
long, which a separate worker pool consumes."""

READY_PARTITIONS = 8
"""Partitions of each ready topic (and, on Kafka, of the dead-letter topic) unless the
deployment says otherwise: what a worker pool's members share out."""

QUEUE_RETENTION_MS = 7 * 86_400_000
"""How long the ready and hand-off topics keep a message (Kafka's `retention.ms`, set
when the topic is made): a message is consumed within seconds, so this is the longest
the workers, or the dispatchers, may all be down before waiting messages are lost."""

DEAD_LETTER_RETENTION_MS = 30 * 86_400_000
"""How long the dead-letter topic keeps a letter: a person reads and replays them, so
longer than the queues, and a month is what an operator's weekly review can miss twice."""


SASL_MECHANISMS = ("SCRAM-SHA-512", "SCRAM-SHA-256", "PLAIN")


@dataclass(frozen=True)
class KafkaSettings:
    bootstrap: str = "127.0.0.1:9092"
    topic_prefix: str = "scheduler"
    """Every topic's name starts with this and a dot, so several deployments (or tests)
    can share one cluster."""
    connect_timeout_s: float = 10.0
    username: str | None = None
    """The SASL user to authenticate as; None: no SASL."""
    password_file: Path | None = None
    """A file holding `username`'s password."""
    sasl_mechanism: str = "SCRAM-SHA-512"
    tls: TlsFiles | None = None
    """Encrypt the connections to the brokers, with these files."""

    def __post_init__(self) -> None:
        if self.sasl_mechanism not in SASL_MECHANISMS:
            raise ConfigError(f"SASL mechanism {self.sasl_mechanism!r} is not one of {', '.join(SASL_MECHANISMS)}")
        if (self.username is None) != (self.password_file is None):
            raise ConfigError("Kafka SASL needs both a user (SCHEDULER_KAFKA_USERNAME) and a password file "
                              "(SCHEDULER_KAFKA_PASSWORD_FILE)")
        if self.username is not None and self.sasl_mechanism == "PLAIN" and self.tls is None:
            # PLAIN sends the password itself: over a plain connection, to anyone listening.
            raise ConfigError("Kafka SASL PLAIN would send the password in clear: give the brokers' CA "
                              "(SCHEDULER_KAFKA_TLS_CA) to connect over TLS, or use SCRAM-SHA-512")
        if not re.fullmatch(r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,150}", self.topic_prefix):
            raise ConfigError(
                f"topic prefix {self.topic_prefix!r} is not usable in Kafka topic names: "
                "use letters, digits, '.', '_' or '-' (at most 151)"
            )

    def ready_topic(self, name: str) -> str:
        """The ready topic for `name`, one of `READY_TOPICS`."""
        if name not in READY_TOPICS:
            raise ValueError(f"no ready topic {name!r}; there are {', '.join(READY_TOPICS)}")
        return f"{self.topic_prefix}.ready.{name}"

    @property
    def handoff_topic(self) -> str:
        """Tasks and cancels due soon, for the shard's owner: partition = shard."""
        return f"{self.topic_prefix}.handoff"

    @property
    def dead_letter_topic(self) -> str:
        return f"{self.topic_prefix}.dead"

    def worker_group(self, pool: str) -> str:
        """The consumer group of a worker pool (`default`: high, normal and low; `long`)."""
        return f"{self.topic_prefix}.workers.{pool}"

    @property
    def dispatcher_group(self) -> str:
        """The consumer group under which dispatchers commit their hand-off positions."""
        return f"{self.topic_prefix}.dispatchers"

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **overrides: object) -> KafkaSettings:
        values: dict[str, object] = {}
        if text := env.get("SCHEDULER_KAFKA_BOOTSTRAP"):
            values["bootstrap"] = text
        if text := env.get("SCHEDULER_TOPIC_PREFIX"):
            values["topic_prefix"] = text
        if text := env.get("SCHEDULER_KAFKA_USERNAME"):
            values["username"] = text
        if text := env.get("SCHEDULER_KAFKA_PASSWORD_FILE"):
            values["password_file"] = Path(text)
        if text := env.get("SCHEDULER_KAFKA_SASL_MECHANISM"):
            values["sasl_mechanism"] = text
        if tls := TlsFiles.from_env(env, "SCHEDULER_KAFKA"):
            values["tls"] = tls
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]


@dataclass(frozen=True)
class ZooKeeperIdentity:
    """The digest identity (`user:password`) the scheduler authenticates as, and the only
    one its ACLs let create, change or delete its znodes."""

    user: str
    password: str = field(repr=False)

    @property
    def credential(self) -> str:
        """`user:password`, as ZooKeeper's digest scheme takes it."""
        return f"{self.user}:{self.password}"


def read_zookeeper_identity(path: Path) -> ZooKeeperIdentity:
    """The identity in the file at `path`: one line `user:password` (a trailing newline is
    dropped; the user holds no ':', the password may). `ConfigError` names the file and
    what is wrong with it, never what it holds. A file others may read is used, with a
    warning."""
    shape = "one line user:password (a user name without ':', then a non-empty password)"
    user, colon, password = read_secret(path, "ZooKeeper auth", shape).partition(":")
    if not colon or not user or not password:
        raise ConfigError(f"ZooKeeper auth file {path} does not hold {shape}")
    return ZooKeeperIdentity(user, password)


@dataclass(frozen=True)
class ZooKeeperSettings:
    hosts: str = "127.0.0.1:2181"
    root: str = "/scheduler"
    session_timeout_s: float = 10.0
    """The lease timeout: how long after a dispatcher dies (or pauses, or is cut off) its
    shards become free for others."""
    connect_timeout_s: float = 10.0
    auth_file: Path | None = None
    """A file holding `user:password`: the digest identity to authenticate as, and to
    restrict the scheduler's znodes to (`identity`). None: no authentication, and the
    znodes are open to anyone, as ZooKeeper makes them by default. Only the path is kept
    here; the file is read when a connection is made."""
    tls: TlsFiles | None = None
    """Encrypt the connection (ZooKeeper's secureClientPort), with these files."""

    def __post_init__(self) -> None:
        if not self.root.startswith("/") or self.root.endswith("/") and self.root != "/":
            raise ConfigError(f"ZooKeeper root {self.root!r} must start with '/' and not end with one")
        if not 0.5 <= self.session_timeout_s <= 600:
            raise ConfigError(f"session timeout {self.session_timeout_s} s is outside 0.5..600 s")

    def identity(self) -> ZooKeeperIdentity | None:
        """The identity of `auth_file`, read now (`ConfigError` if it cannot be), or None
        without one."""
        return None if self.auth_file is None else read_zookeeper_identity(self.auth_file)

    @classmethod
    def from_env(cls, env: Mapping[str, str] = os.environ, **overrides: object) -> ZooKeeperSettings:
        values: dict[str, object] = {}
        if text := env.get("SCHEDULER_ZOOKEEPER_HOSTS"):
            values["hosts"] = text
        if text := env.get("SCHEDULER_ZOOKEEPER_ROOT"):
            values["root"] = text
        if text := env.get("SCHEDULER_ZOOKEEPER_AUTH_FILE"):
            values["auth_file"] = Path(text)
        if tls := TlsFiles.from_env(env, "SCHEDULER_ZOOKEEPER"):
            values["tls"] = tls
        if text := env.get("SCHEDULER_LEASE_TIMEOUT_S"):
            try:
                values["session_timeout_s"] = float(text)
            except ValueError:
                raise ConfigError(f"SCHEDULER_LEASE_TIMEOUT_S={text!r} is not a number of seconds") from None
        values.update({key: value for key, value in overrides.items() if value is not None})
        return cls(**values)  # type: ignore[arg-type]


def environment(cassandra: CassandraSettings, kafka: KafkaSettings, zookeeper: ZooKeeperSettings) -> dict[str, str]:
    """The `SCHEDULER_*` variables that make a `scheduler` process started with them find
    these servers, keyspace, topics and ZooKeeper root, and connect as these do: the paths
    of the secret and certificate files, never what a file holds. A password given other
    than in a file is passed on in SCHEDULER_CASSANDRA_PASSWORD."""
    security: dict[str, str] = {}
    if cassandra.username:
        security["SCHEDULER_CASSANDRA_USERNAME"] = cassandra.username
    if cassandra.password_file is not None:
        security["SCHEDULER_CASSANDRA_PASSWORD_FILE"] = str(cassandra.password_file)
    elif cassandra.password is not None:
        security["SCHEDULER_CASSANDRA_PASSWORD"] = cassandra.password
    if cassandra.tls is not None:
        security |= cassandra.tls.variables("SCHEDULER_CASSANDRA")
    if kafka.username is not None and kafka.password_file is not None:
        security |= {"SCHEDULER_KAFKA_USERNAME": kafka.username,
                     "SCHEDULER_KAFKA_PASSWORD_FILE": str(kafka.password_file),
                     "SCHEDULER_KAFKA_SASL_MECHANISM": kafka.sasl_mechanism}
    if kafka.tls is not None:
        security |= kafka.tls.variables("SCHEDULER_KAFKA")
    if zookeeper.auth_file is not None:
        security["SCHEDULER_ZOOKEEPER_AUTH_FILE"] = str(zookeeper.auth_file)
    if zookeeper.tls is not None:
        security |= zookeeper.tls.variables("SCHEDULER_ZOOKEEPER")
    return {
        "SCHEDULER_CASSANDRA_HOSTS": ",".join(cassandra.hosts),
        "SCHEDULER_CASSANDRA_PORT": str(cassandra.port),
        "SCHEDULER_KEYSPACE": cassandra.keyspace,
        "SCHEDULER_SHARDS_TOTAL": str(cassandra.shard_count),
        "SCHEDULER_KAFKA_BOOTSTRAP": kafka.bootstrap,
        "SCHEDULER_TOPIC_PREFIX": kafka.topic_prefix,
        "SCHEDULER_ZOOKEEPER_HOSTS": zookeeper.hosts,
        "SCHEDULER_ZOOKEEPER_ROOT": zookeeper.root,
        **security,
    }


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
