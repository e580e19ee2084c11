"""ZooKeeper on the secure cluster: TLS only, the scheduler's client certificate required,
and the scheduler's root writable by its digest identity alone.

The scheduler's coordinator, with its certificate and identity, takes a lease. A client
that speaks TLS with a good certificate but has no identity reads the leases and cannot
delete, change or add a member or a lease. A client without a certificate, with one from
another CA, trusting another CA (even where the machine's CAs vouch for the server), or
speaking clear text, gets no session, and the coordinator says which of these it is
(`CoordinatorAccessDenied`), where kazoo alone would only time out; a `scheduler
dispatcher` without a certificate exits 2 saying so.
"""

from __future__ import annotations

import subprocess
from collections.abc import Callable, Iterator
from dataclasses import replace
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from scheduler.adapters.teardown import remove_deployment
from scheduler.adapters.zookeeper.coordinator import ZkCoordinator
from scheduler.adapters.zookeeper.tls import refusal, servers
from scheduler.errors import CoordinatorAccessDenied
from scheduler.ports import SessionState
from scheduler.settings import CassandraSettings, KafkaSettings, TlsFiles, ZooKeeperSettings
from tests.cluster import Cluster, unique_name
from tests.secure_cluster import SecureCluster
from tests.support import run_cli, zookeeper_session

pytestmark = [
    pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.secure, pytest.mark.timeout(300),
]

CONNECT_TIMEOUT_S = 5.0
"""How long a refused coordinator waits for a session before it looks into why."""


@pytest.fixture
def zookeeper(secure_cluster: SecureCluster) -> Iterator[ZooKeeperSettings]:
    """The scheduler's settings on the secure ZooKeeper, under a root of this test's own
    (removed afterwards, as the scheduler's identity)."""
    settings = replace(secure_cluster.zookeeper, root=f"/{unique_name('zs')}", session_timeout_s=5.0,
                       connect_timeout_s=CONNECT_TIMEOUT_S)
    assert settings.tls is not None and settings.tls.cert is not None and settings.auth_file is not None
    yield settings
    identity = settings.identity()
    assert identity is not None
    with zookeeper_session(settings.hosts, settings.tls) as owner:
        owner.add_auth("digest", identity.credential)
        if owner.exists(settings.root):
            owner.delete(settings.root, recursive=True)


@pytest.fixture
def stranger_ca(tmp_path: Path) -> TlsFiles:
    """A self-signed certificate and key of no concern to the cluster: as a CA, it signed
    nothing the server shows; as a client certificate, the server's CA did not sign it."""
    cert, key = tmp_path / "stranger.pem", tmp_path / "stranger.key"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out", str(cert),
                    "-days", "1", "-subj", "/CN=stranger"], check=True, capture_output=True)
    return TlsFiles(cert, cert, key)


def test_the_scheduler_takes_a_lease_over_tls_and_a_client_without_its_identity_cannot_touch_it(
        zookeeper: ZooKeeperSettings) -> None:
    coordinator = ZkCoordinator(zookeeper)
    states: list[SessionState] = []
    coordinator.start("a", states.append)
    try:
        lease = coordinator.acquire(7)
        assert lease is not None and coordinator.confirm(lease)
        leases, members = f"{zookeeper.root}/leases", f"{zookeeper.root}/members"

        with zookeeper_session(zookeeper.hosts, zookeeper.tls) as stranger:  # TLS, certificate, no identity
            data, stat = stranger.get(f"{leases}/7")
            assert data == b"a" and stat.czxid == lease.token
            attempts: list[Callable[[], object]] = [
                lambda: stranger.delete(f"{leases}/7"),
                lambda: stranger.set(f"{leases}/7", b"intruder"),
                lambda: stranger.delete(f"{members}/a"),
                lambda: stranger.set(f"{members}/a", b"{}"),
                lambda: stranger.create(f"{leases}/8", b"intruder", ephemeral=True),
                lambda: stranger.create(f"{members}/b", b"{}", ephemeral=True),
                lambda: stranger.delete(zookeeper.root, recursive=True),
            ]
            for attempt in attempts:
                with pytest.raises(NoAuthError):
                    attempt()
            # Nothing changed: the lease is the one taken, still valid, and no one else is a member.
            assert stranger.get(f"{leases}/7")[1].czxid == lease.token
            assert stranger.get_children(leases) == ["7"] and stranger.get_children(members) == ["a"]
        assert coordinator.confirm(lease)
        assert states == []  # never suspended or lost
    finally:
        coordinator.close()


@pytest.mark.parametrize("case", ["no certificate", "clear text", "certificate of another CA", "trusting another CA",
                                  "trusting another CA, the system trusting the server's"])
def test_a_client_the_tls_port_refuses_gets_a_clear_error(
        zookeeper: ZooKeeperSettings, stranger_ca: TlsFiles, case: str, monkeypatch: pytest.MonkeyPatch) -> None:
    tls = zookeeper.tls
    assert tls is not None
    if case.endswith("the system trusting the server's"):
        # The machine's CAs (where OpenSSL looks: SSL_CERT_FILE) vouch for the server; the
        # scheduler was given another CA, and trusts that one alone.
        monkeypatch.setenv("SSL_CERT_FILE", str(tls.ca))
        monkeypatch.delenv("SSL_CERT_DIR", raising=False)
        case = "trusting another CA"
    host = zookeeper.hosts.split(",")[0]
    wrong, expected = {
        "no certificate": (TlsFiles(tls.ca), "refused the TLS connection"),
        "clear text": (None, "speaks only TLS on this port and the scheduler spoke clear text"),
        "certificate of another CA": (TlsFiles(tls.ca, stranger_ca.cert, stranger_ca.key),
                                      f"refused the client certificate {stranger_ca.cert}"),
        "trusting another CA": (TlsFiles(stranger_ca.ca, tls.cert, tls.key),
                                "showed a certificate this client does not trust"),
    }[case]
    coordinator = ZkCoordinator(replace(zookeeper, tls=wrong))

    with pytest.raises(CoordinatorAccessDenied) as refused:
        coordinator.start("refused", lambda state: None)

    message = str(refused.value)
    assert f"ZooKeeper at {host} {expected}" in message
    assert "SCHEDULER_ZOOKEEPER_TLS_" in message
    # Refused before anything was made: no root, no member.
    with zookeeper_session(zookeeper.hosts, zookeeper.tls) as observer:
        assert not observer.exists(zookeeper.root)


@pytest.fixture
def dispatcher_env(secure_cluster: SecureCluster) -> Iterator[dict[str, str]]:
    """The secure cluster's variables with a keyspace (its schema applied), topics and
    ZooKeeper root of this test's own, removed afterwards."""
    env = secure_cluster.process_env(
        SCHEDULER_BACKEND="cassandra", SCHEDULER_KEYSPACE=unique_name("zs"), SCHEDULER_TOPIC_PREFIX=unique_name("zs"),
        SCHEDULER_ZOOKEEPER_ROOT=f"/{unique_name('zs')}",
    )
    applied = run_cli("schema", "apply", env=env, timeout_s=180)
    assert applied.returncode == 0, applied.stderr
    yield env
    warnings = remove_deployment(CassandraSettings.from_env(env), KafkaSettings.from_env(env),
                                 ZooKeeperSettings.from_env(env))
    assert not warnings


def test_a_dispatcher_without_a_client_certificate_exits_2_saying_why(dispatcher_env: dict[str, str]) -> None:
    env = {name: value for name, value in dispatcher_env.items()
           if name not in ("SCHEDULER_ZOOKEEPER_TLS_CERT", "SCHEDULER_ZOOKEEPER_TLS_KEY")}
    host = ZooKeeperSettings.from_env(env).hosts.split(",")[0]

    refused = run_cli("dispatcher", "--member", "uncertified", env=env, timeout_s=120)

    assert refused.returncode == 2, refused.stderr
    assert f"error: no ZooKeeper session within 10.0 s: ZooKeeper at {host} refused the TLS connection" in refused.stderr
    assert "requires a client certificate and none is given; set SCHEDULER_ZOOKEEPER_TLS_CERT" in refused.stderr
    assert "Traceback" not in refused.stderr
    with zookeeper_session(dispatcher_env["SCHEDULER_ZOOKEEPER_HOSTS"], ZooKeeperSettings.from_env(dispatcher_env).tls) \
            as observer:
        assert not observer.exists(f"{dispatcher_env['SCHEDULER_ZOOKEEPER_ROOT']}/members/uncertified")


def test_tls_spoken_to_a_clear_text_port_is_told_apart_from_an_outage(
        cluster: Cluster, secure_cluster: SecureCluster) -> None:
    # The plain cluster's ZooKeeper closes a TLS hello unanswered, as a server at its
    # connection limit would close any connection: its answer to a clear-text connect
    # request is what makes it a setting to fix rather than an outage.
    host, port = servers(cluster.zookeeper.hosts)[0]
    found = refusal(cluster.zookeeper.hosts, secure_cluster.zookeeper.tls, 5.0)
    assert found is not None and found.startswith(f"ZooKeeper at {host}:{port} does not speak TLS on this port")
