"""`ZkCoordinator` when the network between it and ZooKeeper fails: a `TcpProxy` stands
between kazoo and the real server and is cut. A short cut suspends the session and its
leases come back; a cut past the session timeout loses them for good."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from scheduler.adapters.zookeeper.coordinator import ZkCoordinator
from scheduler.ports import SessionState
from scheduler.settings import ZooKeeperSettings
from tests.proxy import TcpProxy
from tests.support import wait_until

SESSION_TIMEOUT_S = 2.0


class Recorder:
    def __init__(self) -> None:
        self.states: list[SessionState] = []

    def __call__(self, state: SessionState) -> None:
        self.states.append(state)


def split_hosts(connection: str) -> tuple[str, int, str]:
    """`host:port[,...][/chroot]` -> the first host, its port, and the chroot."""
    hosts, slash, chroot = connection.partition("/")
    host, _, port = hosts.split(",")[0].rpartition(":")
    return host, int(port), slash + chroot


@pytest.fixture
def proxy(zk_chroot: str) -> Iterator[TcpProxy]:
    host, port, _ = split_hosts(zk_chroot)
    with TcpProxy(host, port) as running:
        yield running


@pytest.fixture
def coordinators(zk_chroot: str, proxy: TcpProxy) -> Iterator[tuple[ZkCoordinator, ZkCoordinator]]:
    """One coordinator that reaches ZooKeeper through the proxy, one that reaches it directly."""
    _, _, chroot = split_hosts(zk_chroot)
    behind = ZkCoordinator(
        ZooKeeperSettings(hosts=f"127.0.0.1:{proxy.port}{chroot}", session_timeout_s=SESSION_TIMEOUT_S)
    )
    direct = ZkCoordinator(ZooKeeperSettings(hosts=zk_chroot, session_timeout_s=SESSION_TIMEOUT_S))
    try:
        yield behind, direct
    finally:
        behind.close()
        direct.close()


def test_a_short_cut_suspends_the_session_and_the_same_lease_comes_back(
    proxy: TcpProxy, coordinators: tuple[ZkCoordinator, ZkCoordinator]
) -> None:
    behind, _ = coordinators
    heard = Recorder()
    behind.start("behind", heard)
    lease = behind.acquire(3)
    given_up = behind.acquire(4)
    assert lease is not None and given_up is not None
    assert behind.is_valid(lease)

    proxy.cut()
    wait_until(lambda: heard.states == [SessionState.SUSPENDED], timeout_s=5, what="SUSPENDED")
    assert not behind.is_valid(lease), "a suspended session's lease is not valid"
    behind.release(given_up)  # no error: the znode goes once the session is back

    proxy.restore()
    wait_until(
        lambda: heard.states == [SessionState.SUSPENDED, SessionState.CONNECTED], timeout_s=5, what="CONNECTED"
    )
    assert behind.is_valid(lease), "the session survived, and its lease with it"
    assert behind.confirm(lease)
    assert not behind.is_valid(given_up)
    wait_until(lambda: behind.lease_holders() == {3: "behind"}, timeout_s=5, what="the released lease to go")


def test_a_cut_past_the_session_timeout_loses_the_leases_for_good(
    proxy: TcpProxy, coordinators: tuple[ZkCoordinator, ZkCoordinator]
) -> None:
    behind, direct = coordinators
    heard = Recorder()
    behind.start("behind", heard)
    direct.start("direct", Recorder())
    lease = behind.acquire(3)
    assert lease is not None

    proxy.cut()
    wait_until(lambda: heard.states == [SessionState.SUSPENDED], timeout_s=5, what="SUSPENDED")
    assert not behind.is_valid(lease)
    taken = wait_until(lambda: direct.acquire(3), timeout_s=15, what="the cut-off session to expire")
    assert taken is not None
    assert taken.token > lease.token
    assert heard.states == [SessionState.SUSPENDED], "the client learns of the expiry only when it reconnects"

    proxy.restore()
    wait_until(
        lambda: heard.states == [SessionState.SUSPENDED, SessionState.LOST, SessionState.CONNECTED],
        timeout_s=15,
        what="LOST, then CONNECTED on a new session",
    )
    assert not behind.is_valid(lease), "a lease of an expired session is never valid again"
    assert behind.acquire(3) is None
    assert behind.members() == ["behind", "direct"]
    assert behind.lease_holders() == {3: "direct"}
    fresh = behind.acquire(4)
    assert fresh is not None and behind.is_valid(fresh)
    assert fresh.session != lease.session
