"""How the scheduler's kazoo clients authenticate, and the ACL its znodes get.

With an identity (`ZooKeeperSettings.auth_file`), a client sends it as a digest
`user:password` on every connection, and every znode it creates carries `acl_for`: all
rights for that identity, read for anyone. ZooKeeper checks a create or a delete
against the ACL of the parent, so it is the ACL of the root, `members` and `leases`
that keeps others from taking a shard or removing someone's lease; the ACL of a lease
itself keeps them from changing its data.

Read stays open so that an operator (`zkCli.sh get <root>/leases/7`) or a monitor can
see who holds what without being given the secret; the znodes hold member names, host
names and process ids, nothing secret.

The identity is what ACLs check; it does not hide the traffic. Over a clear-text
connection the digest credential crosses the network as sent: with
`ZooKeeperSettings.tls` the connection is encrypted and the server authenticated first.
"""

from __future__ import annotations

import logging
from typing import Any

from kazoo.protocol.serialization import Auth
from kazoo.security import ACL, ANYONE_ID_UNSAFE, Permissions, make_digest_acl

from scheduler.adapters.zookeeper.tls import tls_options
from scheduler.settings import TlsFiles, ZooKeeperIdentity

KAZOO_LOGGER = "kazoo.client"


def acl_for(identity: ZooKeeperIdentity) -> list[ACL]:
    """All rights for `identity`, read for anyone."""
    return [
        make_digest_acl(identity.user, identity.password, all=True),
        ACL(Permissions.READ, ANYONE_ID_UNSAFE),
    ]


def open_to_anyone(acl: list[ACL]) -> bool:
    """Whether `acl` lets anyone at all do more than read (ZooKeeper's default ACL does)."""
    return any(entry.id == ANYONE_ID_UNSAFE and entry.perms & ~Permissions.READ for entry in acl)


def client_options(identity: ZooKeeperIdentity | None, tls: TlsFiles | None = None) -> dict[str, Any]:
    """`KazooClient` keyword arguments: authenticate as `identity` and create znodes with
    its ACL, or nothing at all without one (open znodes, as before identities); and
    connect over TLS with `tls` (`tls.py`), or in clear text without."""
    options = tls_options(tls)
    if identity is None:
        return options
    return {
        **options,
        "auth_data": [("digest", identity.credential)],
        "default_acl": acl_for(identity),
        "logger": redacting_logger(),
    }


class _HideAuth(logging.Filter):
    """kazoo logs every request it sends at DEBUG, the `Auth` one too, whose repr holds
    `user:password`: show that one with its credential left out."""

    def filter(self, record: logging.LogRecord) -> bool:
        if isinstance(record.args, tuple) and any(isinstance(arg, Auth) for arg in record.args):
            record.args = tuple(
                arg._replace(auth="<hidden>") if isinstance(arg, Auth) else arg for arg in record.args
            )
        return True


def redacting_logger() -> logging.Logger:
    """kazoo's logger, with the filter that keeps the credential out of its records (once)."""
    logger = logging.getLogger(KAZOO_LOGGER)
    if not any(isinstance(existing, _HideAuth) for existing in logger.filters):
        logger.addFilter(_HideAuth())
    return logger
