"""`ZkCoordinator`: dispatcher membership and fenced shard leases on ZooKeeper (kazoo).

Layout under `settings.root` (inside whatever chroot the hosts string names):

    <root>/members/<member>   ephemeral; data: {"member", "host", "pid"} as JSON
    <root>/leases/<shard>     ephemeral; data: the holder's member name

With an identity (`ZooKeeperSettings.auth_file`) the client authenticates as it, and
every znode it creates, the root among them, is writable by that identity alone
(`security.py`). A root, `members` or `leases` that already exists open to anyone (made
before an identity was configured) is given that ACL when the member joins, with a
warning naming it. A request ZooKeeper refuses for want of rights or authentication is
`CoordinatorAccessDenied`, a setting to fix rather than an outage to wait out.

With TLS (`ZooKeeperSettings.tls`, `tls.py`) every connection is encrypted and the
server's certificate checked. A `start` that gets no session is then told apart: if a
TLS handshake of its own shows the server refusing this client's certificate (or its
lack of one), a server certificate the CA does not vouch for, or TLS and clear text
crossed, it is `CoordinatorAccessDenied` naming the server, the cause and the settings;
if no server answers, `CoordinatorUnavailable` as before.

A lease is its znode. It lives as long as the session that created it, and the znode's
`czxid` (the zxid of its create) is the fencing token: every new lease of a shard has a
larger one than any before it. `Lease.session` is the kazoo session id; a lease is valid
only while that session is this coordinator's current one and is connected.

Session states, as `on_state` hears them (kazoo's `KazooState` on the left):

    start() returns ..................................... CONNECTED  (no notice)
    CONNECTED --connection dropped--> SUSPENDED ......... SUSPENDED  leases kept, not valid
    SUSPENDED --same session again--> CONNECTED ......... CONNECTED  the same leases valid again
    SUSPENDED --session expired--> LOST ................. LOST       every lease gone for good
    LOST --new session--> CONNECTED, member re-registered CONNECTED  no leases: acquire anew
    any --close()--> closed ............................. (no notice)

After a LOST the member is registered again on a thread of its own (kazoo's listener
thread must not block); CONNECTED is reported only once that is done.

How it fails:

- ZooKeeper decides when a session expires, and the client only learns of it when it
  reconnects. A cut longer than the session timeout therefore reads SUSPENDED for its
  whole length and LOST only when the connection comes back; other members may take the
  shards one session timeout after the server last heard from us. SUSPENDED comes at once
  when the socket breaks, and within about two thirds of the session timeout when packets
  silently vanish (kazoo's read timeout), i.e. before the server can expire the session:
  stopping at SUSPENDED is what keeps a lease from being used after someone else took it.
- A process paused (GC, SIGSTOP) past the session timeout may see `is_valid` True for a
  moment after it wakes, until kazoo's thread reads the closed socket. `confirm` asks the
  server (sync, then the znode's stat) and is the check to make after a stall; the
  fencing token is what makes the store refuse a straggler's writes all the same.
- Requests are made only while CONNECTED (reads: while kazoo is connected), bounded by
  the session timeout; every kazoo failure leaves as `CoordinatorError`.
- `release` never fails for want of a connection: the lease stops being valid at once,
  and its znode is deleted when the session is connected again (or goes with the session
  if that expires). A create whose answer was lost to a dropped connection leaves a znode
  of this session that no caller holds; the next `acquire` of that shard adopts it.
- A member name held by another live session: `start` waits up to a session timeout (and
  a margin) for it to go, since it may be this member's previous, dead incarnation whose
  session has not expired yet; then `CoordinatorError`. If another session took the name
  while this one was lost, the coordinator stays LOST and keeps trying.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from typing import Any

from kazoo.client import KazooClient
from kazoo.exceptions import (
    AuthFailedError,
    BadVersionError,
    KazooException,
    NoAuthError,
    NodeExistsError,
    NoNodeError,
)
from kazoo.handlers.threading import KazooTimeoutError
from kazoo.protocol.states import KazooState
from kazoo.recipe.watchers import ChildrenWatch

from scheduler.adapters.zookeeper.security import acl_for, client_options, open_to_anyone
from scheduler.adapters.zookeeper.tls import refusal
from scheduler.errors import ConfigError, CoordinatorAccessDenied, CoordinatorError, CoordinatorUnavailable
from scheduler.ports import Lease, SessionState
from scheduler.settings import ZooKeeperIdentity, ZooKeeperSettings

log = logging.getLogger(__name__)

KAZOO_ERRORS: tuple[type[Exception], ...] = (KazooException, KazooTimeoutError)
"""What kazoo raises when ZooKeeper fails or cannot be reached: turned into
`CoordinatorError` at this module's boundary."""
_SETUP_ERRORS: tuple[type[Exception], ...] = (ValueError, *KAZOO_ERRORS)
"""What making a client of a malformed hosts string raises."""
_CLOSE_ERRORS: tuple[type[Exception], ...] = (OSError, *KAZOO_ERRORS)
"""What stopping a client whose connection is already broken may raise."""
TLS_CHECK_TIMEOUT_S = 5.0
"""The most the TLS check after a failed start waits for a server's TCP answer."""
_REFUSALS: tuple[type[Exception], ...] = (NoAuthError, AuthFailedError)
"""What ZooKeeper answers to a request the ACL does not allow, or to a failed
authentication: `CoordinatorAccessDenied`."""


def check_member(member: str) -> str:
    """A member name usable as a znode name: not empty, no '/', not '.' or '..'."""
    if not member or "/" in member or "\x00" in member or member in (".", ".."):
        raise ConfigError(f"member name {member!r} is not usable: give a non-empty name without '/'")
    return member


def _setter(event: threading.Event) -> Callable[[Any], None]:
    """A kazoo watch function that sets `event`, whatever happened."""
    return lambda watched: event.set()


class _ChangeNotice:
    """A `ChildrenWatch` function that calls `callback` on every change of the children
    but not on the watch's first reading (which kazoo makes on the caller's thread)."""

    def __init__(self, callback: Callable[[], None]) -> None:
        self._callback = callback
        self._primed = False

    def __call__(self, children: list[str]) -> None:
        if not self._primed:
            self._primed = True
            return
        try:
            self._callback()
        except Exception:
            log.exception("a coordinator watch callback failed", extra={"action": "coordinator.watch_failed"})


class ZkCoordinator:
    """The `Coordinator` (`scheduler.ports`) on ZooKeeper. One instance, one member, one
    `start`; thread-safe."""

    def __init__(self, settings: ZooKeeperSettings) -> None:
        self._settings = settings
        root = settings.root.rstrip("/")
        self._root = root
        self._members_path = f"{root}/members"
        self._leases_path = f"{root}/leases"
        self._request_timeout_s = max(settings.session_timeout_s, 1.0)
        self._name_wait_s = settings.session_timeout_s + max(1.0, settings.session_timeout_s / 2)
        self._client: Any = None
        self._identity: ZooKeeperIdentity | None = None
        self._member = ""
        self._on_state: Callable[[SessionState], None] = lambda state: None
        # `_lock` guards the session state and orders the notices; no I/O happens under it.
        self._lock = threading.RLock()
        # `_lease_lock` orders acquire and release of this session's lease znodes.
        self._lease_lock = threading.Lock()
        self._status: tuple[SessionState, int | None] = (SessionState.LOST, None)
        self._reported = SessionState.CONNECTED
        self._past_sessions: set[int] = set()
        self._held: dict[int, tuple[int, int]] = {}  # shard -> (session, token) handed out
        self._unreleased: dict[int, tuple[int, int]] = {}  # released, znode not deleted yet
        self._notices: list[Callable[[], None]] = []
        self._watches: list[Any] = []
        self._started = False
        self._closed = False
        self._closing = threading.Event()

    # Session

    def start(self, member: str, on_state: Callable[[SessionState], None]) -> None:
        check_member(member)
        identity = self._settings.identity()  # a bad auth file fails before anything is joined
        if self._settings.tls is not None:
            self._settings.tls.check("ZooKeeper")  # so does an unreadable TLS file
        with self._lock:
            if self._started or self._closed:
                raise CoordinatorError("this coordinator was started before; make a new one")
            self._started = True
        self._member = member
        self._on_state = on_state
        self._identity = identity
        settings = self._settings
        try:
            client = KazooClient(
                hosts=settings.hosts,
                timeout=settings.session_timeout_s,
                connection_retry={
                    "max_tries": -1,
                    "delay": 0.05,
                    "backoff": 2,
                    "max_jitter": 0.2,
                    "max_delay": max(0.25, min(2.0, settings.session_timeout_s / 4)),
                },
                **client_options(identity, settings.tls),
            )
        except _SETUP_ERRORS as exc:
            raise ConfigError(f"ZooKeeper hosts {settings.hosts!r} are not usable: {exc}") from exc
        client.add_listener(self._on_kazoo_state)
        try:
            client.start(timeout=settings.connect_timeout_s)
        except KAZOO_ERRORS as exc:  # kazoo has stopped and closed the client already
            self._closed = True
            # kazoo retries a refused TLS handshake as it does an outage: ask once ourselves.
            refused = refusal(settings.hosts, settings.tls, min(settings.connect_timeout_s, TLS_CHECK_TIMEOUT_S))
            if refused is not None:
                raise CoordinatorAccessDenied(f"no ZooKeeper session within {settings.connect_timeout_s} s: {refused}") from exc
            raise CoordinatorUnavailable(
                f"no ZooKeeper server at {settings.hosts} answered within {settings.connect_timeout_s} s: "
                "check SCHEDULER_ZOOKEEPER_HOSTS and that ZooKeeper is running"
            ) from exc
        self._client = client
        try:
            session = self._current_session()
            if session is None:
                raise CoordinatorError(f"the connection to ZooKeeper at {settings.hosts} dropped while starting")
            self._join(session)
            with self._lock:
                current = self._current_session()
                if current not in (session, None):
                    raise CoordinatorError("the ZooKeeper session expired while starting; start again")
                connected = current == session and client.state == KazooState.CONNECTED
                self._set(SessionState.CONNECTED if connected else SessionState.SUSPENDED, session)
                notices = list(self._notices)
            for notice in notices:
                self._install(notice)
        except BaseException:
            self._closed = True
            self._status = (SessionState.LOST, None)
            self._stop_client()
            raise
        log.info(
            "joined as a member", extra={"action": "coordinator.started", "member": member, "session": hex(session)}
        )

    @property
    def session_handle(self) -> tuple[int, bytes] | None:
        """The current kazoo session's (id, password), or None while disconnected: what a
        second client needs to join the session, e.g. to end it from outside in a test."""
        client_id = self._client.client_id if self._client is not None else None
        return (int(client_id[0]), bytes(client_id[1])) if client_id else None

    def _current_session(self) -> int | None:
        client_id = self._client.client_id if self._client is not None else None
        return int(client_id[0]) if client_id else None

    def _set(self, state: SessionState, session: int | None) -> None:
        """Record the state and tell `on_state` if it changed. Called under `_lock`."""
        self._status = (state, session)
        if state is self._reported or self._closed:
            return
        self._reported = state
        log.log(
            logging.INFO if state is SessionState.CONNECTED else logging.WARNING,
            "ZooKeeper session %s",
            state.value,
            extra={"action": f"coordinator.{state.value}", "member": self._member},
        )
        try:
            self._on_state(state)
        except Exception:
            log.exception("on_state failed", extra={"action": "coordinator.on_state_failed"})

    def _on_kazoo_state(self, kazoo_state: Any) -> None:
        """kazoo's listener, on its connection thread: translate and report, never block."""
        with self._lock:
            state, session = self._status
            if session is None or self._closed:
                return  # not started yet (start decides the first state), or closed
            if kazoo_state == KazooState.SUSPENDED:
                if state is SessionState.CONNECTED:
                    self._set(SessionState.SUSPENDED, session)
            elif kazoo_state == KazooState.LOST:
                self._lose(session)
            elif kazoo_state == KazooState.CONNECTED:
                current = self._current_session()
                if current is None:
                    return
                if current == session:
                    if state is SessionState.SUSPENDED:
                        self._set(SessionState.CONNECTED, session)
                        if self._unreleased:
                            threading.Thread(
                                target=self._flush_unreleased, name=f"zk-release-{self._member}", daemon=True
                            ).start()
                    return
                self._lose(session)
                threading.Thread(
                    target=self._rejoin, args=(current,), name=f"zk-rejoin-{self._member}", daemon=True
                ).start()

    def _lose(self, session: int) -> None:
        if self._status[0] is not SessionState.LOST:
            self._past_sessions.add(session)
            self._set(SessionState.LOST, session)

    def _flush_unreleased(self) -> None:
        """Delete the znodes of leases released while the session was suspended."""
        with self._lease_lock:
            for shard, (session, token) in list(self._unreleased.items()):
                if session == self._status[1]:
                    try:
                        self._delete_lease(shard, token, session)
                    except CoordinatorError:
                        return  # the next reconnection tries again
                del self._unreleased[shard]

    def _rejoin(self, session: int) -> None:
        """Register the member under the new `session`, then report CONNECTED."""
        while True:
            try:
                self._join(session)
                break
            except CoordinatorError as exc:
                if self._closed or self._current_session() != session:
                    return  # a later connection (or close) takes over
                log.error(
                    "cannot register again after the session was lost: %s",
                    exc,
                    extra={"action": "coordinator.rejoin_failed", "member": self._member},
                )
                if self._closing.wait(min(1.0, self._settings.session_timeout_s / 2)):
                    return
        with self._lock:
            if self._closed or self._status[1] == session:
                return
            if self._current_session() == session and self._client.state == KazooState.CONNECTED:
                self._set(SessionState.CONNECTED, session)

    def _join(self, session: int) -> None:
        for path in (self._members_path, self._leases_path):
            self._await(self._client.ensure_path_async(path), f"create {path}")
        if self._identity is not None:
            self._restrict_open_nodes(self._identity)
        self._register(session)

    def _restrict_open_nodes(self, identity: ZooKeeperIdentity) -> None:
        """Give the root, `members` and `leases` the identity's ACL where anyone may still
        change them (made before an identity was configured), with a warning for each.
        ZooKeeper checks creates and deletes against the parent's ACL, so this is what
        protects the members and leases; the ephemeral ones already there go with their
        sessions. An ACL that is not open is left as it is: an operator's choice, or
        another identity's (whose root this member cannot use: its register fails).
        The root "/" is never changed: it is not the scheduler's alone."""
        acl = acl_for(identity)
        for path in (self._root, self._members_path, self._leases_path):
            if not path:
                continue
            what = f"restrict the ACL of {path}"
            while True:
                current, stat = self._await(self._client.get_acls_async(path), what)
                if not open_to_anyone(current):
                    break
                try:
                    self._await(self._client.set_acls_async(path, acl, version=stat.aversion), what,
                                expected=(BadVersionError,))
                except BadVersionError:
                    continue  # changed meanwhile (another member doing the same): look again
                log.warning(
                    "ZooKeeper node %s was open to anyone; it is now writable by digest user %r only "
                    "(read: anyone)", path, identity.user,
                    extra={"action": "coordinator.acl_restricted", "member": self._member, "path": path},
                )
                break

    def _register(self, session: int) -> None:
        """Create this member's znode under `session`. A znode left by one of this
        coordinator's expired sessions is replaced; one of another live session is waited
        out for `_name_wait_s`, then refused."""
        path = f"{self._members_path}/{self._member}"
        data = json.dumps({"member": self._member, "host": socket.gethostname(), "pid": os.getpid()}).encode()
        deadline = time.monotonic() + self._name_wait_s
        what = f"register member {self._member!r}"
        while True:
            try:
                self._await(self._client.create_async(path, data, ephemeral=True), what, expected=(NodeExistsError,))
                return
            except NodeExistsError:
                pass
            try:
                held, stat = self._await(self._client.get_async(path), what, expected=(NoNodeError,))
            except NoNodeError:
                continue
            with self._lock:
                ours_before = stat.ephemeralOwner in self._past_sessions
            if stat.ephemeralOwner == session:
                return
            if ours_before:
                self._delete(path, stat.version, what)
                continue
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorError(
                    f"member name {self._member!r} is held by another live ZooKeeper session "
                    f"({held.decode(errors='replace')}); stop that dispatcher or choose another name"
                )
            gone = threading.Event()
            if self._await(self._client.exists_async(path, watch=_setter(gone)), what) is not None:
                gone.wait(remaining)
            if self._closing.is_set():
                raise CoordinatorError(f"closed while waiting for member name {self._member!r} to be free")

    def close(self) -> None:
        with self._lock:
            if self._closed:
                return
            self._closed = True
            state, session = self._status
            self._status = (SessionState.LOST, None)
        self._closing.set()
        if self._client is None:
            return
        if state is SessionState.CONNECTED and session is not None:
            with self._lease_lock:
                mine = [*self._held.items(), *self._unreleased.items()]
                held = [(shard, token) for shard, (owner, token) in mine if owner == session]
                self._held.clear()
                self._unreleased.clear()
                for shard, token in held:
                    try:
                        self._delete_lease(shard, token, session)
                    except CoordinatorError as exc:
                        log.warning("lease of shard %d not released on close: %s", shard, exc)
        self._stop_client()
        log.info("left", extra={"action": "coordinator.closed", "member": self._member})

    def _stop_client(self) -> None:
        """Stop and close the client, once (from `close`, or from a failed `start`). The
        stopped client stays, so a request that races with closing fails as a kazoo
        `ConnectionClosedError`, i.e. as `CoordinatorError`."""
        client = self._client
        if client is None:
            return
        try:
            client.stop()
            client.close()
        except _CLOSE_ERRORS as exc:
            log.warning("ZooKeeper client did not close cleanly: %s", exc)

    # Requests

    def _await(self, request: Any, what: str, *, expected: tuple[type[Exception], ...] = ()) -> Any:
        """The result of a kazoo request; `expected` errors pass through, the rest of
        kazoo's become `CoordinatorError`."""
        try:
            return request.get(timeout=self._request_timeout_s)
        except expected:
            raise
        except _REFUSALS as exc:
            raise CoordinatorAccessDenied(self._refusal(what, exc)) from exc
        except KAZOO_ERRORS as exc:
            raise CoordinatorError(
                f"ZooKeeper at {self._settings.hosts} could not {what}: {type(exc).__name__} {exc}".rstrip()
            ) from exc

    def _refusal(self, what: str, exc: Exception) -> str:
        """Why ZooKeeper refused to `what`, and where to look: the identity's user and
        file when there is one (never its password), the setting to give otherwise."""
        settings = self._settings
        refused = f"ZooKeeper at {settings.hosts} refused to {what}"
        root = self._root or "/"
        if isinstance(exc, AuthFailedError):
            return f"{refused}: authentication failed ({type(exc).__name__}); check SCHEDULER_ZOOKEEPER_AUTH_FILE"
        if self._identity is None:
            return (
                f"{refused}: the ACLs under {root} grant it only to an identity, and none is configured "
                "(SCHEDULER_ZOOKEEPER_AUTH_FILE, --zookeeper-auth-file)"
            )
        return (
            f"{refused}: the ACLs under {root} do not grant it to digest user {self._identity.user!r} of "
            f"{settings.auth_file}; check that file's password, or whether another identity made {root}"
        )

    def _usable_session(self, what: str) -> int:
        state, session = self._status
        if session is None or self._closed:
            raise CoordinatorError(f"cannot {what}: the coordinator is not started, or closed")
        if state is not SessionState.CONNECTED:
            raise CoordinatorError(f"cannot {what}: the ZooKeeper session is {state.value}; wait for CONNECTED")
        return session

    def _readable(self, what: str) -> Any:
        client = self._client
        if client is None or self._closed or self._status[1] is None:
            raise CoordinatorError(f"cannot {what}: the coordinator is not started, or closed")
        if not client.connected:
            raise CoordinatorError(f"cannot {what}: not connected to ZooKeeper at {self._settings.hosts}")
        return client

    def _lease_path(self, shard: int) -> str:
        if shard < 0:
            raise ValueError(f"shard {shard} is negative")
        return f"{self._leases_path}/{shard}"

    def _delete(self, path: str, version: int, what: str) -> None:
        try:
            self._await(self._client.delete_async(path, version=version), what, expected=(NoNodeError, BadVersionError))
        except (NoNodeError, BadVersionError):
            pass

    def _delete_lease(self, shard: int, token: int, session: int) -> None:
        """Delete the shard's znode if it is the one of `token`, owned by `session`. Only
        this coordinator deletes its session's znodes, under `_lease_lock`, so the znode
        read cannot be replaced before the versioned delete."""
        path = self._lease_path(shard)
        what = f"release the lease of shard {shard}"
        stat = self._await(self._client.exists_async(path), what)
        if stat is not None and stat.czxid == token and stat.ephemeralOwner == session:
            self._delete(path, stat.version, what)

    # Coordinator

    def members(self) -> list[str]:
        client = self._readable("list members")
        return sorted(self._await(client.get_children_async(self._members_path), "list members"))

    def lease_holders(self) -> dict[int, str]:
        client = self._readable("list leases")
        children = self._await(client.get_children_async(self._leases_path), "list leases")
        reads = {int(name): client.get_async(f"{self._leases_path}/{name}") for name in children if name.isdigit()}
        holders: dict[int, str] = {}
        for shard in sorted(reads):
            try:
                data, _ = self._await(reads[shard], "read a lease", expected=(NoNodeError,))
            except NoNodeError:
                continue  # released meanwhile
            holders[shard] = data.decode(errors="replace")
        return holders

    def acquire(self, shard: int) -> Lease | None:
        session = self._usable_session(f"take the lease of shard {shard}")
        path = self._lease_path(shard)
        what = f"take the lease of shard {shard}"
        with self._lease_lock:
            if self._held.get(shard, (None, 0))[0] == session:
                return None
            if shard in self._unreleased:
                owner, token = self._unreleased[shard]
                if owner == session:
                    self._delete_lease(shard, token, session)
                del self._unreleased[shard]
            try:
                _, stat = self._await(
                    self._client.create_async(path, self._member.encode(), ephemeral=True, include_data=True),
                    what,
                    expected=(NodeExistsError,),
                )
            except NodeExistsError:
                stat = self._await(self._client.exists_async(path), what)
                if stat is None or stat.ephemeralOwner != session:
                    return None
                # This session's znode, yet handed to no caller: a create whose answer was
                # lost to a dropped connection. It is as good as a fresh one.
            if stat.ephemeralOwner != session:
                # Sent under `session`, applied under a newer one that is not ours yet.
                self._delete(path, stat.version, what)
                raise CoordinatorError(f"the ZooKeeper session changed while taking shard {shard}; try again")
            self._held[shard] = (session, int(stat.czxid))
        return Lease(shard=shard, token=int(stat.czxid), session=session)

    def release(self, lease: Lease) -> None:
        with self._lease_lock:
            if self._held.get(lease.shard) == (lease.session, lease.token):
                del self._held[lease.shard]
            state, session = self._status
            if lease.session != session or state is SessionState.LOST or self._closed:
                return  # the session that made it has ended, and its znode with it
            if state is SessionState.CONNECTED:
                try:
                    self._delete_lease(lease.shard, lease.token, lease.session)
                    return
                except CoordinatorError as exc:
                    log.warning("lease of shard %d not deleted yet: %s", lease.shard, exc)
            # Deleted once the session is connected again, or gone with it if it expires.
            self._unreleased[lease.shard] = (lease.session, lease.token)

    def is_valid(self, lease: Lease) -> bool:
        state, session = self._status
        return (
            state is SessionState.CONNECTED
            and lease.session == session
            and self._held.get(lease.shard) == (lease.session, lease.token)
        )

    def confirm(self, lease: Lease) -> bool:
        """False at once if `is_valid` says no. Otherwise the server is asked (a `sync`,
        so that the server this session talks to has caught up with the leader, then the
        znode's stat): True if the znode of this token, owned by this session, is there.
        `CoordinatorError` if ZooKeeper could not be asked: not confirmed either."""
        if not self.is_valid(lease):
            return False
        path = self._lease_path(lease.shard)
        what = f"confirm the lease of shard {lease.shard}"
        self._await(self._client.sync_async(path), what)
        stat = self._await(self._client.exists_async(path), what)
        return (
            stat is not None
            and stat.czxid == lease.token
            and stat.ephemeralOwner == lease.session
            and self.is_valid(lease)
        )

    def watch(self, callback: Callable[[], None]) -> None:
        with self._lock:
            self._notices.append(callback)
            started = self._status[1] is not None and not self._closed
        if started:
            self._install(callback)

    def _install(self, callback: Callable[[], None]) -> None:
        for path in (self._members_path, self._leases_path):
            try:
                self._watches.append(ChildrenWatch(self._client, path, _ChangeNotice(callback)))
            except KAZOO_ERRORS as exc:
                raise CoordinatorError(f"cannot watch {path} on ZooKeeper at {self._settings.hosts}: {exc}") from exc
