"""`SqliteCoordinator`: dispatcher membership and fenced shard leases for one machine,
kept in one SQLite file.

Processes (or instances in one process) that open the same file share members and
leases as dispatchers sharing one ZooKeeper do. The file holds:

    sessions (id, member, expires_at)        one row per live session; ids never reused
    leases   (shard, session, member, token) one row per held lease
    counters (name, value)                   'token': the last fencing token handed out
                                             'changes': bumped whenever members or leases change

A session lives while `clock() < expires_at`. A heartbeat thread renews it to
`now + session_timeout_s` every third of the timeout. Every operation runs in one
`BEGIN IMMEDIATE` transaction (so a read-then-write never interleaves with another
process's write) that first deletes the expired sessions and their leases: a member
that died (kill -9) loses its leases one timeout after its last heartbeat, to whoever
looks next. Tokens come from the 'token' counter, which only grows, so every new lease
of a shard, in whichever process, has a larger token than any lease before it.

Session states, as `on_state` hears them:

    start() returns ........................................... CONNECTED  (no notice)
    CONNECTED --no heartbeat written for timeout/2--> ......... SUSPENDED  leases kept, not valid
    SUSPENDED --a heartbeat written in time--> ................ CONNECTED  the same leases valid
    CONNECTED/SUSPENDED --own session found expired--> ........ LOST       every lease gone for good
    LOST --new session opened, member registered--> ........... CONNECTED  no leases: acquire anew
    any --close()--> closed ................................... (no notice)

Notices and `watch` callbacks come from the heartbeat thread (or from the caller of
`heartbeat_once`), never from a caller of `acquire` or `release`: an operation that
finds its session gone raises `CoordinatorError` and leaves the LOST notice to the
heartbeat. `watch` callbacks follow the 'changes' counter, which the heartbeat thread
polls every `min(timeout/3, 0.25 s)` and at once after a local change.

How it fails:

- `is_valid` compares the clock with the expiry last written, so a process paused past
  its expiry sees its leases invalid the moment it wakes, before any I/O; `confirm`
  reads the file as well.
- All processes must read one clock (`time.time`, the default): a wall-clock jump forward
  expires sessions early (leases move; fencing keeps that safe), a jump back extends them.
- A write that cannot lock the file within the busy timeout (timeout/2) fails; for a
  heartbeat that makes SUSPENDED once the last good one is timeout/2 old (and the
  heartbeat is tried again every poll interval), and for an operation it is
  `CoordinatorError`.
- A member name held by another live session: `start` waits up to 1.25 timeouts for it
  to expire (it may be this member's dead previous incarnation), then `CoordinatorError`.

Test hooks: `crash()` (a kill -9), and `heartbeat_once()` with `heartbeat=False` and an
injected clock, so that tests step time by hand.
"""

from __future__ import annotations

import logging
import sqlite3
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import NamedTuple

from scheduler.adapters.embedded.sqlite import immediate
from scheduler.errors import ConfigError, CoordinatorError, CoordinatorUnavailable
from scheduler.ports import Lease, SessionState

log = logging.getLogger(__name__)

SCHEMA = (
    """CREATE TABLE IF NOT EXISTS sessions (
        id         INTEGER PRIMARY KEY AUTOINCREMENT,
        member     TEXT    NOT NULL UNIQUE,
        expires_at REAL    NOT NULL
    )""",
    """CREATE TABLE IF NOT EXISTS leases (
        shard   INTEGER PRIMARY KEY,
        session INTEGER NOT NULL,
        member  TEXT    NOT NULL,
        token   INTEGER NOT NULL
    )""",
    "CREATE TABLE IF NOT EXISTS counters (name TEXT PRIMARY KEY, value INTEGER NOT NULL)",
    "INSERT OR IGNORE INTO counters VALUES ('token', 0), ('changes', 0)",
)

_CHANGED = "UPDATE counters SET value = value + 1 WHERE name = 'changes'"
_CHANGES = "SELECT value FROM counters WHERE name = 'changes'"


def check_member(member: str) -> str:
    """The same rule as ZooKeeper's: not empty, no '/', not '.' or '..'."""
    if not member or "/" in member or "\x00" in member or member in (".", ".."):
        raise ConfigError(f"member name {member!r} is not usable: give a non-empty name without '/'")
    return member


class _Status(NamedTuple):
    state: SessionState
    session: int | None
    expires_at: float
    """The expiry this instance last wrote for `session`."""


_CLOSED = _Status(SessionState.LOST, None, 0.0)


class SqliteCoordinator:
    """The embedded `Coordinator` (`scheduler.ports`). One instance, one member, one
    `start`; thread-safe."""

    def __init__(
        self,
        path: Path,
        *,
        session_timeout_s: float = 10.0,
        clock: Callable[[], float] = time.time,
        heartbeat: bool = True,
    ) -> None:
        if not session_timeout_s > 0:
            raise ConfigError(f"session timeout {session_timeout_s} s must be positive")
        self._path = Path(path)
        self._timeout_s = session_timeout_s
        self._clock = clock
        self._heartbeat = heartbeat
        self._interval_s = session_timeout_s / 3
        self._poll_s = min(self._interval_s, 0.25)
        self._busy_timeout_s = session_timeout_s / 2
        self._db: sqlite3.Connection | None = None
        self._db_lock = threading.Lock()
        # `_state_lock` guards the session state and orders the notices.
        self._state_lock = threading.RLock()
        self._member = ""
        self._on_state: Callable[[SessionState], None] = lambda state: None
        self._status = _CLOSED
        self._reported = SessionState.CONNECTED
        self._last_written = 0.0
        self._held: dict[int, tuple[int, int]] = {}  # shard -> (session, token) handed out
        self._callbacks: list[Callable[[], None]] = []
        self._seen_changes = 0
        self._stopping = threading.Event()
        self._wake = threading.Event()
        self._thread: threading.Thread | None = None
        self._started = False
        self._closed = False
        self._crashed = False

    # Session

    def start(self, member: str, on_state: Callable[[SessionState], None]) -> None:
        check_member(member)
        with self._state_lock:
            if self._started or self._closed:
                raise CoordinatorError("this coordinator was started before; make a new one")
            self._started = True
        self._member = member
        self._on_state = on_state
        try:
            self._path.parent.mkdir(parents=True, exist_ok=True)
            db = sqlite3.connect(
                str(self._path), timeout=self._busy_timeout_s, isolation_level=None, check_same_thread=False
            )
        except (OSError, sqlite3.Error) as exc:
            self._closed = True
            raise CoordinatorUnavailable(
                f"cannot open the embedded coordinator's file {self._path}: {exc}; check the path and its permissions"
            ) from exc
        self._db = db
        try:
            try:
                db.execute("PRAGMA journal_mode=WAL")
                db.execute("PRAGMA synchronous=FULL")
            except sqlite3.Error as exc:
                raise CoordinatorUnavailable(f"cannot use the embedded coordinator's file {self._path}: {exc}") from exc
            with self._transaction("create its tables") as tx:
                for statement in SCHEMA:
                    tx.execute(statement)
            session, expires_at = self._open_session(wait_s=1.25 * self._timeout_s)
        except BaseException:
            self._closed = True
            self._close_db()
            raise
        with self._state_lock:
            self._status = _Status(SessionState.CONNECTED, session, expires_at)
        if self._heartbeat:
            self._thread = threading.Thread(target=self._run, name=f"coordinator-heartbeat-{member}", daemon=True)
            self._thread.start()
        log.info("joined as a member", extra={"action": "coordinator.started", "member": member, "session": session})

    def _open_session(self, *, wait_s: float) -> tuple[int, float]:
        """Insert this member's session row, waiting up to `wait_s` for another session
        that holds the name to expire."""
        deadline = time.monotonic() + wait_s
        while True:
            with self._transaction(f"register member {self._member!r}") as db:
                now = self._clock()
                self._sweep(db, now)
                expires_at = now + self._timeout_s
                rows = db.execute(
                    "INSERT INTO sessions (member, expires_at) VALUES (?, ?) "
                    "ON CONFLICT (member) DO NOTHING RETURNING id",
                    (self._member, expires_at),
                ).fetchall()
                if rows:
                    db.execute(_CHANGED)
                    (self._seen_changes,) = db.execute(_CHANGES).fetchone()
            if rows:
                self._last_written = now
                return int(rows[0][0]), expires_at
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise CoordinatorError(
                    f"member name {self._member!r} is held by another live session in {self._path}; "
                    "stop that dispatcher or choose another name"
                )
            self._stopping.wait(min(remaining, self._poll_s))

    def heartbeat_once(self) -> None:
        """Renew this session, notice whether it was lost or cannot be renewed, and call
        the `watch` callbacks if members or leases changed. The heartbeat thread's step,
        public as a test hook: with `heartbeat=False` and an injected clock a test steps
        time and calls this by hand."""
        self._beat()

    def _beat(self) -> bool:
        """`heartbeat_once`; False if the heartbeat could not be written."""
        status = self._status
        if not self._running() or status.session is None:
            return True
        try:
            with self._transaction("renew its session") as db:
                now = self._clock()
                self._sweep(db, now)
                expires_at = now + self._timeout_s
                renewed = db.execute(
                    "UPDATE sessions SET expires_at = ? WHERE id = ?", (expires_at, status.session)
                ).rowcount == 1
                (changes,) = db.execute(_CHANGES).fetchone()
        except CoordinatorError as exc:
            self._missed_heartbeat(exc)
            return False
        with self._state_lock:
            if not self._running() or self._status.session != status.session:
                return True  # closed, or another heartbeat has moved on to a new session
            if renewed:
                self._last_written = now
                self._set(_Status(SessionState.CONNECTED, status.session, expires_at))
            else:
                self._set(_Status(SessionState.LOST, status.session, 0.0))
                self._reopen()
        self._fire_if_changed(changes)
        return True

    def _missed_heartbeat(self, exc: CoordinatorError) -> None:
        with self._state_lock:
            status = self._status
            if not self._running() or status.state is not SessionState.CONNECTED:
                return
            if self._clock() - self._last_written > self._timeout_s / 2:
                log.warning("heartbeat not written: %s", exc, extra={"action": "coordinator.heartbeat_failed"})
                self._set(status._replace(state=SessionState.SUSPENDED))

    def _reopen(self) -> None:
        """After LOST: a new session for the member, if the name is free."""
        try:
            session, expires_at = self._open_session(wait_s=0)
        except CoordinatorError as exc:
            log.warning("cannot register again after the session was lost: %s", exc)
            return
        self._set(_Status(SessionState.CONNECTED, session, expires_at))

    def _set(self, status: _Status) -> None:
        """Record `status` and tell `on_state` if the state changed."""
        with self._state_lock:
            self._status = status
            if status.state is self._reported:
                return
            self._reported = status.state
            log.log(
                logging.INFO if status.state is SessionState.CONNECTED else logging.WARNING,
                "embedded coordinator session %s",
                status.state.value,
                extra={"action": f"coordinator.{status.state.value}", "member": self._member},
            )
            try:
                self._on_state(status.state)
            except Exception:
                log.exception("on_state failed", extra={"action": "coordinator.on_state_failed"})

    def _running(self) -> bool:
        return self._started and not self._closed and not self._crashed

    def _run(self) -> None:
        next_beat = time.monotonic() + self._interval_s
        while not self._stopping.is_set():
            self._wake.wait(max(0.0, min(self._poll_s, next_beat - time.monotonic())))
            self._wake.clear()
            if self._stopping.is_set():
                return
            try:
                if time.monotonic() >= next_beat:
                    written = self._beat()
                    next_beat = time.monotonic() + (self._interval_s if written else self._poll_s)
                else:
                    self._poll_changes()
            except Exception:
                log.exception("heartbeat step failed", extra={"action": "coordinator.heartbeat_failed"})

    def _poll_changes(self) -> None:
        try:
            with self._db_lock:
                if self._db is None:
                    return
                (changes,) = self._db.execute(_CHANGES).fetchone()
        except sqlite3.Error:
            return  # the next heartbeat reports what is wrong
        self._fire_if_changed(changes)

    def _fire_if_changed(self, changes: int) -> None:
        with self._state_lock:
            if changes == self._seen_changes or not self._running():
                return
            self._seen_changes = changes
            callbacks = list(self._callbacks)
        for callback in callbacks:
            try:
                callback()
            except Exception:
                log.exception("a coordinator watch callback failed", extra={"action": "coordinator.watch_failed"})

    def crash(self) -> None:
        """Test hook: stop as a process killed with SIGKILL stops. Heartbeats end, nothing
        is released or removed, and this instance is unusable; its session and leases stay
        in the file until the session expires, then other members take over."""
        with self._state_lock:
            self._crashed = True
            self._status = _CLOSED
        self._stop_thread()

    def close(self) -> None:
        with self._state_lock:
            if self._closed:
                return
            self._closed = True
            session = self._status.session
            self._status = _CLOSED
            crashed = self._crashed
        self._stop_thread()
        self._held.clear()
        if session is not None and not crashed:
            try:
                with self._transaction("leave") as db:
                    db.execute("DELETE FROM leases WHERE session = ?", (session,))
                    db.execute("DELETE FROM sessions WHERE id = ?", (session,))
                    db.execute(_CHANGED)
            except CoordinatorError as exc:
                log.warning("did not leave cleanly (the session expires instead): %s", exc)
        self._close_db()
        log.info("left", extra={"action": "coordinator.closed", "member": self._member})

    def _stop_thread(self) -> None:
        self._stopping.set()
        self._wake.set()
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join(timeout=self._busy_timeout_s + 5)

    def _close_db(self) -> None:
        with self._db_lock:
            db, self._db = self._db, None
            if db is not None:
                db.close()

    # Storage

    @contextmanager
    def _transaction(self, what: str) -> Iterator[sqlite3.Connection]:
        """One write transaction, taken at once (BEGIN IMMEDIATE)."""
        with self._db_lock:
            db = self._db
            if db is None:
                raise CoordinatorError(f"cannot {what}: the coordinator is not started, or closed")
            try:
                with immediate(db) as transaction:
                    yield transaction
            except sqlite3.Error as exc:
                raise CoordinatorError(f"the embedded coordinator at {self._path} could not {what}: {exc}") from exc

    @staticmethod
    def _sweep(db: sqlite3.Connection, now: float) -> None:
        """Delete the sessions expired at `now`, and every lease without a live session."""
        gone = db.execute("DELETE FROM sessions WHERE expires_at <= ?", (now,)).rowcount
        gone += db.execute("DELETE FROM leases WHERE session NOT IN (SELECT id FROM sessions)").rowcount
        if gone:
            db.execute(_CHANGED)

    def _usable_session(self, what: str) -> int:
        status = self._status
        if status.session is None or not self._running():
            raise CoordinatorError(f"cannot {what}: the coordinator is not started, or closed")
        if status.state is not SessionState.CONNECTED:
            raise CoordinatorError(f"cannot {what}: the session is {status.state.value}; wait for CONNECTED")
        return status.session

    def _session_gone(self, session: int) -> None:
        """An operation found `session` expired: stop trusting it at once, and leave the
        LOST notice and the new session to the heartbeat."""
        with self._state_lock:
            if self._status.session == session:
                self._status = _Status(SessionState.LOST, session, 0.0)
        self._wake.set()

    # Coordinator

    def members(self) -> list[str]:
        self._usable_db("list members")
        with self._transaction("list members") as db:
            self._sweep(db, self._clock())
            return [member for (member,) in db.execute("SELECT member FROM sessions ORDER BY member")]

    def lease_holders(self) -> dict[int, str]:
        self._usable_db("list leases")
        with self._transaction("list leases") as db:
            self._sweep(db, self._clock())
            return {shard: member for shard, member in db.execute("SELECT shard, member FROM leases ORDER BY shard")}

    def _usable_db(self, what: str) -> None:
        if not self._running():
            raise CoordinatorError(f"cannot {what}: the coordinator is not started, or closed")

    def acquire(self, shard: int) -> Lease | None:
        if shard < 0:
            raise ValueError(f"shard {shard} is negative")
        what = f"take the lease of shard {shard}"
        session = self._usable_session(what)
        with self._transaction(what) as db:
            self._sweep(db, self._clock())
            alive = db.execute("SELECT 1 FROM sessions WHERE id = ?", (session,)).fetchone() is not None
            if alive:
                if db.execute("SELECT 1 FROM leases WHERE shard = ?", (shard,)).fetchone() is not None:
                    return None
                ((token,),) = db.execute(
                    "UPDATE counters SET value = value + 1 WHERE name = 'token' RETURNING value"
                ).fetchall()
                db.execute("INSERT INTO leases VALUES (?, ?, ?, ?)", (shard, session, self._member, token))
                db.execute(_CHANGED)
        if not alive:
            self._session_gone(session)
            raise CoordinatorError(f"cannot {what}: the session expired; wait for CONNECTED")
        self._held[shard] = (session, token)
        self._wake.set()
        return Lease(shard=shard, token=token, session=session)

    def release(self, lease: Lease) -> None:
        if self._held.get(lease.shard) == (lease.session, lease.token):
            self._held.pop(lease.shard, None)
        if self._closed:
            return  # close released everything
        self._usable_db(f"release shard {lease.shard}")
        with self._transaction(f"release shard {lease.shard}") as db:
            self._sweep(db, self._clock())
            # A token names one lease for ever, so this never deletes a newer one.
            released = db.execute(
                "DELETE FROM leases WHERE shard = ? AND token = ?", (lease.shard, lease.token)
            ).rowcount
            if released:
                db.execute(_CHANGED)
        if released:
            self._wake.set()

    def is_valid(self, lease: Lease) -> bool:
        status = self._status
        return (
            status.state is SessionState.CONNECTED
            and lease.session == status.session
            and self._clock() < status.expires_at
            and self._held.get(lease.shard) == (lease.session, lease.token)
        )

    def confirm(self, lease: Lease) -> bool:
        """False at once if `is_valid` says no. Otherwise the file is asked, after the
        sweep: True if this session is alive and the lease row of this token is its own.
        `CoordinatorError` if the file could not be read: not confirmed either."""
        if not self.is_valid(lease):
            return False
        what = f"confirm the lease of shard {lease.shard}"
        with self._transaction(what) as db:
            self._sweep(db, self._clock())
            alive = db.execute("SELECT 1 FROM sessions WHERE id = ?", (lease.session,)).fetchone() is not None
            held = db.execute(
                "SELECT 1 FROM leases WHERE shard = ? AND token = ? AND session = ?",
                (lease.shard, lease.token, lease.session),
            ).fetchone() is not None
        if not alive:
            self._session_gone(lease.session)
        return alive and held and self.is_valid(lease)

    def watch(self, callback: Callable[[], None]) -> None:
        with self._state_lock:
            self._callbacks.append(callback)
