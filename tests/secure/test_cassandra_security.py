"""Cassandra with logins, permissions and client TLS on (the secure local cluster): the
scheduler's role gets in and does its work; a wrong password, a missing client
certificate, a plain connection, a CA that did not sign the node's certificate and a role
without permissions are each refused, reported as `StoreAccessDenied` (the CLI's exit 2)
with a message naming the setting to fix and never the password, and nothing is written.
"""

from __future__ import annotations

import dataclasses
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.connection import CassandraConnection, connect
from scheduler.adapters.cassandra.store import CassandraTaskStore
from scheduler.errors import StoreAccessDenied
from scheduler.settings import CassandraSettings, TlsFiles, read_secret
from tests.cluster import unique_name
from tests.secure_cluster import SecureCluster
from tests.support import local_credentials, wait_until
from tests.tasks import make_task

pytestmark = [pytest.mark.integration, pytest.mark.local_cluster, pytest.mark.secure, pytest.mark.timeout(300)]

ADMIN = "cassandra"


@pytest.fixture
def settings(secure_cluster: SecureCluster) -> Iterator[CassandraSettings]:
    """The scheduler's settings on the secure cluster, with a keyspace of this test's own
    (the schema applied as the scheduler's role, the keyspace dropped afterwards)."""
    found = dataclasses.replace(secure_cluster.cassandra, keyspace=unique_name("sec"))
    with connect(found) as connection:
        schema.apply(connection, found)
    yield found
    with connect(found) as connection:
        connection.session.execute(f"DROP KEYSPACE IF EXISTS {found.keyspace}")


@pytest.fixture
def admin(secure_cluster: SecureCluster) -> Iterator[CassandraConnection]:
    """A session as the superuser, for making roles and looking at what was written."""
    password_file = secure_cluster.password_file("cassandra-admin")
    with connect(dataclasses.replace(secure_cluster.cassandra, username=ADMIN, password_file=password_file)) as found:
        yield found


@pytest.fixture
def bad_password(tmp_path: Path) -> Path:
    path = tmp_path / "wrong.password"
    path.write_text("not-the-password\n")
    path.chmod(0o600)
    return path


def scheduler_cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "scheduler", *args], env=env, capture_output=True, text=True,
                          timeout=120)


def task_rows(admin: CassandraConnection, keyspace: str) -> int:
    return int(admin.session.execute(f"SELECT count(*) FROM {keyspace}.tasks_by_bucket").one()[0])


def secrets_in(text: str, secure_cluster: SecureCluster) -> list[str]:
    """Which of the cluster's Cassandra passwords appear in `text` (none should)."""
    return [name for name in ("cassandra-admin", "cassandra-scheduler")
            if read_secret(secure_cluster.password_file(name), name) in text]


def test_the_scheduler_role_applies_the_schema_and_writes_and_reads_tasks(
        settings: CassandraSettings, secure_cluster: SecureCluster) -> None:
    assert settings.username == "scheduler" and settings.tls is not None and settings.tls.cert is not None
    task = make_task()
    store = CassandraTaskStore.open(settings)
    try:
        assert store.insert([task]) == []
        stored = store.get(task.id)
    finally:
        store.close()
    assert stored is not None and stored.task.payload == task.payload
    applied = scheduler_cli(secure_cluster.process_env(SCHEDULER_KEYSPACE=settings.keyspace), "schema", "apply")
    assert applied.returncode == 0, applied.stderr


def test_a_wrong_password_is_refused_naming_the_setting_and_nothing_is_written(
        settings: CassandraSettings, secure_cluster: SecureCluster, admin: CassandraConnection,
        bad_password: Path) -> None:
    wrong = dataclasses.replace(settings, password_file=bad_password)
    with pytest.raises(StoreAccessDenied) as refused:
        connect(wrong)
    message = str(refused.value)
    assert "user 'scheduler'" in message and "SCHEDULER_CASSANDRA_PASSWORD_FILE" in message
    assert str(bad_password) in message and "not-the-password" not in message

    submitted = scheduler_cli(
        secure_cluster.process_env(SCHEDULER_BACKEND="cassandra", SCHEDULER_KEYSPACE=settings.keyspace,
                                   SCHEDULER_CASSANDRA_PASSWORD_FILE=str(bad_password)),
        "submit", "sms", "--tenant", "board", "--delay", "1h", "--payload", '{"n": 1}')
    assert submitted.returncode == 2, submitted.stderr
    assert "SCHEDULER_CASSANDRA_PASSWORD_FILE" in submitted.stderr and "refused the login" in submitted.stderr
    assert "Traceback" not in submitted.stderr and "not-the-password" not in submitted.stderr
    assert not secrets_in(submitted.stdout + submitted.stderr, secure_cluster)
    assert task_rows(admin, settings.keyspace) == 0


def test_no_login_is_refused(settings: CassandraSettings) -> None:
    with pytest.raises(StoreAccessDenied, match="requires a login.*SCHEDULER_CASSANDRA_USERNAME"):
        connect(dataclasses.replace(settings, username=None, password_file=None))


def test_a_client_without_a_certificate_is_refused(settings: CassandraSettings) -> None:
    assert settings.tls is not None
    with pytest.raises(StoreAccessDenied, match="requires a client certificate.*SCHEDULER_CASSANDRA_TLS_CERT"):
        connect(dataclasses.replace(settings, tls=TlsFiles(settings.tls.ca)))


def test_a_client_without_tls_is_refused(settings: CassandraSettings, secure_cluster: SecureCluster) -> None:
    with pytest.raises(StoreAccessDenied, match="accepts only TLS connections.*SCHEDULER_CASSANDRA_TLS_CA"):
        connect(dataclasses.replace(settings, tls=None))
    env = secure_cluster.process_env(SCHEDULER_KEYSPACE=settings.keyspace, SCHEDULER_CASSANDRA_TLS_CA="",
                                     SCHEDULER_CASSANDRA_TLS_CERT="", SCHEDULER_CASSANDRA_TLS_KEY="")
    applied = scheduler_cli(env, "schema", "apply")
    assert applied.returncode == 2, applied.stderr
    assert "accepts only TLS" in applied.stderr and "Traceback" not in applied.stderr


def test_certificates_of_another_ca_are_refused_both_ways(settings: CassandraSettings, tmp_path: Path) -> None:
    """A CA that did not sign the node's certificate: this client refuses the node; and a
    client certificate from that CA: the node refuses the client."""
    other = make_other_ca(tmp_path, settings.hosts[0])
    assert settings.tls is not None
    with pytest.raises(StoreAccessDenied, match="SCHEDULER_CASSANDRA_TLS_CA .* does not vouch for"):
        connect(dataclasses.replace(settings, tls=TlsFiles(other / "ca.pem", settings.tls.cert, settings.tls.key)))
    with pytest.raises(StoreAccessDenied, match="client certificate it does not trust.*SCHEDULER_CASSANDRA_TLS_CERT"):
        connect(dataclasses.replace(settings, tls=TlsFiles(settings.tls.ca, other / "client.pem",
                                                           other / "client.key")))


def test_a_role_without_permissions_gets_a_clear_error(
        settings: CassandraSettings, secure_cluster: SecureCluster, admin: CassandraConnection,
        tmp_path: Path) -> None:
    role, password = unique_name("nobody"), unique_name("pw")
    password_file = tmp_path / "nobody.password"
    password_file.write_text(password + "\n")
    password_file.chmod(0o600)
    admin.session.execute(f"CREATE ROLE {role} WITH PASSWORD = %s AND LOGIN = true", (password,))
    try:
        nobody = dataclasses.replace(settings, username=role, password_file=password_file)
        with pytest.raises(StoreAccessDenied) as refused:
            CassandraTaskStore.open(nobody)
        message = str(refused.value)
        assert f"user {role!r}" in message and "SELECT" in message and settings.keyspace in message
        assert "GRANT" in message and password not in message

        # Allowed to read, not to write: the insert is refused as clearly, and stores nothing.
        admin.session.execute(f"GRANT SELECT ON KEYSPACE {settings.keyspace} TO {role}")
        reader = wait_until(lambda: opened(nobody), timeout_s=30, interval_s=0.5,
                            what="the grant to take effect (Cassandra caches permissions for 2 s)")
        assert reader is not None
        try:
            with pytest.raises(StoreAccessDenied, match="MODIFY"):
                reader.insert([make_task()])
        finally:
            reader.close()
        assert task_rows(admin, settings.keyspace) == 0

        env = secure_cluster.process_env(SCHEDULER_KEYSPACE=unique_name("sec"), SCHEDULER_CASSANDRA_USERNAME=role,
                                         SCHEDULER_CASSANDRA_PASSWORD_FILE=str(password_file))
        applied = scheduler_cli(env, "schema", "apply")
        assert applied.returncode == 2, applied.stderr
        assert "CREATE" in applied.stderr and role in applied.stderr and "Traceback" not in applied.stderr
    finally:
        admin.session.execute(f"DROP ROLE IF EXISTS {role}")


def opened(settings: CassandraSettings) -> CassandraTaskStore | None:
    """The store, or None while the server still refuses it."""
    try:
        return CassandraTaskStore.open(settings)
    except StoreAccessDenied:
        return None


def make_other_ca(directory: Path, host: str) -> Path:
    """A CA of its own, with a server and a client certificate, made the way the secure
    cluster makes its own (deploy/local/credentials.py)."""
    other = directory / "other-ca"
    local_credentials(other, [host])
    return other
