"""`CassandraEffectLedger`: the `EffectLedger` port on Cassandra (table `effects`).

One row per `(scope, effect_key)`, its partition key, and every write to it is a
lightweight transaction (Paxos, at the connection's LOCAL_SERIAL):

- `claim`: `UPDATE ... USING TTL <ttl> SET owner = ?, state = 'claimed' ... IF state =
  null AND owner = null`, an insert-if-absent. When it is not applied, the answer carries
  the row's state and owner: 'done' is `DONE`, a claim of the same owner `CLAIMED`, any
  other claim `BUSY`. A claim that was not marked done expires with its TTL, and the
  next claim applies.
- `done`: `UPDATE ... USING TTL <keep> SET state = 'done' ... IF state != 'done'`, the
  keep being the retention or the longer one the caller asks (no TTL at all for one
  that would end after Cassandra's last expiry time, 2038).
  A missing row compares as null, so this applies on the caller's live claim, on a
  claim that expired (the effect did happen), and on another owner's claim taken after
  the caller's expired (that owner is running the effect again; whatever it does, the
  effect has happened once, and later attempts should skip it). It is refused only by
  a done record, whose first time and retention it keeps.
- `release`: `DELETE ... IF owner = ? AND state = 'claimed'`: only the caller's own
  claim, never a done record.

Why not `INSERT ... IF NOT EXISTS` for the claim: an INSERT also writes the row's
primary-key liveness marker, with the claim's TTL, and `done` (an UPDATE: only an
UPDATE takes `IF state != 'done'`) cannot rewrite it. A done record whose retention is
shorter than the claim's TTL would then leave an empty row behind, existing but with
neither state nor owner, which no later claim could take until the marker expired. With
UPDATEs only, the row lives exactly as long as its cells, and every write sets owner,
state and recorded_at together with one TTL, so `state = null` means "no row"; the
`owner = null` condition is there so that a refusal answers with the owner.

Why `done` is a transaction too: a plain write carries the client's timestamp, while
the claim's cells carry its Paxos ballot's, taken from the coordinator's clock. A client
whose clock is behind the coordinator's by more than the effect took would write a
'done' older than the 'claimed' it replaces, which would silently lose; the claim would
then expire and the effect run again, the one thing the ledger is for. So no write here
mixes the two kinds (as Cassandra's documentation advises), at the cost of one more
Paxos round per effect.

An outcome may be unknown: a transaction that times out (`WriteTimeout` of type CAS,
or the driver's own timeout) may or may not have been applied. Each operation is safe
to repeat by the same owner (a claim then reads back as its own, a done as done, a
release as gone), so it is retried, up to `_TRIES` times, before a `StoreError`.

TTLs are whole seconds, and Cassandra counts them from the start of the second in
which the write happened: a cell written at 10.9 s with TTL 1 is gone at 11.0 s, so
it lives between TTL - 1 and TTL seconds. A claim that ran out early would let a second
attempt run the effect beside the first, so a TTL here is the duration rounded up plus
one: a claim holds at least `ttl_s`, and at most a second and a bit longer (and a done
record at least the retention). Re-claiming one's own live claim answers `CLAIMED` and
does not extend it.
"""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING, Any

from cassandra import OperationTimedOut, Unavailable, WriteTimeout
from cassandra.cluster import NoHostAvailable

from scheduler.adapters.cassandra.connection import (
    DRIVER_ERRORS,
    CassandraConnection,
    answer_column,
    connect,
    prepare_for_table,
)
from scheduler.adapters.cassandra.refusals import raise_if_denied
from scheduler.errors import StoreError, StoreUnavailable
from scheduler.ports import EffectClaim
from scheduler.retention import LAST_EXPIRY_S
from scheduler.settings import CassandraSettings, check_keyspace

if TYPE_CHECKING:
    from scheduler.adapters.cassandra.store import CassandraTaskStore

DEFAULT_RETENTION_S = 7 * 24 * 3600.0
"""How long a done record is kept (then the effect's key may run again)."""

MAX_TTL_S = 630_720_000
"""Cassandra's largest TTL: 20 years."""

_TRIES = 3
_UNKNOWN_OUTCOME = (WriteTimeout, OperationTimedOut, Unavailable)
"""Failures after which the operation may or may not have been applied (`Unavailable`:
certainly not, but it may pass on the next try)."""

_CLAIMED = "claimed"
_DONE = "done"

_QUERIES = {
    "claim": "UPDATE {keyspace}.effects USING TTL ? SET owner = ?, state = 'claimed', recorded_at = ? "
             "WHERE scope = ? AND effect_key = ? IF state = null AND owner = null",
    "done": "UPDATE {keyspace}.effects USING TTL ? SET state = 'done', owner = ?, recorded_at = ? "
            "WHERE scope = ? AND effect_key = ? IF state != 'done'",
    "release": "DELETE FROM {keyspace}.effects WHERE scope = ? AND effect_key = ? IF owner = ? AND state = 'claimed'",
}


class CassandraEffectLedger:
    """The distributed `EffectLedger`. Get one on a task store's session with
    `CassandraEffectLedger.for_store(store)` (what a worker does: it opens both), or on
    a connection of its own with `CassandraEffectLedger.open(settings)`. Thread-safe
    (the driver's session is)."""

    def __init__(
        self,
        connection: CassandraConnection,
        keyspace: str,
        *,
        retention_s: float = DEFAULT_RETENTION_S,
        owns_connection: bool = False,
    ) -> None:
        check_keyspace(keyspace)
        self._retention_ttl = _ttl(retention_s, "retention_s")
        self._connection = connection
        self._session = connection.session
        self._owns_connection = owns_connection
        self.keyspace = keyspace
        self._q = prepare_for_table(self._session, _QUERIES, keyspace, "effect ledger", "effects")

    @classmethod
    def for_store(cls, store: CassandraTaskStore, *, retention_s: float = DEFAULT_RETENTION_S) -> CassandraEffectLedger:
        """A ledger in the store's keyspace on the store's session. It does not own the
        session: closing it does nothing, and it is unusable once the store is closed."""
        return cls(store.connection, store.keyspace, retention_s=retention_s)

    @classmethod
    def open(cls, settings: CassandraSettings, *, retention_s: float = DEFAULT_RETENTION_S) -> CassandraEffectLedger:
        """A ledger on a connection of its own, closed with it."""
        connection = connect(settings)
        try:
            return cls(connection, settings.keyspace, retention_s=retention_s, owns_connection=True)
        except BaseException:
            connection.close()
            raise

    def claim(self, scope: str, key: str, owner: str, ttl_s: float) -> EffectClaim:
        _check_names(scope, key, owner)
        ttl = _ttl(ttl_s, "ttl_s")
        result = self._run("claim", (ttl, owner, _now_ms(), scope, key))
        if result.was_applied:
            return EffectClaim.CLAIMED
        state, holder = answer_column(result, "state"), answer_column(result, "owner")
        if state == _DONE:
            return EffectClaim.DONE
        if state == _CLAIMED and holder == owner:
            return EffectClaim.CLAIMED
        return EffectClaim.BUSY

    def done(self, scope: str, key: str, owner: str, keep_s: float = 0.0) -> None:
        _check_names(scope, key, owner)
        asked = _ttl(keep_s, "keep_s", cap=True) if keep_s else self._retention_ttl
        ttl = 0 if asked == 0 else max(self._retention_ttl, asked)  # 0: no expiry, kept for good
        self._run("done", (ttl, owner, _now_ms(), scope, key))  # not applied: already done

    def release(self, scope: str, key: str, owner: str) -> None:
        _check_names(scope, key, owner)
        self._run("release", (scope, key, owner))  # not applied: gone, done, or another's

    def _run(self, name: str, values: tuple[object, ...]) -> Any:
        statement = self._q[name].bind(values)
        for attempt in range(1, _TRIES + 1):
            try:
                return self._session.execute(statement)
            except _UNKNOWN_OUTCOME as exc:
                if attempt == _TRIES:
                    raise StoreError(
                        f"effect ledger {name} kept timing out ({_TRIES} tries): {_describe(exc)}"
                    ) from exc
            except NoHostAvailable as exc:
                raise StoreUnavailable(f"no Cassandra node could take the effect ledger's {name}: {exc}") from exc
            except DRIVER_ERRORS as exc:
                raise_if_denied(exc, self._session, f"the effect ledger's {name}")
                raise StoreError(f"effect ledger {name} failed: {_describe(exc)}") from exc
        raise AssertionError("unreachable")  # the last try returns or raises

    def close(self) -> None:
        """Close the connection if the ledger opened it (`open`); else nothing."""
        if self._owns_connection:
            self._connection.close()


def _ttl(seconds: float, name: str, *, cap: bool = False) -> int:
    """The TTL, in whole seconds, of cells that must outlive `seconds` (see the module's
    docstring), refusing what Cassandra would refuse; with `cap`, 0 (no expiry) for
    cells that would outlive what Cassandra can expire (`retention.LAST_EXPIRY_S`)."""
    if not seconds > 0 or not math.isfinite(seconds):
        raise ValueError(f"{name} must be a positive number of seconds, got {seconds!r}")
    ttl = math.ceil(seconds) + 1
    if cap and (ttl > MAX_TTL_S or time.time() + ttl > LAST_EXPIRY_S):
        return 0
    if ttl > MAX_TTL_S:
        raise ValueError(f"{name} is at most {MAX_TTL_S - 1} s (Cassandra keeps data up to 20 years), got {seconds!r}")
    return ttl


def _check_names(scope: str, key: str, owner: str) -> None:
    """Both ledgers refuse empty names alike: an empty scope, key or owner is a caller's
    mistake (a tenant, an effect and an attempt all have names), better told at once."""
    for name, value in (("scope", scope), ("key", key), ("owner", owner)):
        if not isinstance(value, str) or not value:
            raise ValueError(f"an effect's {name} must be a non-empty string, got {value!r}")


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"
