"""Coordination's port: membership, shard leases and fencing tokens (ZooKeeper through
kazoo, or the embedded SQLite coordinator)."""

from __future__ import annotations

import enum
from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol


class SessionState(enum.Enum):
    """The coordinator session's health, as its listener hears of it.

    `CONNECTED`: leases are held. `SUSPENDED`: the connection dropped; the session (and
    its leases) may still be alive, or may be expiring now; stop firing at once, keep the
    leases, and resume if `CONNECTED` follows. `LOST`: the session expired; every lease it
    held is gone (others may hold those shards already) and must never be used again.
    """

    CONNECTED = "connected"
    SUSPENDED = "suspended"
    LOST = "lost"


@dataclass(frozen=True, slots=True)
class Lease:
    """A held shard lease. `token` is its fencing token: every new lease of a shard gets
    a larger one (ZooKeeper: the lease znode's `czxid`), so a store write carrying it is
    refused once a newer lease has written. `session` names the coordinator session that
    created it (opaque), so a lease from an expired session is never taken for valid."""

    shard: int
    token: int
    session: int


class Coordinator(Protocol):
    """Membership of dispatchers and exclusive, fenced shard leases.

    A lease lives as long as the session that created it: an ephemeral znode (ZooKeeper)
    or an entry of the embedded hub. A member that dies stops renewing its session, the
    session expires after the session timeout, and its leases and membership vanish, so
    other members can take the shards. At most one lease of a shard exists at any moment.

    Thread-safety: every method may be called from several threads at once. Failures:
    `CoordinatorUnavailable` from `start` when no server answers; `CoordinatorError` from
    the others when the session is not usable (a lost lease is never an exception: it
    shows as `is_valid` turning False and as a `LOST` or `SUSPENDED` state).
    """

    def start(self, member: str, on_state: Callable[[SessionState], None]) -> None:
        """Open the session and register `member` (unique among live members). `on_state`
        is called on every change of the session's state, from the coordinator's own
        thread, at once: it must only set flags, never block."""
        ...

    def members(self) -> list[str]:
        """Live members, sorted."""
        ...

    def lease_holders(self) -> dict[int, str]:
        """Every live lease: shard -> the member holding it."""
        ...

    def acquire(self, shard: int) -> Lease | None:
        """Take the shard's lease, or None if any session (this one included) holds it."""
        ...

    def release(self, lease: Lease) -> None:
        """Give the lease up if it is still this session's with this token; no error if it
        is already gone. Callers stop firing the shard before they release it."""
        ...

    def is_valid(self, lease: Lease) -> bool:
        """Whether the lease may still be used: the session that made it is this one's and
        is `CONNECTED`. No I/O: called before every publish batch."""
        ...

    def confirm(self, lease: Lease) -> bool:
        """Whether the lease still exists and is this session's, asked of the coordinator
        itself (I/O). For a process that was paused: its own view of the session may not
        have caught up yet, so before firing again it asks."""
        ...

    def watch(self, callback: Callable[[], None]) -> None:
        """Call `callback` (from the coordinator's thread; it must not block) whenever the
        members or the leases may have changed. Callers also re-check periodically."""
        ...

    def close(self) -> None:
        """Release every lease this session holds, leave, and close the session."""
        ...
