"""What each local server is: its files, its JVM command line and its readiness probe.

A cluster has `nodes` nodes of each server (1, the default, or 3 or 5). Node n of a
server listens on its own loopback address (the base host with n - 1 added to its last
number: 127.0.1.1, 127.0.1.2, ...) on the same ports as the others, and is named
``<server>-<n>`` (``cassandra-2``); a single node keeps the plain name (``cassandra``).
Every node of a server runs from the same jars. With 3 or more nodes: Cassandra's nodes
are all seeds and start as one new ring (each its own token, no bootstrap streaming);
Kafka's are broker and controller each, in one static KRaft quorum, with topics
replicated 3 times and 2 in sync to acknowledge; ZooKeeper's form one ensemble.

Owns the generated configuration under ``<cluster_dir>/<server>/conf/`` (rewritten
at every start, so a changed setting such as a port takes effect on the next start)
and, for Kafka, the one-time formatting of the KRaft storage.

How it fails: ``jvm_command`` raises ClusterError when the jars or the Kafka format
step are broken; ``probe`` raises NotReady whenever a real client request does not
answer (an open port alone never counts: a ZooKeeper whose server thread died still
listens and says ``imok``).

The settings relaxed for a fast test node, and what production uses instead, are
tabled in deploy/README.md.
"""
from __future__ import annotations

import base64
import importlib
import json
import os
import socket
import ssl
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING, Any, ClassVar

if TYPE_CHECKING:
    from credentials import Credentials


class ClusterError(Exception):
    """A failure cluster.py reports as one message and an exit code."""

    exit_code = 1


class NotReady(Exception):
    """A probe found the server not (yet) answering."""


@dataclass(frozen=True)
class Settings:
    cluster_dir: Path
    host: str
    """The first node's address; node n listens on this address plus n - 1."""
    cassandra_port: int
    cassandra_storage_port: int
    kafka_port: int
    kafka_controller_port: int
    zookeeper_port: int
    maven_repo: Path | None
    nodes: int = 1
    zookeeper_peer_port: int = 2888
    zookeeper_election_port: int = 3888
    secure: bool = False
    """Authentication and TLS on every server (one node each), with the certificates and
    passwords of credentials.py: a cluster of its own, beside the plain one."""

    def node_host(self, node: int) -> str:
        return node_host(self.host, node)

    @property
    def home_root(self) -> Path:
        """Where the nodes' own directories are: the secure cluster's apart from the
        plain one's, so both can exist (and run) at once; the jars are shared."""
        return self.cluster_dir / "secure" if self.secure else self.cluster_dir

    @property
    def credentials(self) -> Credentials:
        from credentials import Credentials  # credentials.py imports this module

        return Credentials(self.home_root / "secrets")


def node_host(base: str, node: int) -> str:
    """`base` with `node - 1` added to its last number: 127.0.1.1 -> 127.0.1.3 for node 3."""
    if node == 1:
        return base
    parts = base.split(".")
    if len(parts) != 4 or not all(part.isdigit() for part in parts) or int(parts[3]) + node - 1 > 254:
        raise ClusterError(f"{base!r} is not an IPv4 address with room for {node} nodes after it: give the "
                           "first node's address, e.g. --host 127.0.1.1 (every 127.x.y.z is loopback on Linux)")
    return ".".join([*parts[:3], str(int(parts[3]) + node - 1)])


class Server:
    """One node of one server of the local cluster, laid out under ``settings.cluster_dir``."""

    kind: ClassVar[str]
    main_class: ClassVar[str]
    # (role, the Settings field holding its port); the first role is the client port.
    port_fields: ClassVar[tuple[tuple[str, str], ...]]

    def __init__(self, settings: Settings, node: int = 1) -> None:
        self.settings = settings
        self.node = node
        self.name = self.kind if settings.nodes == 1 else f"{self.kind}-{node}"
        self.host = settings.node_host(node)
        self.home = settings.home_root / self.name
        self.lib = settings.cluster_dir / "lib" / self.kind
        self.conf = self.home / "conf"
        self.data = self.home / "data"
        self.log_file = self.home / "server.log"
        self.pid_file = self.home / "pid.json"

    @property
    def classpath(self) -> str:
        """The JVM expands ``dir/*``: every node of a server of this cluster dir has it."""
        return f"{self.lib}/*"

    @property
    def marker(self) -> str:
        """An argument only this node's JVM has (its config directory): with the main
        class and the classpath, it tells our JVM from any other process."""
        return str(self.conf)

    @property
    def peers(self) -> list[Server]:
        """Every node of this server, this one included."""
        return [type(self)(self.settings, node) for node in range(1, self.settings.nodes + 1)]

    def ports(self) -> dict[str, int]:
        return {role: getattr(self.settings, field) for role, field in self.port_fields}

    def jvm_command(self, java: str) -> list[str]:
        """Writes this server's config files and returns its full command line."""
        raise NotImplementedError

    def probe(self, host: str, ports: dict[str, int], timeout_s: float) -> None:
        """Returns once a real client request answered; raises NotReady otherwise."""
        raise NotImplementedError

    def provision(self, timeout_s: float) -> None:
        """Once the server answers, at every start: makes what the secure cluster's
        clients need on it (users, roles, ACLs), idempotently. Nothing by default."""


# Every JVM dies on OutOfMemoryError instead of limping on: `status` then says "down".
COMMON_JVM_FLAGS = ("-XX:+UseG1GC", "-XX:+ExitOnOutOfMemoryError", "-Djava.awt.headless=true")

LOGBACK_XML = """\
<!-- Generated by deploy/local/cluster.py: INFO to stdout, which start sends to server.log. -->
<configuration>
  <appender name="STDOUT" class="ch.qos.logback.core.ConsoleAppender">
    <encoder><pattern>%d{ISO8601} %-5level [%thread] %logger{36} - %msg%n</pattern></encoder>
  </appender>
  <root level="INFO"><appender-ref ref="STDOUT"/></root>
</configuration>
"""

# The JPMS section of Cassandra's conf/jvm17-server.options: Cassandra reaches into JDK
# internals (jamm's object sizing, off-heap buffers, JMX, the UDF security manager).
CASSANDRA_JVM17_FLAGS: tuple[str, ...] = (
    "-Djdk.attach.allowAttachSelf=true",
    *(f"--add-exports={package}=ALL-UNNAMED" for package in (
        "java.base/jdk.internal.misc",
        "java.management.rmi/com.sun.jmx.remote.internal.rmi",
        "java.rmi/sun.rmi.registry",
        "java.rmi/sun.rmi.server",
        "java.sql/java.sql",
        "java.base/java.lang.ref",
        "jdk.unsupported/sun.misc",
        "jdk.compiler/com.sun.tools.javac.file",
        "jdk.attach/sun.tools.attach",
    )),
    *(f"--add-opens={package}=ALL-UNNAMED" for package in (
        "java.base/java.lang.module",
        "java.base/jdk.internal.loader",
        "java.base/jdk.internal.ref",
        "java.base/jdk.internal.reflect",
        "java.base/jdk.internal.math",
        "java.base/jdk.internal.module",
        "java.base/jdk.internal.util.jar",
        "jdk.management/com.sun.management.internal",
        "java.base/sun.nio.ch",
        "java.base/java.io",
        "java.base/java.lang.reflect",
        "jdk.compiler/com.sun.tools.javac",
        "java.base/java.lang",
        "java.base/java.util",
    )),
    "-Dio.netty.tryReflectionSetAccessible=true",
)

GENERATED = "Generated by deploy/local/cluster.py at every start: edits are overwritten."


class Cassandra(Server):
    kind = "cassandra"
    main_class = "org.apache.cassandra.service.CassandraDaemon"
    port_fields = (("native", "cassandra_port"), ("storage", "cassandra_storage_port"))

    def jvm_command(self, java: str) -> list[str]:
        config = self.conf / "cassandra.yaml"
        logback = self.conf / "logback.xml"
        config.write_text(self._yaml())
        logback.write_text(LOGBACK_XML)
        # No JMX property is set, so Cassandra opens no JMX port (7199) to clash on;
        # nodetool is unavailable, which the project does not use.
        return [
            java, *CASSANDRA_JVM17_FLAGS, *COMMON_JVM_FLAGS,
            f"-javaagent:{self._jamm_jar()}",
            "-Xms512m", "-Xmx1g",
            "-Dcassandra-foreground=yes",
            f"-Dcassandra.config={config.as_uri()}",
            f"-Dcassandra.storagedir={self.data}",
            f"-Dlogback.configurationFile={logback}",
            # A test ring made all at once: no gossip to settle, no ring to wait for.
            # (Not unsafesystem: schema writes must reach the commit log, or a server
            # killed with SIGKILL forgets the keyspaces it had acknowledged.)
            "-Dcassandra.skip_wait_for_gossip_to_settle=0",
            "-Dcassandra.ring_delay_ms=0",
            # The secure cluster's default superuser is made at once, not 10 s after start,
            # so that provisioning can log in as soon as the node answers.
            *(["-Dcassandra.superuser_setup_delay_ms=0"] if self.settings.secure else []),
            "-cp", self.classpath, self.main_class,
        ]

    def _jamm_jar(self) -> Path:
        jars = sorted(self.lib.glob("jamm-*.jar"))
        if not jars:
            raise ClusterError(f"no jamm-*.jar in {self.lib}: run `cluster.py fetch` again")
        return jars[0]

    def _yaml(self) -> str:
        host, ports = self.host, self.ports()
        seeds = ",".join(f"{peer.host}:{ports['storage']}" for peer in self.peers)
        ring = ""
        if self.settings.nodes > 1:
            # A new ring of evenly spaced tokens, one per node, made by starting every node
            # at once: nothing to stream, so no node bootstraps. A node that restarts keeps
            # its token and data and catches up from hints (and repair).
            ring = (f"initial_token: {ring_token(self.node, self.settings.nodes)}\n"
                    "auto_bootstrap: false\n")

        # Each cluster a name of its own: nodes of two clusters never gossip with each other.
        name = "scheduler-local" if self.settings.nodes == 1 else f"scheduler-local-{self.settings.nodes}-nodes"
        if self.settings.secure:
            name = "scheduler-local-secure"

        def path(sub: str) -> str:  # a JSON string is valid YAML, whatever the path holds
            return json.dumps(str(self.data / sub))

        return f"""\
# {GENERATED}
cluster_name: {name}
num_tokens: 1
partitioner: org.apache.cassandra.dht.Murmur3Partitioner
endpoint_snitch: SimpleSnitch
commitlog_sync: periodic
commitlog_sync_period: 10000ms
data_file_directories:
  - {path("data")}
commitlog_directory: {path("commitlog")}
saved_caches_directory: {path("saved_caches")}
hints_directory: {path("hints")}
cdc_raw_directory: {path("cdc_raw")}
listen_address: {host}
rpc_address: {host}
storage_port: {ports["storage"]}
native_transport_port: {ports["native"]}
start_native_transport: true
# The tests create and drop a keyspace each: no snapshot on every DROP and TRUNCATE.
auto_snapshot: false
{ring}seed_provider:
  - class_name: org.apache.cassandra.locator.SimpleSeedProvider
    parameters:
      - seeds: "{seeds}"
{self._security_yaml() if self.settings.secure else ""}"""

    def _security_yaml(self) -> str:
        """The secure cluster's: a password for every client, permissions per role, and TLS
        with a client certificate from the local CA on both the CQL and the storage port
        (PEM files, as credentials.py makes them: the key is unencrypted, so no keystore
        password)."""
        credentials = self.settings.credentials
        bundle, ca = json.dumps(str(credentials.server_bundle(self.host))), json.dumps(str(credentials.ca))
        pem = f"""ssl_context_factory:
    class_name: org.apache.cassandra.security.PEMBasedSslContextFactory
  keystore: {bundle}
  truststore: {ca}
  require_client_auth: true"""
        return f"""\
# Every client logs in (PasswordAuthenticator) as a role, which may do only what it was
# granted (CassandraAuthorizer).
authenticator:
  class_name: org.apache.cassandra.auth.PasswordAuthenticator
authorizer:
  class_name: org.apache.cassandra.auth.CassandraAuthorizer
role_manager:
  class_name: org.apache.cassandra.auth.CassandraRoleManager
# CQL clients: TLS only, each with a certificate the local CA signed.
client_encryption_options:
  enabled: true
  optional: false
  {pem}
# Node to node, as production runs it (with one node, nothing to talk to yet).
server_encryption_options:
  internode_encryption: all
  optional: false
  require_endpoint_verification: true
  {pem}
"""

    def probe(self, host: str, ports: dict[str, int], timeout_s: float) -> None:
        require_open(host, ports["native"])
        if not self.settings.secure:
            self._query(host, ports["native"], timeout_s, None)
            return
        # Over TLS, with the client certificate, as the superuser: with the password
        # provisioning gave it, or, before the first provisioning, Cassandra's default.
        refused = []
        for login in self._admin_logins():
            try:
                self._query(host, ports["native"], timeout_s, login)
                return
            except NotReady as exc:
                if not refused_login(exc):
                    raise
                refused.append(str(exc))
        raise NotReady(f"the superuser's logins were refused: {'; '.join(refused)}")

    def _admin_logins(self) -> list[tuple[str, str]]:
        credentials = self.settings.credentials
        return [(CASSANDRA_SUPERUSER, credentials.password("cassandra-admin")),
                (CASSANDRA_SUPERUSER, CASSANDRA_DEFAULT_PASSWORD)]

    def _connect(self, host: str, port: int, timeout_s: float, login: tuple[str, str] | None) -> tuple[Any, Any]:
        """(cluster, session) on this node alone; over TLS with the client certificate,
        and logged in as `login`, on the secure cluster. NotReady if it cannot be made."""
        driver = import_client("cassandra.cluster", "cassandra-driver")
        policies = import_client("cassandra.policies", "cassandra-driver")
        profile = driver.ExecutionProfile(
            load_balancing_policy=policies.WhiteListRoundRobinPolicy([host]),
            request_timeout=timeout_s,
        )
        security: dict[str, object] = {}
        if self.settings.secure:
            auth = import_client("cassandra.auth", "cassandra-driver")
            security["ssl_context"] = client_tls_context(self.settings.credentials)
            if login is not None:
                security["auth_provider"] = auth.PlainTextAuthProvider(*login)
        cluster = driver.Cluster(
            [host], port=port, connect_timeout=timeout_s,
            control_connection_timeout=timeout_s,
            execution_profiles={driver.EXEC_PROFILE_DEFAULT: profile},
            **security,
        )
        try:
            return cluster, cluster.connect()
        except Exception as exc:  # NoHostAvailable, OperationTimedOut, ...
            cluster.shutdown()
            raise NotReady(f"CQL connection failed: {exc}") from exc

    def _query(self, host: str, port: int, timeout_s: float, login: tuple[str, str] | None) -> None:
        cluster, session = self._connect(host, port, timeout_s, login)
        try:
            session.execute("SELECT release_version FROM system.local").one()
        except Exception as exc:  # OperationTimedOut, Unavailable, ...
            raise NotReady(f"CQL query failed: {exc}") from exc
        finally:
            cluster.shutdown()

    def provision(self, timeout_s: float) -> None:
        """The secure cluster's roles, made or brought up to date at every start: the
        superuser `cassandra` given the password of cassandra-admin.password (in place of
        Cassandra's well-known default), and the scheduler's own login role, not a
        superuser, with every permission on every keyspace (its tests make and drop
        keyspaces, `schema apply` makes tables, and it reads and writes them) and no
        power over roles."""
        if not self.settings.secure:
            return
        deadline = time.monotonic() + timeout_s
        credentials = self.settings.credentials
        admin_password = credentials.password("cassandra-admin")
        host, port = self._running_address()
        last = "no attempt yet"
        while time.monotonic() < deadline:
            try:
                self._provision_once(host, port, admin_password, credentials.password("cassandra-scheduler"),
                                     min(PROVISION_STEP_S, max(deadline - time.monotonic(), 1.0)))
                return
            except NotReady as exc:
                last = str(exc)
            time.sleep(1.0)
        raise ClusterError(f"{self.name}: its roles could not be provisioned in time; last attempt: {last}")

    def _running_address(self) -> tuple[str, int]:
        """Where this node's CQL port is: as its pid.json records it (a node already running
        keeps the address it was started with), else as the settings say."""
        try:
            record = json.loads(self.pid_file.read_text())
            return str(record["host"]), int(record["ports"]["native"])
        except (OSError, ValueError, KeyError, TypeError):
            return self.host, self.ports()["native"]

    def _provision_once(self, host: str, port: int, admin_password: str, scheduler_password: str,
                        timeout_s: float) -> None:
        admin = (CASSANDRA_SUPERUSER, admin_password)
        try:
            cluster, session = self._connect(host, port, timeout_s, admin)
        except NotReady as exc:
            if not refused_login(exc):
                raise
            # The first start: still the default password; replace it, then log in anew.
            cluster, session = self._connect(host, port, timeout_s, (CASSANDRA_SUPERUSER, CASSANDRA_DEFAULT_PASSWORD))
            try:
                session.execute(f"ALTER ROLE {CASSANDRA_SUPERUSER} WITH PASSWORD = %s",
                                (admin_password,))
            except Exception as failure:
                raise NotReady(f"changing the superuser's password failed: {failure}") from failure
            finally:
                cluster.shutdown()
            cluster, session = self._connect(host, port, timeout_s, admin)
        try:
            for statement, values in (
                (f"CREATE ROLE IF NOT EXISTS {SCHEDULER_ROLE} WITH PASSWORD = %s AND LOGIN = true "
                 "AND SUPERUSER = false", (scheduler_password,)),
                (f"ALTER ROLE {SCHEDULER_ROLE} WITH PASSWORD = %s AND LOGIN = true AND SUPERUSER = false",
                 (scheduler_password,)),
                (f"GRANT ALL PERMISSIONS ON ALL KEYSPACES TO {SCHEDULER_ROLE}", ()),
            ):
                session.execute(statement, values)
        except Exception as exc:
            raise NotReady(f"provisioning the {SCHEDULER_ROLE} role failed: {exc}") from exc
        finally:
            cluster.shutdown()


CASSANDRA_SUPERUSER = "cassandra"
CASSANDRA_DEFAULT_PASSWORD = "cassandra"
"""Cassandra's default superuser, made at a new cluster's first start with this
well-known password, which the secure cluster's provisioning replaces at once."""

SCHEDULER_ROLE = "scheduler"
PROVISION_STEP_S = 30.0


def refused_login(exc: BaseException) -> bool:
    """Whether the server answered a login with "bad credentials" (an AuthenticationFailed
    in the driver's per-host errors), rather than not answering at all."""
    cause = exc.__cause__ or exc
    errors = getattr(cause, "errors", None) or {}
    return any(type(error).__name__ == "AuthenticationFailed" for error in errors.values())


def client_tls_context(credentials: Credentials) -> ssl.SSLContext:
    """TLS that trusts only the local CA, checks the server's address against its
    certificate, and presents the scheduler's client certificate."""
    context = ssl.create_default_context(cafile=str(credentials.ca))
    context.load_cert_chain(str(credentials.client_cert), str(credentials.client_key))
    return context


class Kafka(Server):
    kind = "kafka"
    main_class = "kafka.Kafka"
    port_fields = (("broker", "kafka_port"), ("controller", "kafka_controller_port"))

    def jvm_command(self, java: str) -> list[str]:
        config = self.conf / "server.properties"
        config.write_text(self._properties())
        config.chmod(0o600)  # the secure cluster's holds the brokers' own password
        jvm = [
            java, *COMMON_JVM_FLAGS, "-Xmx512m",
            # kafka_2.13 4.1.1 logs through slf4j-api 1.7; slf4j-simple writes to stderr.
            "-Dorg.slf4j.simpleLogger.defaultLogLevel=info",
            "-Dorg.slf4j.simpleLogger.showDateTime=true",
            "-Dorg.slf4j.simpleLogger.dateTimeFormat=yyyy-MM-dd'T'HH:mm:ss.SSS",
            # Each config dump is ~300 lines (the broker's own is in conf/server.properties).
            "-Dorg.slf4j.simpleLogger.log.org.apache.kafka.common.config.AbstractConfig=warn",
            "-cp", self.classpath,
        ]
        if not self.formatted:
            self._format(jvm, config)
        elif self.settings.secure and not self.secure_marker.exists():
            raise ClusterError(f"{self.name}'s storage in {self.data} was formatted without the secure cluster's "
                               "SCRAM users, so its brokers could not authenticate to each other: run "
                               "`cluster.py wipe --secure` and start again")
        return [*jvm, self.main_class, str(config)]

    @property
    def formatted(self) -> bool:
        return (self.data / "meta.properties").exists()

    @property
    def secure_marker(self) -> Path:
        """Written when the storage is formatted with the secure cluster's SCRAM users:
        a node formatted without them could never authenticate its own inter-broker
        connections."""
        return self.home / "formatted-secure"

    def cluster_id(self) -> str | None:
        """The KRaft cluster id this node's storage was formatted with."""
        try:
            text = (self.data / "meta.properties").read_text()
        except OSError:
            return None
        for line in text.splitlines():
            if line.startswith("cluster.id="):
                return line.split("=", 1)[1].strip()
        return None

    def _format(self, jvm: list[str], config: Path) -> None:
        """Formats the KRaft storage once. A single node: a new cluster id, itself the only
        voter. Several: the cluster id of a node formatted before (or a new one if none
        is), so that every node joins the same cluster; the voters are in the config."""
        if self.settings.nodes == 1:
            command = ["-t", kafka_cluster_id(), "--standalone"]
        else:
            known = [peer.cluster_id() for peer in self.peers]
            command = ["-t", next((found for found in known if found), None) or self.shared_cluster_id()]
        if self.settings.secure:
            # The brokers' own user must exist before the first start (inter-broker traffic
            # authenticates as it); the scheduler's users are made with it. `provision`
            # sets them again at every start, so a changed password file takes effect.
            credentials = self.settings.credentials
            for user in KAFKA_USERS:
                password = credentials.password(f"kafka-{user}")
                command += ["--add-scram", f"SCRAM-SHA-512=[name={user},password={password}]"]
        output = run_tool([*jvm, "kafka.tools.StorageTool", "format", *command, "-c", str(config)],
                          shown=7 if not self.settings.secure else 0)
        with self.log_file.open("a") as log:
            log.write(output)
        if self.settings.secure:
            self.secure_marker.write_text("formatted with the SCRAM users of the secure cluster\n")

    def shared_cluster_id(self) -> str:
        """A new cluster id for a cluster none of whose nodes is formatted yet: made once,
        in a file every node's format reads (nodes are started concurrently)."""
        path = self.settings.cluster_dir / f"kafka-{self.settings.nodes}-nodes.cluster-id"
        # Written whole, then linked into place: a node that loses the race reads the
        # winner's id, never a file still being written.
        mine = path.with_name(f"{path.name}.{self.node}")
        mine.write_text(kafka_cluster_id() + "\n")
        try:
            os.link(mine, path)
        except FileExistsError:
            pass
        finally:
            mine.unlink()
        return path.read_text().strip()

    def _properties(self) -> str:
        host, ports = self.host, self.ports()
        listeners = f"PLAINTEXT://{host}:{ports['broker']},CONTROLLER://{host}:{ports['controller']}"
        nodes = self.settings.nodes
        quorum = ({"controller.quorum.bootstrap.servers": f"{host}:{ports['controller']}"} if nodes == 1 else
                  {"controller.quorum.voters": ",".join(f"{peer.node}@{peer.host}:{ports['controller']}"
                                                        for peer in self.peers)})
        replicas, in_sync = ("1", "1") if nodes == 1 else ("3", "2")
        properties = {
            "process.roles": "broker,controller",
            "node.id": str(self.node),
            **quorum,
            "listeners": listeners,
            "advertised.listeners": listeners,
            "controller.listener.names": "CONTROLLER",
            "listener.security.protocol.map": "PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT",
            "inter.broker.listener.name": "PLAINTEXT",
            "log.dirs": str(self.data),
            # One broker: replication factor 1. Three or more: every partition on three
            # brokers, and an acks=all write acknowledged once two have it, as in production.
            # A single partition for internal topics either way.
            "num.partitions": "1",
            "default.replication.factor": replicas,
            "min.insync.replicas": in_sync,
            "offsets.topic.replication.factor": replicas,
            "offsets.topic.num.partitions": "1",
            "transaction.state.log.replication.factor": replicas,
            "transaction.state.log.min.isr": in_sync,
            "transaction.state.log.num.partitions": "1",
            "share.coordinator.state.topic.replication.factor": replicas,
            "share.coordinator.state.topic.min.isr": in_sync,
            "share.coordinator.state.topic.num.partitions": "1",
            # A replica that fell behind never becomes leader: no acknowledged message is lost.
            "unclean.leader.election.enable": "false",
            "group.initial.rebalance.delay.ms": "0",
            # Topics are created explicitly, as in production.
            "auto.create.topics.enable": "false",
        }
        if self.settings.secure:
            properties |= self._security()
        return f"# {GENERATED}\n" + "".join(f"{key}={value}\n" for key, value in properties.items())

    def _security(self) -> dict[str, str]:
        """Clients on SASL_SSL (SCRAM-SHA-512 over TLS, a client certificate required);
        the brokers as `admin` on the same listener; the KRaft controller on mutual TLS,
        the node's own certificate its principal (SCRAM is not offered there). ACLs
        decide the rest, and with no ACL nothing is allowed."""
        host, ports = self.host, self.ports()
        credentials = self.settings.credentials
        listeners = f"SASL_SSL://{host}:{ports['broker']},CONTROLLER://{host}:{ports['controller']}"
        admin_password = credentials.password("kafka-admin")
        return {
            "listeners": listeners,
            "advertised.listeners": listeners,
            "listener.security.protocol.map": "SASL_SSL:SASL_SSL,CONTROLLER:SSL",
            "inter.broker.listener.name": "SASL_SSL",
            "sasl.enabled.mechanisms": "SCRAM-SHA-512",
            "sasl.mechanism.inter.broker.protocol": "SCRAM-SHA-512",
            "listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config":
                "org.apache.kafka.common.security.scram.ScramLoginModule required "
                f'username="{KAFKA_ADMIN}" password="{admin_password}";',
            "ssl.keystore.type": "PEM",
            "ssl.keystore.location": str(credentials.server_bundle(host)),
            "ssl.truststore.type": "PEM",
            "ssl.truststore.location": str(credentials.ca),
            # Per listener: a broker-wide ssl.client.auth applies to SSL listeners only.
            "listener.name.sasl_ssl.ssl.client.auth": "required",
            "listener.name.controller.ssl.client.auth": "required",
            "authorizer.class.name": "org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found": "false",
            "super.users": f"User:{KAFKA_ADMIN};User:{self.controller_principal}",
        }

    @property
    def controller_principal(self) -> str:
        """The name Kafka gives a peer that proves itself with this node's certificate on
        the SSL controller listener: its subject's distinguished name."""
        return f"CN={self.host}"

    def client_config(self, user: str = "admin") -> dict[str, object]:
        """librdkafka settings for a client of this node, as `user` on the secure
        cluster (with the scheduler's client certificate), with none on the plain one."""
        host, ports = self.host, self.ports()
        config: dict[str, object] = {"bootstrap.servers": f"{host}:{ports['broker']}", "log_level": 0}
        if self.settings.secure:
            credentials = self.settings.credentials
            config |= {
                "security.protocol": "SASL_SSL",
                "sasl.mechanisms": "SCRAM-SHA-512",
                "sasl.username": user,
                "sasl.password": credentials.password(f"kafka-{user}"),
                "ssl.ca.location": str(credentials.ca),
                "ssl.certificate.location": str(credentials.client_cert),
                "ssl.key.location": str(credentials.client_key),
            }
        return config

    def provision(self, timeout_s: float) -> None:
        """On the secure cluster: the SCRAM users' passwords (again: the password files
        decide), and the ACLs of `scheduler` and `reader`, made as `admin`. Creating an
        ACL binding that exists changes nothing, so this runs at every start."""
        if not self.settings.secure:
            return
        admin_module = import_client("confluent_kafka.admin", "confluent-kafka")
        admin = admin_module.AdminClient(self.client_config(KAFKA_ADMIN))
        credentials = self.settings.credentials
        upserts = [admin_module.UserScramCredentialUpsertion(
            user, admin_module.ScramCredentialInfo(admin_module.ScramMechanism.SCRAM_SHA_512, 8192),
            credentials.password(f"kafka-{user}").encode()) for user in (KAFKA_SCHEDULER, KAFKA_READER)]
        bindings = [
            admin_module.AclBinding(getattr(admin_module.ResourceType, kind), name,
                                    admin_module.ResourcePatternType.LITERAL, f"User:{user}", "*",
                                    getattr(admin_module.AclOperation, operation),
                                    admin_module.AclPermissionType.ALLOW)
            for user, kind, name, operation in KAFKA_ACLS
        ]
        try:
            for future in admin.alter_user_scram_credentials(upserts, request_timeout=timeout_s).values():
                future.result(timeout=timeout_s)
            for future in admin.create_acls(bindings, request_timeout=timeout_s).values():
                future.result(timeout=timeout_s)
        except Exception as exc:  # KafkaException, its timeout
            raise ClusterError(f"{self.name}: could not set the SCRAM users and ACLs as {KAFKA_ADMIN}: {exc}") from exc

    def probe(self, host: str, ports: dict[str, int], timeout_s: float) -> None:
        require_open(host, ports["broker"])
        admin_module = import_client("confluent_kafka.admin", "confluent-kafka")
        # log_level 0: librdkafka would print each refused connection to stderr.
        admin = admin_module.AdminClient({**self.client_config(KAFKA_ADMIN),
                                          "bootstrap.servers": f"{host}:{ports['broker']}"})
        try:
            metadata = admin.list_topics(timeout=timeout_s)
        except Exception as exc:  # KafkaException, including its timeout
            raise NotReady(f"metadata request failed: {exc}") from exc
        if not metadata.brokers:
            raise NotReady("the metadata lists no broker yet")
        self._check_leading(admin_module, admin, metadata, timeout_s)

    def _check_leading(self, admin_module: Any, admin: Any, metadata: Any, timeout_s: float) -> None:
        """NotReady until this broker answers for the partitions it leads. Restarted after
        a kill, it answers metadata from its previous registration while it still loads
        its logs (RECOVERY, fenced): a topic made then gets partitions that it lists as
        led and that answer NOT_LEADER_FOR_PARTITION until it is running. One partition
        of each of up to `LEADERSHIP_SAMPLE` topics is asked for its end offset; they
        all come online together, when the broker starts serving."""
        kafka = import_client("confluent_kafka", "confluent-kafka")
        led = []
        for name, topic in sorted(metadata.topics.items()):
            if topic.error is not None:
                continue
            mine = [number for number, partition in sorted(topic.partitions.items())
                    if partition.leader == metadata.orig_broker_id]
            if mine:
                led.append(kafka.TopicPartition(name, mine[0]))
            if len(led) >= LEADERSHIP_SAMPLE:
                break
        if not led:
            return
        try:
            futures = admin.list_offsets({tp: admin_module.OffsetSpec.latest() for tp in led},
                                         request_timeout=timeout_s)
            for future in futures.values():
                future.result(timeout=timeout_s)
        except Exception as exc:  # KafkaException (NOT_LEADER_FOR_PARTITION...), its timeout
            raise NotReady(f"the broker does not serve its partitions yet: {exc}") from exc


LEADERSHIP_SAMPLE = 20
"""Topics whose partitions a Kafka probe asks for an end offset (see `Kafka._check_leading`)."""

KAFKA_ADMIN, KAFKA_SCHEDULER, KAFKA_READER = "admin", "scheduler", "reader"
KAFKA_USERS = (KAFKA_ADMIN, KAFKA_SCHEDULER, KAFKA_READER)
"""The secure cluster's SCRAM users; each one's password is ``kafka-<user>`` of credentials.py."""

KAFKA_ACLS: tuple[tuple[str, str, str, str], ...] = (
    *((KAFKA_SCHEDULER, "TOPIC", "*", operation)
      for operation in ("CREATE", "DESCRIBE", "DESCRIBE_CONFIGS", "WRITE", "READ", "DELETE")),
    *((KAFKA_SCHEDULER, "GROUP", "*", operation) for operation in ("READ", "DESCRIBE", "DELETE")),
    (KAFKA_READER, "TOPIC", "*", "READ"),
    (KAFKA_READER, "TOPIC", "*", "DESCRIBE"),
    (KAFKA_READER, "GROUP", "*", "READ"),
)
"""(user, resource type, name, operation) allowed on the secure cluster: what the
scheduler does (make, describe, write, read and delete its topics; commit, describe and
delete its groups) on every topic and group, since each test picks a topic prefix of its
own; production grants the same on the prefix (deploy/README.md). `reader` may read and
not write."""


class ZooKeeper(Server):
    kind = "zookeeper"
    main_class = "org.apache.zookeeper.server.quorum.QuorumPeerMain"
    port_fields = (("client", "zookeeper_port"), ("peer", "zookeeper_peer_port"),
                   ("election", "zookeeper_election_port"))

    def jvm_command(self, java: str) -> list[str]:
        config = self.conf / "zoo.cfg"
        logback = self.conf / "logback.xml"
        config.write_text(self._config())
        logback.write_text(LOGBACK_XML)
        return [java, *COMMON_JVM_FLAGS, "-Xmx256m", f"-Dlogback.configurationFile={logback}",
                "-cp", self.classpath, self.main_class, str(config)]

    def ports(self) -> dict[str, int]:
        """The client port; with an ensemble, also the ports the nodes talk to each other on."""
        ports = super().ports()
        return ports if self.settings.nodes > 1 else {"client": ports["client"]}

    def _config(self) -> str:
        ensemble = ""
        if self.settings.nodes > 1:
            self.data.mkdir(parents=True, exist_ok=True)
            (self.data / "myid").write_text(f"{self.node}\n")
            ports = self.ports()
            ensemble = "initLimit=10\nsyncLimit=5\n" + "".join(
                f"server.{peer.node}={peer.host}:{ports['peer']}:{ports['election']}\n" for peer in self.peers)
        return f"""\
# {GENERATED}
tickTime=2000
dataDir={self.data}
{self._client_listener()}
{ensemble}
# Sessions (= shard leases) may be as short as 1 s, so failover tests need not wait.
minSessionTimeout=1000
maxSessionTimeout=60000
# Every test client comes from the same address: no per-address connection cap (default 60).
maxClientCnxns=0
# Else an admin HTTP server takes port 8080.
admin.enableServer=false
4lw.commands.whitelist=ruok,srvr,mntr
# TEST-ONLY speed-up: the transaction log is not fsynced, so a machine crash can lose
# acknowledged writes. Never in production.
forceSync=no
# Old snapshots and transaction logs are purged hourly, so the data dir stays small.
autopurge.purgeInterval=1
"""

    def _client_listener(self) -> str:
        """The plain cluster's clientPort; the secure one's TLS-only secureClientPort, on
        the same port number, with the client certificate required."""
        port = self.ports()["client"]
        if not self.settings.secure:
            return f"clientPort={port}\nclientPortAddress={self.host}"
        credentials = self.settings.credentials
        # Keys ZooKeeper does not know itself become zookeeper.* system properties.
        return f"""\
# TLS only: no clientPort, so nothing answers in clear text. TLS needs the Netty
# connection factory (the default NIO one cannot do it).
secureClientPort={port}
secureClientPortAddress={self.host}
serverCnxnFactory=org.apache.zookeeper.server.NettyServerCnxnFactory
ssl.keyStore.location={credentials.server_bundle(self.host)}
ssl.keyStore.type=PEM
ssl.trustStore.location={credentials.ca}
ssl.trustStore.type=PEM
# A client must show a certificate signed by the CA above; it names the client
# (CN=scheduler), not its host, so the client's address is not checked against it.
ssl.clientAuth=need
ssl.clientHostnameVerification=false"""

    def client_tls(self) -> dict[str, object]:
        """kazoo's TLS arguments for the secure cluster (the scheduler's client
        certificate, the server's certificate checked against the CA and the address
        dialled), nothing for the plain one."""
        if not self.settings.secure:
            return {}
        credentials = self.settings.credentials
        return {"use_ssl": True, "ca": str(credentials.ca), "certfile": str(credentials.client_cert),
                "keyfile": str(credentials.client_key), "verify_certs": True, "check_hostname": True}

    def mode(self, host: str, ports: dict[str, int], timeout_s: float) -> str | None:
        """"leader", "follower" or "standalone" (the `srvr` four-letter word), None if no
        answer; over TLS with the client certificate on the secure cluster."""
        context = None
        if self.settings.secure:
            credentials = self.settings.credentials
            context = ssl.create_default_context(cafile=str(credentials.ca))
            context.load_cert_chain(str(credentials.client_cert), str(credentials.client_key))
        return zookeeper_mode(host, ports["client"], timeout_s, context)

    def probe(self, host: str, ports: dict[str, int], timeout_s: float) -> None:
        require_open(host, ports["client"])
        kazoo = import_client("kazoo.client", "kazoo")
        client = kazoo.KazooClient(hosts=f"{host}:{ports['client']}", timeout=timeout_s, **self.client_tls())
        try:
            client.start(timeout=timeout_s)
            client.get("/")
        except Exception as exc:  # KazooTimeoutError, ConnectionLoss, ...
            raise NotReady(f"ZooKeeper session failed: {exc}") from exc
        finally:
            client.stop()
            client.close()


SERVER_TYPES: tuple[type[Server], ...] = (Cassandra, Kafka, ZooKeeper)


def ring_token(node: int, nodes: int) -> int:
    """Node `node`'s token of `nodes` evenly spaced over Murmur3's range."""
    return -(2**63) + (node - 1) * (2**64 // nodes)


def zookeeper_mode(host: str, port: int, timeout_s: float, tls: ssl.SSLContext | None = None) -> str | None:
    """"leader", "follower" or "standalone" (the `srvr` four-letter word), None if no answer.
    With `tls`, asked over TLS: a secureClientPort answers four-letter words only so."""
    try:
        # The TLS socket takes the plain one's descriptor over: closing both is safe.
        with socket.create_connection((host, port), timeout=timeout_s) as raw, \
                raw if tls is None else tls.wrap_socket(raw, server_hostname=host) as sock:
            sock.sendall(b"srvr")
            answer = b""
            while chunk := sock.recv(4096):
                answer += chunk
    except OSError:
        return None
    for line in answer.decode(errors="replace").splitlines():
        if line.startswith("Mode:"):
            return line.split(":", 1)[1].strip()
    return None


def import_client(module: str, package: str) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise ClusterError(
            f"{package} is not installed for {sys.executable}: run this command with the "
            f"project's virtualenv (.venv/bin/python) or `pip install {package}`"
        ) from exc


def require_open(host: str, port: int) -> None:
    """A cheap pre-check, so that client libraries never retry against a closed port."""
    try:
        socket.create_connection((host, port), timeout=1).close()
    except OSError as exc:
        raise NotReady(f"port {port} is not accepting connections") from exc


def kafka_cluster_id() -> str:
    """A new KRaft cluster id, as `StorageTool random-uuid` makes one (without a JVM start):
    a random UUID in URL-safe base64 without padding, never starting with '-'."""
    while True:
        text = base64.urlsafe_b64encode(uuid.uuid4().bytes).rstrip(b"=").decode()
        if not text.startswith("-"):
            return text


def run_tool(argv: list[str], shown: int = 7) -> str:
    """Runs a short-lived JVM tool and returns its standard output. A failure shows the
    last `shown` arguments (0 when they hold a secret)."""
    done = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
    if done.returncode != 0:
        raise ClusterError(f"{' '.join(argv[-shown:]) if shown else argv[-1]} failed (exit {done.returncode}):\n"
                           f"{done.stdout}{done.stderr}")
    return done.stdout
