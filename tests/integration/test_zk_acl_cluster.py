"""`scheduler dispatcher --zookeeper-auth-file` on the whole backend: a dispatcher with
the identity holds its shards in znodes no one else can remove; a stranger's attempt
changes nothing; a second dispatcher with a wrong password exits 2 saying ZooKeeper
refused it, naming the file and not the password."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
from kazoo.exceptions import NoAuthError

from tests.cluster import Cluster
from tests.dispatchers import Deployment
from tests.support import run_cli, wait_until, zookeeper_session

SHARDS = 64
PASSWORD = "cluster-test-password-7d1"


def auth_file(directory: Path, credential: str, name: str) -> Path:
    path = directory / name
    path.write_text(credential + "\n")
    path.chmod(0o600)
    return path


def test_a_stranger_cannot_remove_a_dispatchers_lease_and_a_wrong_password_exits_2(
    cluster: Cluster, deployment: Deployment, tmp_path: Path
) -> None:
    root = deployment.fleet.env["SCHEDULER_ZOOKEEPER_ROOT"]
    right = auth_file(tmp_path, f"scheduler:{PASSWORD}", "right")
    wrong = auth_file(tmp_path, "scheduler:not-it-3c9", "wrong")
    try:
        holder = deployment.fleet.start("a", "--zookeeper-auth-file", str(right))
        deployment.fleet.wait_for_split({"a": SHARDS}, timeout_s=60)

        with zookeeper_session(cluster.zookeeper.hosts) as stranger:
            tokens = {shard: stranger.get(f"{root}/leases/{shard}")[1].czxid for shard in range(SHARDS)}
            for path in (f"{root}/leases/0", f"{root}/members/a"):
                with pytest.raises(NoAuthError):
                    stranger.delete(path)
            with pytest.raises(NoAuthError):
                stranger.create(f"{root}/members/b", b"{}", ephemeral=True)

            refused = run_cli("dispatcher", "--member", "b", "--zookeeper-auth-file", str(wrong),
                              env={**os.environ, **deployment.fleet.env}, timeout_s=120)

            assert refused.returncode == 2, refused.stderr
            assert "error: ZooKeeper at " in refused.stderr
            assert f"refused to register member 'b': the ACLs under {root} do not grant it" in refused.stderr
            assert str(wrong) in refused.stderr
            assert "not-it-3c9" not in refused.stderr and PASSWORD not in refused.stderr
            assert "Traceback" not in refused.stderr
            # Nothing lost: every lease is still the one it was, and "a" still fires all shards.
            assert {shard: stranger.get(f"{root}/leases/{shard}")[1].czxid for shard in range(SHARDS)} == tokens
            assert stranger.get_children(f"{root}/members") == ["a"]
        assert holder.alive()
        wait_until(lambda: len(holder.shards()) == SHARDS, timeout_s=10, what="dispatcher a to hold every shard")
        assert PASSWORD not in holder.log()
    finally:
        deployment.fleet.stop_all()
        with zookeeper_session(cluster.zookeeper.hosts) as owner:
            owner.add_auth("digest", f"scheduler:{PASSWORD}")
            if owner.exists(root):
                owner.delete(root, recursive=True)
