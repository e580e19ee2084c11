"""`ZkCoordinator` with a ZooKeeper identity, on the real server: the znodes it makes are
writable by that identity alone, a client without it cannot take a lease away (and the
holder keeps it), a wrong password or none is refused with an error that says so, and
the password reaches no log."""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path

import pytest
from kazoo.client import KazooClient
from kazoo.exceptions import NoAuthError
from kazoo.security import OPEN_ACL_UNSAFE, make_digest_acl_credential

from scheduler.adapters.teardown import remove_deployment
from scheduler.adapters.zookeeper.coordinator import ZkCoordinator
from scheduler.errors import ConfigError, CoordinatorAccessDenied
from scheduler.ports import SessionState
from scheduler.settings import ZooKeeperSettings
from tests.cluster import Cluster
from tests.support import wait_until

USER = "scheduler-test"
SESSION_TIMEOUT_S = 2.0
ROOT = "/scheduler"
LEASES = f"{ROOT}/leases"
MEMBERS = f"{ROOT}/members"


@dataclass
class Secured:
    """A chroot of the test's own, the identity's file and password, and coordinators
    made on it (closed afterwards)."""

    hosts: str
    password: str
    auth_file: Path
    tmp_path: Path
    made: list[ZkCoordinator] = field(default_factory=list)

    def coordinator(self, auth_file: Path | None) -> ZkCoordinator:
        settings = ZooKeeperSettings(hosts=self.hosts, session_timeout_s=SESSION_TIMEOUT_S, auth_file=auth_file)
        coordinator = ZkCoordinator(settings)
        self.made.append(coordinator)
        return coordinator

    def started(self, member: str, auth_file: Path | None = None,
                on_state: Callable[[SessionState], None] = lambda state: None) -> ZkCoordinator:
        coordinator = self.coordinator(auth_file or self.auth_file)
        coordinator.start(member, on_state)
        return coordinator

    def file_with(self, credential: str) -> Path:
        path = self.tmp_path / f"auth-{uuid.uuid4().hex[:8]}"
        path.write_text(credential + "\n")
        path.chmod(0o600)
        return path


def client(hosts: str, credential: str | None = None) -> KazooClient:
    auth = [("digest", credential)] if credential else None
    started = KazooClient(hosts=hosts, timeout=10, auth_data=auth)
    started.start(timeout=15)
    return started


@pytest.fixture
def secured(zk_chroot: str, tmp_path: Path) -> Iterator[Secured]:
    password = uuid.uuid4().hex
    auth_file = tmp_path / "zookeeper-auth"
    auth_file.write_text(f"{USER}:{password}\n")
    auth_file.chmod(0o600)
    place = Secured(zk_chroot, password, auth_file, tmp_path)
    try:
        yield place
    finally:
        for coordinator in place.made:
            coordinator.close()
        # Only the identity may delete what it made; zk_chroot then removes the rest.
        owner = client(zk_chroot, f"{USER}:{password}")
        try:
            if owner.exists(ROOT):
                owner.delete(ROOT, recursive=True)
        finally:
            owner.stop()
            owner.close()


@pytest.fixture
def anonymous(secured: Secured) -> Iterator[KazooClient]:
    """A client of the same chroot with no identity at all."""
    intruder = client(secured.hosts)
    try:
        yield intruder
    finally:
        intruder.stop()
        intruder.close()


@pytest.fixture
def owner(secured: Secured) -> Iterator[KazooClient]:
    """A client of the same chroot with the identity: only a client with the admin right
    sees a digest ACL's hash (ZooKeeper shows others 'x')."""
    with_identity = client(secured.hosts, f"{USER}:{secured.password}")
    try:
        yield with_identity
    finally:
        with_identity.stop()
        with_identity.close()


def acl_of(kazoo: KazooClient, path: str) -> set[tuple[int, str, str]]:
    acl, _ = kazoo.get_acls(path)
    return {(entry.perms, entry.id.scheme, entry.id.id) for entry in acl}


def expected_acl(password: str) -> set[tuple[int, str, str]]:
    """All rights (31) for the identity's digest, read (1) for anyone."""
    return {(31, "digest", make_digest_acl_credential(USER, password)), (1, "world", "anyone")}


def test_every_znode_the_coordinator_makes_is_writable_by_its_identity_alone(
    secured: Secured, owner: KazooClient, anonymous: KazooClient
) -> None:
    holder = secured.started("dispatcher-a")
    lease = holder.acquire(3)
    assert lease is not None

    for path in (ROOT, MEMBERS, LEASES, f"{MEMBERS}/dispatcher-a", f"{LEASES}/3"):
        assert acl_of(owner, path) == expected_acl(secured.password), path
        # Others see the ACL, not the password's hash.
        assert acl_of(anonymous, path) == {(31, "digest", f"{USER}:x"), (1, "world", "anyone")}, path
    # Read stays open: anyone can see who holds what.
    assert anonymous.get(f"{LEASES}/3")[0] == b"dispatcher-a"


def takeovers(intruder: KazooClient) -> list[Callable[[], object]]:
    """What someone who wants a shard, or to stop the scheduler, would try."""
    return [
        lambda: intruder.delete(f"{LEASES}/3"),
        lambda: intruder.delete(f"{MEMBERS}/dispatcher-a"),
        lambda: intruder.set(f"{LEASES}/3", b"intruder"),
        lambda: intruder.create(f"{LEASES}/5", b"intruder", ephemeral=True),
        lambda: intruder.create(f"{MEMBERS}/intruder", b"{}", ephemeral=True),
        lambda: intruder.delete(ROOT, recursive=True),
        lambda: intruder.set_acls(LEASES, OPEN_ACL_UNSAFE),
    ]


def test_a_client_without_the_identity_cannot_take_a_lease_away_and_the_holder_keeps_it(
    secured: Secured, anonymous: KazooClient
) -> None:
    states: list[SessionState] = []
    holder = secured.started("dispatcher-a", on_state=states.append)
    lease = holder.acquire(3)
    assert lease is not None
    wrong = client(secured.hosts, f"{USER}:not-the-password")
    try:
        for intruder in (anonymous, wrong):
            for attempt in takeovers(intruder):
                with pytest.raises(NoAuthError):
                    attempt()
    finally:
        wrong.stop()
        wrong.close()

    # Nothing lost: the same lease, still held, confirmed by the server.
    assert holder.confirm(lease)
    assert holder.lease_holders() == {3: "dispatcher-a"}
    assert holder.members() == ["dispatcher-a"]
    data, stat = anonymous.get(f"{LEASES}/3")
    assert (data, stat.czxid) == (b"dispatcher-a", lease.token)
    assert anonymous.exists(f"{LEASES}/5") is None
    assert states == []  # never suspended or lost


def test_a_coordinator_with_a_wrong_password_is_refused_and_told_why(secured: Secured) -> None:
    holder = secured.started("dispatcher-a")
    lease = holder.acquire(3)
    assert lease is not None
    wrong_file = secured.file_with(f"{USER}:wrong-password-9f2")

    with pytest.raises(CoordinatorAccessDenied) as raised:
        secured.started("dispatcher-b", auth_file=wrong_file)

    message = str(raised.value)
    assert isinstance(raised.value, ConfigError)  # the CLI's exit 2: a setting to fix
    assert f"refused to register member 'dispatcher-b': the ACLs under {ROOT} do not grant it" in message
    assert f"digest user {USER!r} of {wrong_file}" in message
    assert "wrong-password-9f2" not in message
    assert holder.confirm(lease)
    assert holder.members() == ["dispatcher-a"]


def test_a_coordinator_without_an_identity_on_a_protected_root_is_told_to_configure_one(secured: Secured) -> None:
    holder = secured.started("dispatcher-a")
    bare = secured.coordinator(auth_file=None)

    with pytest.raises(CoordinatorAccessDenied, match="grant it only to an identity, and none is configured "
                                                      r"\(SCHEDULER_ZOOKEEPER_AUTH_FILE"):
        bare.start("dispatcher-b", lambda state: None)
    assert holder.members() == ["dispatcher-a"]


def test_an_open_root_is_restricted_when_a_member_with_the_identity_joins(
    secured: Secured, owner: KazooClient, anonymous: KazooClient, caplog: pytest.LogCaptureFixture
) -> None:
    before = secured.coordinator(auth_file=None)  # no identity: it makes the root open to anyone
    before.start("dispatcher-old", lambda state: None)
    before.close()
    assert acl_of(anonymous, LEASES) == {(31, "world", "anyone")}

    with caplog.at_level(logging.WARNING, logger="scheduler.adapters.zookeeper.coordinator"):
        holder = secured.started("dispatcher-a")
    for path in (ROOT, MEMBERS, LEASES):
        assert acl_of(owner, path) == expected_acl(secured.password), path
        assert f"ZooKeeper node {path} was open to anyone" in caplog.text
    assert holder.acquire(1) is not None
    with pytest.raises(NoAuthError):
        anonymous.create(f"{LEASES}/2", b"intruder", ephemeral=True)


def test_the_password_reaches_no_log(secured: Secured, caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(1):  # every level, kazoo's request log (DEBUG) and below included
        holder = secured.started("dispatcher-a")
        assert holder.acquire(2) is not None
        holder.close()
        wait_until(lambda: any("Auth(" in record.getMessage() for record in caplog.records), timeout_s=5,
                   what="kazoo's log of the Auth request")
    assert secured.password not in caplog.text
    assert all(secured.password not in record.getMessage() for record in caplog.records)


def test_a_deployment_removed_with_the_identity_loses_its_restricted_root(
    cluster: Cluster, secured: Secured, anonymous: KazooClient
) -> None:
    holder = secured.started("dispatcher-a")
    assert holder.acquire(4) is not None
    holder.close()
    tag = uuid.uuid4().hex[:12]

    warnings = remove_deployment(
        replace(cluster.cassandra, keyspace=f"gone_{tag}"), replace(cluster.kafka, topic_prefix=f"gone_{tag}"),
        ZooKeeperSettings(hosts=secured.hosts, root=ROOT, auth_file=secured.auth_file),
    )

    assert warnings == []
    assert anonymous.exists(ROOT) is None
