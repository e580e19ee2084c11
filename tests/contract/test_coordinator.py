"""The `Coordinator` contract (`scheduler.ports`), run against both adapters: ZooKeeper on
the real server (in a chroot of the test's own) and the embedded SQLite coordinator.
The embedded coordinator's clock-driven behaviour is tested at the end, with a clock
stepped by hand."""

from __future__ import annotations

import re
import sqlite3
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import closing
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import pytest
from kazoo.client import KazooClient

from scheduler.adapters.embedded.coordinator import SqliteCoordinator
from scheduler.adapters.zookeeper.coordinator import ZkCoordinator
from scheduler.errors import CoordinatorError, CoordinatorUnavailable
from scheduler.ports import Coordinator, SessionState
from scheduler.settings import ZooKeeperSettings
from tests.support import all_at_once, wait_until

REPO = Path(__file__).resolve().parents[2]
SQLITE_SESSION_TIMEOUT_S = 1.0
ZK_SESSION_TIMEOUT_S = 2.0
EXPIRY_DEADLINE_S = 15.0
"""Ample time for a session to expire and for everyone to notice (either adapter)."""


class Recorder:
    """An `on_state` that records what it hears."""

    def __init__(self) -> None:
        self.states: list[SessionState] = []

    def __call__(self, state: SessionState) -> None:
        self.states.append(state)


@dataclass
class Backend:
    """How to make coordinators that share one backing place, and how to kill one."""

    name: str
    make: Callable[[], Coordinator]
    kill: Callable[[Coordinator], None]
    """End the coordinator's session as its death would, without its help."""
    survives_kill: bool
    """True when the killed coordinator's process lives on (ZooKeeper: only the session
    ends), so it must hear LOST, then CONNECTED on a new session."""
    unreachable: Callable[[], Coordinator]
    unreachable_address: str
    remove_lease: Callable[[int], None]
    """Delete the shard's lease behind every coordinator's back, as an expiry that its
    holder has not heard of yet would."""

    def started(self, member: str) -> tuple[Coordinator, Recorder]:
        coordinator = self.make()
        recorder = Recorder()
        coordinator.start(member, recorder)
        return coordinator, recorder


def crash(coordinator: Coordinator) -> None:
    assert isinstance(coordinator, SqliteCoordinator)
    coordinator.crash()


def expire_zk_session(hosts: str, coordinator: Coordinator) -> None:
    """End the coordinator's session for real: a second client joins the session with
    its id and password and closes it, as the server would on expiry."""
    assert isinstance(coordinator, ZkCoordinator)
    handle = coordinator.session_handle
    assert handle is not None
    intruder = KazooClient(hosts=hosts, client_id=handle, timeout=ZK_SESSION_TIMEOUT_S)
    intruder.start(timeout=10)
    intruder.stop()
    intruder.close()


@pytest.fixture(params=["sqlite", pytest.param("zookeeper", marks=pytest.mark.integration),
                        pytest.param("zookeeper-acl", marks=pytest.mark.integration)])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """`zookeeper-acl`: ZooKeeper with an identity, so every znode is restricted to it; the
    contract holds the same."""
    made: list[Coordinator] = []

    def keep(coordinator: Coordinator) -> Coordinator:
        made.append(coordinator)
        return coordinator

    if request.param == "sqlite":
        path = tmp_path / "coordinator.db"
        not_a_directory = tmp_path / "plain-file"
        not_a_directory.write_text("")
        unreachable = not_a_directory / "coordinator.db"

        def remove_lease(shard: int) -> None:
            with closing(sqlite3.connect(path, isolation_level=None)) as db:
                db.execute("DELETE FROM leases WHERE shard = ?", (shard,))

        chosen = Backend(
            name="sqlite",
            make=lambda: keep(SqliteCoordinator(path, session_timeout_s=SQLITE_SESSION_TIMEOUT_S)),
            kill=crash,
            survives_kill=False,
            unreachable=lambda: keep(SqliteCoordinator(unreachable)),
            unreachable_address=str(unreachable),
            remove_lease=remove_lease,
        )
    else:
        hosts: str = request.getfixturevalue("zk_chroot")
        root_client: KazooClient = request.getfixturevalue("zk_root")
        chroot = hosts[hosts.index("/"):]
        leases = chroot + "/scheduler/leases"
        auth_file = None
        if request.param == "zookeeper-acl":
            auth_file = tmp_path / "zookeeper-auth"
            auth_file.write_text("scheduler:contract-password\n")
            auth_file.chmod(0o600)
            root_client.add_auth("digest", "scheduler:contract-password")  # to remove leases, and clean up
        settings = ZooKeeperSettings(hosts=hosts, session_timeout_s=ZK_SESSION_TIMEOUT_S, connect_timeout_s=10,
                                     auth_file=auth_file)
        nowhere = ZooKeeperSettings(hosts="127.0.0.1:1", connect_timeout_s=1)
        chosen = Backend(
            name=request.param,
            make=lambda: keep(ZkCoordinator(settings)),
            kill=partial(expire_zk_session, hosts),
            survives_kill=True,
            unreachable=lambda: keep(ZkCoordinator(nowhere)),
            unreachable_address="127.0.0.1:1",
            remove_lease=lambda shard: root_client.delete(f"{leases}/{shard}"),
        )
    try:
        yield chosen
    finally:
        for coordinator in made:
            coordinator.close()


def test_started_members_are_listed_and_a_closed_one_leaves(backend: Backend) -> None:
    a, _ = backend.started("dispatcher-a")
    b, _ = backend.started("dispatcher-b")

    assert a.members() == ["dispatcher-a", "dispatcher-b"]
    assert b.members() == ["dispatcher-a", "dispatcher-b"]

    b.close()
    wait_until(lambda: a.members() == ["dispatcher-a"], timeout_s=5, what="b to leave")


def test_a_lease_is_exclusive_and_carries_a_token(backend: Backend) -> None:
    a, _ = backend.started("a")
    b, _ = backend.started("b")

    lease = a.acquire(3)
    assert lease is not None
    assert lease.shard == 3
    assert lease.token > 0
    assert b.acquire(3) is None
    assert a.acquire(3) is None, "a held shard is refused to its own session too"
    assert a.is_valid(lease)
    assert not b.is_valid(lease), "a lease is valid only in the session that made it"
    assert b.acquire(4) is not None, "other shards stay free"


def test_a_released_shard_is_taken_again_with_a_larger_token(backend: Backend) -> None:
    a, _ = backend.started("a")
    b, _ = backend.started("b")

    first = a.acquire(5)
    assert first is not None
    a.release(first)
    assert not a.is_valid(first)
    second = b.acquire(5)
    assert second is not None
    assert second.token > first.token

    b.release(second)
    third = a.acquire(5)
    assert third is not None
    assert third.token > second.token
    assert a.is_valid(third)


def test_releasing_a_stale_lease_leaves_the_newer_one_alone(backend: Backend) -> None:
    a, _ = backend.started("a")
    b, _ = backend.started("b")

    old = a.acquire(6)
    assert old is not None
    a.release(old)
    newer = b.acquire(6)
    assert newer is not None
    a.release(old)
    b.release(old)
    assert b.lease_holders() == {6: "b"}
    assert b.is_valid(newer)

    mine = a.acquire(8)
    assert mine is not None
    a.release(mine)
    again = a.acquire(8)
    assert again is not None
    a.release(mine)
    assert a.lease_holders() == {6: "b", 8: "a"}
    assert a.is_valid(again)


def test_lease_holders_maps_every_held_shard_to_its_member(backend: Backend) -> None:
    a, _ = backend.started("a")
    b, _ = backend.started("b")
    assert a.lease_holders() == {}

    for coordinator, shard in [(a, 1), (a, 2), (b, 7)]:
        assert coordinator.acquire(shard) is not None
    assert a.lease_holders() == {1: "a", 2: "a", 7: "b"}
    assert b.lease_holders() == {1: "a", 2: "a", 7: "b"}

    b.close()
    wait_until(lambda: a.lease_holders() == {1: "a", 2: "a"}, timeout_s=5, what="b's lease to go with it")


def test_a_lease_is_valid_while_held_and_never_after_close(backend: Backend) -> None:
    a, _ = backend.started("a")
    b, _ = backend.started("b")
    lease = a.acquire(4)
    assert lease is not None
    assert a.is_valid(lease)

    a.close()
    assert not a.is_valid(lease)
    taken = b.acquire(4)
    assert taken is not None, "close releases the leases"
    assert taken.token > lease.token


def test_the_leases_of_a_dead_session_pass_to_another_member_with_larger_tokens(backend: Backend) -> None:
    a, a_heard = backend.started("a")
    b, _ = backend.started("b")
    lease = a.acquire(9)
    other = a.acquire(10)
    assert lease is not None and other is not None

    backend.kill(a)

    taken = wait_until(lambda: b.acquire(9), timeout_s=EXPIRY_DEADLINE_S, what="shard 9 to come free")
    assert taken is not None
    assert taken.token > lease.token
    assert taken.token > other.token
    assert b.lease_holders() == {9: "b"}, "every lease of the dead session is gone"
    wait_until(lambda: not a.is_valid(lease), timeout_s=5, what="a to stop trusting its lease")
    assert not a.confirm(lease)
    assert b.confirm(taken)

    if backend.survives_kill:
        wait_until(
            lambda: a_heard.states[-2:] == [SessionState.LOST, SessionState.CONNECTED],
            timeout_s=EXPIRY_DEADLINE_S,
            what="a to hear LOST, then CONNECTED on a new session",
        )
        assert SessionState.LOST in a_heard.states
        assert not a.is_valid(lease), "a lease of an expired session is never valid again"
        assert a.acquire(9) is None
        assert a.members() == ["a", "b"], "a is registered again under its new session"
        again = a.acquire(10)
        assert again is not None
        assert again.token > other.token


def test_watch_fires_when_a_member_joins_and_when_a_lease_is_released(backend: Backend) -> None:
    a, _ = backend.started("a")
    notices: list[int] = []
    a.watch(lambda: notices.append(1))

    b, _ = backend.started("b")
    wait_until(lambda: notices, timeout_s=5, what="a notice of b joining")

    seen = len(notices)
    lease = b.acquire(12)
    assert lease is not None
    wait_until(lambda: len(notices) > seen, timeout_s=5, what="a notice of b's lease")

    seen = len(notices)
    b.release(lease)
    wait_until(lambda: len(notices) > seen, timeout_s=5, what="a notice of b's release")


def test_a_member_name_in_use_is_refused_and_free_again_after_close(backend: Backend) -> None:
    a, _ = backend.started("twin")
    b = backend.make()

    with pytest.raises(CoordinatorError, match="twin") as refused:
        b.start("twin", Recorder())
    assert not isinstance(refused.value, CoordinatorUnavailable)
    assert a.members() == ["twin"]

    a.close()
    c, _ = backend.started("twin")
    assert c.members() == ["twin"]


def test_start_fails_as_unavailable_naming_an_address_that_does_not_answer(backend: Backend) -> None:
    nowhere = backend.unreachable()
    with pytest.raises(CoordinatorUnavailable, match=re.escape(backend.unreachable_address)):
        nowhere.start("a", Recorder())


def test_of_many_sessions_taking_one_shard_at_once_exactly_one_wins(backend: Backend) -> None:
    racers = [backend.started(f"racer-{index}")[0] for index in range(8)]
    for shard in (13, 14, 15):
        leases = all_at_once([partial(racer.acquire, shard) for racer in racers], timeout_s=30)
        winners = [index for index, lease in enumerate(leases) if lease is not None]
        assert len(winners) == 1, leases
        assert racers[0].lease_holders()[shard] == f"racer-{winners[0]}"


def test_confirm_asks_the_coordinator_itself(backend: Backend) -> None:
    a, _ = backend.started("a")
    b, _ = backend.started("b")
    lease = a.acquire(2)
    assert lease is not None
    assert a.confirm(lease)
    assert not b.confirm(lease), "a lease is confirmed only to the session that made it"

    backend.remove_lease(2)
    assert a.is_valid(lease), "is_valid knows only this side's view"
    assert not a.confirm(lease)
    newer = wait_until(lambda: b.acquire(2), timeout_s=5, what="shard 2 to be free")
    assert newer is not None
    assert not a.confirm(lease)
    assert b.confirm(newer)

    b.release(newer)
    assert not b.confirm(newer)


# The embedded coordinator's own behaviour, on a clock stepped by hand.


class ManualClock:
    def __init__(self, now: float = 1_000.0) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds


def test_an_embedded_session_past_its_expiry_is_lost_then_opened_anew(tmp_path: Path) -> None:
    clock = ManualClock()
    make = partial(SqliteCoordinator, tmp_path / "c.db", session_timeout_s=1.0, clock=clock, heartbeat=False)
    a, b = make(), make()
    a_heard = Recorder()
    a.start("a", a_heard)
    b.start("b", Recorder())
    try:
        lease = a.acquire(1)
        assert lease is not None

        clock.advance(0.6)
        a.heartbeat_once()  # a lives until 1001.6
        b.heartbeat_once()
        clock.advance(0.6)
        b.heartbeat_once()
        assert b.acquire(1) is None
        assert a.is_valid(lease)

        clock.advance(0.5)  # 1001.7: a has expired, and nothing has told it so
        assert not a.is_valid(lease), "validity follows the clock, without I/O"
        assert not a.confirm(lease)
        taken = b.acquire(1)
        assert taken is not None
        assert taken.token > lease.token
        assert a_heard.states == []

        a.heartbeat_once()
        assert a_heard.states == [SessionState.LOST, SessionState.CONNECTED]
        assert not a.is_valid(lease)
        assert a.acquire(1) is None
        assert a.members() == ["a", "b"]
        assert a.lease_holders() == {1: "b"}
    finally:
        a.close()
        b.close()


def test_an_embedded_session_that_cannot_write_its_heartbeat_is_suspended(tmp_path: Path) -> None:
    clock = ManualClock()
    path = tmp_path / "c.db"
    a = SqliteCoordinator(path, session_timeout_s=1.0, clock=clock, heartbeat=False)
    heard = Recorder()
    a.start("a", heard)
    try:
        lease = a.acquire(2)
        assert lease is not None
        blocker = sqlite3.connect(path, isolation_level=None)
        try:
            blocker.execute("BEGIN IMMEDIATE")
            clock.advance(0.6)
            a.heartbeat_once()  # waits out the busy timeout, then gives up
            assert heard.states == [SessionState.SUSPENDED]
            assert not a.is_valid(lease)
        finally:
            blocker.execute("ROLLBACK")
            blocker.close()

        a.heartbeat_once()
        assert heard.states == [SessionState.SUSPENDED, SessionState.CONNECTED]
        assert a.is_valid(lease), "the session never expired, so its lease is good again"
    finally:
        a.close()


def test_a_member_killed_in_another_process_frees_its_leases_after_the_timeout(tmp_path: Path) -> None:
    path = tmp_path / "c.db"
    holder = f"""
from pathlib import Path
from scheduler.adapters.embedded.coordinator import SqliteCoordinator
coordinator = SqliteCoordinator(Path({str(path)!r}), session_timeout_s=1.0)
coordinator.start("elsewhere", lambda state: None)
print(coordinator.acquire(20).token, flush=True)
"""  # and exits without closing, as if killed
    run = subprocess.run([sys.executable, "-c", holder], capture_output=True, text=True, timeout=60, cwd=REPO)
    assert run.returncode == 0, run.stderr
    their_token = int(run.stdout)

    here = SqliteCoordinator(path, session_timeout_s=1.0)
    here.start("here", Recorder())
    try:
        assert here.lease_holders() == {20: "elsewhere"}
        assert here.acquire(20) is None
        taken = wait_until(lambda: here.acquire(20), timeout_s=10, what="the dead process's lease to expire")
        assert taken is not None
        assert taken.token > their_token
        assert here.members() == ["here"]
    finally:
        here.close()


def test_embedded_watch_callbacks_come_from_the_heartbeat_thread(tmp_path: Path) -> None:
    a = SqliteCoordinator(tmp_path / "c.db", session_timeout_s=1.0)
    a.start("a", Recorder())
    threads: list[threading.Thread] = []
    a.watch(lambda: threads.append(threading.current_thread()))
    try:
        lease = a.acquire(3)
        assert lease is not None
        wait_until(lambda: threads, timeout_s=5, what="a notice of the local lease")
        assert threading.current_thread() not in threads
    finally:
        a.close()
