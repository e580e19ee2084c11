"""Against the real ZooKeeper: an ephemeral lease znode's czxid is a fencing token
(every re-creation has a larger one) and the znode goes with its session."""

from __future__ import annotations

from tests.support import wait_until, zookeeper_session


def test_a_recreated_ephemeral_lease_has_a_larger_czxid_each_time(zk_chroot: str) -> None:
    with zookeeper_session(zk_chroot) as client:
        client.ensure_path("/leases")
        tokens = []
        for _ in range(4):
            client.create("/leases/7", b"dispatcher-a", ephemeral=True)
            _, stat = client.get("/leases/7")
            tokens.append(stat.czxid)
            client.delete("/leases/7")
    assert tokens == sorted(set(tokens)), tokens


def test_an_ephemeral_lease_goes_with_its_session_and_the_next_one_fences_it(zk_chroot: str) -> None:
    with zookeeper_session(zk_chroot) as observer:
        with zookeeper_session(zk_chroot) as holder:
            observer.ensure_path("/leases")
            holder.create("/leases/3", b"dispatcher-a", ephemeral=True)
            first_token = observer.get("/leases/3")[1].czxid
        # The holder's session is closed now, and its ephemeral node with it.
        wait_until(lambda: observer.exists("/leases/3") is None, timeout_s=10, what="the lease to vanish")
        observer.create("/leases/3", b"dispatcher-b", ephemeral=True)
        data, stat = observer.get("/leases/3")
        assert data == b"dispatcher-b"
        assert stat.czxid > first_token
