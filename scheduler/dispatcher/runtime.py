"""The dispatcher process: holds shard leases, loads due tasks into wheels, fires them.

Threads, and who owns what
--------------------------
- The **fire loop** (the thread that calls `run`) owns every `OwnedShard`. Each tick it
  applies what other threads sent it, reads the hand-off log, fires what is due, flushes
  the queue, commits hand-off positions and starts cursor advances. Nothing else touches
  a shard's state, so there are no locks around it.
- The **balancer** decides which shards to take or give back (`balance.plan`), takes
  leases, and tells the fire loop.
- **Readers** (a pool) load buckets, count and re-read slices; **writers** (a pool) take
  shards in the store and advance cursors (each a lightweight transaction, ~50 ms).
  Their results come back to the fire loop through its inbox, tagged with the lease
  token they were started under, so a result for a lease since lost is dropped.
- The **schedule thread** runs, every `schedule_interval_ms` for each shard held, one
  pass of `scheduler.recurring.runner` over the shard's recurring schedules: it creates
  the runs due within its lookahead (90 s) as ordinary tasks (through the producer,
  so runs due soon reach their own shard's owner by the hand-off) and advances each
  schedule with a write fenced by the lease's token. It never touches the wheels; a
  pass stops as soon as the lease is no longer valid, and a fenced answer drops the
  shard like a refused cursor.

A shard's life
--------------
    ACQUIRED (lease taken) -> STARTING (take_shard in the store, read fired_through)
      -> FIRING (buckets loaded a minute ahead; due slots fired every tick;
                 cursor advanced about once a second)
      -> GIVING BACK (stop firing, last advance, commit hand-off position, release lease)
       | DROPPED (lease lost, or the store refused a fenced write: a newer owner exists)

Fencing: a shard fires only while `Coordinator.is_valid(lease)` holds (checked before
every batch, no I/O); when the session is suspended every shard stops at once. After a
stall longer than a third of the lease timeout (the process was paused, or starved), each
lease is confirmed with the coordinator before anything more is fired. Every message
carries the lease's token and every cursor write is conditional on it.
"""

from __future__ import annotations

import json
import logging
import os
import queue
import random
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import Any

from scheduler import handoff
from scheduler.dispatcher import memory
from scheduler.dispatcher.balance import plan
from scheduler.dispatcher.shard import DEFAULT_HORIZON_MS, FireBatch, OwnedShard, Row, Sweep, rows_from
from scheduler.errors import InvalidMessage, QueueError, SchedulerError, StoreUnavailable
from scheduler.fairness.gate import ReleaseGate
from scheduler.fairness.limits import Limits
from scheduler.model import BUCKET_MS, minute_bucket
from scheduler.ports import (
    BadRow,
    Coordinator,
    HandoffReader,
    Lease,
    LimitsStore,
    Publisher,
    SessionState,
    StoredTask,
    TaskStore,
)
from scheduler.recurring.runner import PassResult, ScheduleRunner
from scheduler.worker import dead_letters

log = logging.getLogger(__name__)

SCHEDULE_STOP_WAIT_S = 10.0
"""How long a stopping dispatcher waits for a schedule pass under way before it gives
its leases back (the pass stops at its next schedule; runs it made are idempotent)."""

Clock = Callable[[], int]

LOAD_CHUNK = 2000
"""Rows a bucket read sends to the fire loop at a time."""

LIMITS_ATTEMPTS = 10
"""Tries (a second apart) of the first read of the tenants' limits before giving up."""

LOAD_ATTEMPTS = 5
"""Tries of one bucket read before it is handed back to be asked for again later."""

SKEW_WARN_MS = 1000
"""A hand-off record stamped this far ahead of the dispatcher's clock is counted and logged."""

SKEW_WINDOW_MS = 60_000
"""The window over which the least lag of hand-off records is taken (`Stats.handoff_min_lag_ms`)."""


def wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


@dataclass(frozen=True)
class DispatcherConfig:
    member: str
    shards: Sequence[int] | None = None
    """None for `auto`; else the pinned shards."""
    tick_ms: int = 100
    lookahead_ms: int = BUCKET_MS
    """How far ahead buckets are loaded: the next bucket is read a minute before it starts."""
    verify_lead_ms: int = 2000
    verify_grace_ms: int = 1000
    second_look_ms: int = 1000
    """How long after a slice ends (or after its bucket was read) it is counted again."""
    sweep_interval_ms: int = 20_000
    """How often each shard counts the last 90 s behind its cursor; every sixth time, the
    whole look-back horizon, bucket by bucket."""
    sweep_horizon_ms: int = DEFAULT_HORIZON_MS
    """How far back the sweep looks for rows written late."""
    dead_letter_topic: str | None = None
    """Where rows that cannot be read are parked (None: they are logged and skipped)."""
    advance_interval_ms: int = 1000
    commit_interval_ms: int = 1000
    balance_interval_s: float = 1.0
    lease_timeout_s: float = 10.0
    first_lookback_ms: int = 60 * BUCKET_MS
    """Where a never-fired shard starts when the store does not record its creation time."""
    publish_give_up_s: float = 60.0
    """After this long without a successful publish, give every shard back and exit, so
    dispatchers that can publish take over."""
    page_size: int = 5000
    reader_threads: int = 8
    looker_threads: int = 4
    writer_threads: int = 8
    long_types: frozenset[str] = frozenset()
    flush_timeout_s: float = 10.0
    stats_path: Path | None = None
    stats_interval_ms: int = 1000
    schedule_interval_ms: int = 5000
    """How often the recurring schedules of each held shard get a creation pass."""
    limits_interval_s: float = 5.0
    """How often the tenants' limits are read again from the store."""
    hold_timeout_s: float = 300.0
    """How long a released task of a capped tenant holds its place without a completion
    (its worker died and nothing ran it again) before the place is freed."""


@dataclass
class Stats:
    fired: int = 0
    loaded: int = 0
    handed_tasks: int = 0
    handed_cancels: int = 0
    skipped_cancelled: int = 0
    slices_counted: int = 0
    slices_reread: int = 0
    rows_merged: int = 0
    advances: int = 0
    fenced_out: int = 0
    leases_lost: int = 0
    taken: int = 0
    given_back: int = 0
    publish_failures: int = 0
    store_failures: int = 0
    bad_handoffs: int = 0
    stalls: int = 0
    duplicates_dropped: int = 0
    job_errors: int = 0
    schedule_passes: int = 0
    schedule_runs_created: int = 0
    schedule_misfires: int = 0
    schedule_failures: int = 0
    gated: int = 0
    released: int = 0
    completions: int = 0
    limits_reads: int = 0
    limits_failures: int = 0
    slices_looked: int = 0
    looks_reread: int = 0
    rows_found_late: int = 0
    """Rows a second look found that the shard had not seen (written after its reads)."""
    sweeps: int = 0
    buckets_reread: int = 0
    rows_swept: int = 0
    """Rows a sweep found behind the cursor that the shard had not handled."""
    bad_rows: int = 0
    handoff_clock_ahead: int = 0
    """Hand-off records stamped more than `SKEW_WARN_MS` ahead of this dispatcher's clock."""
    handoff_min_lag_ms: int | None = None
    """The least (now - writer's stamp) over the hand-off records of the last window: the
    writers' clocks behind this one's by about this much (plus the transit), or ahead if
    negative."""
    started_ms: int = field(default_factory=wall_clock_ms)


class Dispatcher:
    """Fires the due tasks of the shards it holds. `run()` blocks until `stop()`."""

    def __init__(
        self,
        config: DispatcherConfig,
        *,
        store: TaskStore,
        coordinator: Coordinator,
        publisher: Publisher,
        handoff_reader: HandoffReader,
        topics: dict[int, str],
        clock: Clock = wall_clock_ms,
        schedule_runner: ScheduleRunner | None = None,
        limits_store: LimitsStore | None = None,
    ) -> None:
        self.config = config
        self.store = store
        self.coordinator = coordinator
        self.publisher = publisher
        self.handoff_reader = handoff_reader
        self.topics = topics
        self.clock = clock
        self.shard_count = store.shard_count
        self.stats = Stats()
        self.shards: dict[int, OwnedShard] = {}
        self._inbox: queue.SimpleQueue[Callable[[], None]] = queue.SimpleQueue()
        self._stopping = threading.Event()
        self._wake_balancer = threading.Event()
        self._session = SessionState.CONNECTED
        self._mine: set[int] = set()
        """Shards with a lease this process holds (balancer's view, guarded by `_mine_lock`)."""
        self._mine_lock = threading.Lock()
        self._readers = ThreadPoolExecutor(config.reader_threads, thread_name_prefix="dispatcher-read")
        self._lookers = ThreadPoolExecutor(config.looker_threads, thread_name_prefix="dispatcher-look")
        """Second looks and sweeps, and their re-reads: a pool of their own, so that they
        never queue ahead of the reads and counts that what is due now waits for."""
        self._writers = ThreadPoolExecutor(config.writer_threads, thread_name_prefix="dispatcher-write")
        self.schedule_runner = schedule_runner
        self._schedulers = ThreadPoolExecutor(1, thread_name_prefix="dispatcher-schedule")
        self._scheduling: set[int] = set()
        self._passes_running = 0
        self._passes_changed = threading.Condition()
        self._last_schedule_ms: dict[int, int] = {}
        self._advancing: set[int] = set()
        self._advance_target: dict[int, int] = {}
        """The cursor each shard's latest advance asked for."""
        self._last_advance_ms: dict[int, int] = {}
        self._positions: dict[int, int] = {}
        self._committed: dict[int, int] = {}
        self._last_commit_ms = 0
        self._last_stats_ms = 0
        self._pending: list[tuple[int, int, FireBatch]] = []
        """Fired batches not yet acknowledged by the queue (published again after a failure)."""
        self._ready_positions: dict[int, int] = {}
        """Hand-off positions whose records are all safe: fired and flushed, or in a wheel."""
        self._retry_at_ms = 0
        self._backoff_ms = 0
        self._failing_since_ms: int | None = None
        self._loads_since_trim = 0
        self._last_trim = 0.0
        self.failed: str | None = None
        """Why `run` gave up, if it did (the CLI exits non-zero)."""
        self.limits_store = limits_store
        self._limits_read = False
        self.gate = ReleaseGate(self.shard_count, hold_timeout_ms=int(config.hold_timeout_s * 1000))
        self._release_at_ms: int | None = None
        """When the gate can let the next task out, if that is before the next tick."""
        self._lag_window: tuple[int, int | None] = (0, None)
        """(window start, least lag so far) of the hand-off records' stamps."""
        self._skew_logged_ms = 0

    # Lifecycle.

    def start_session(self) -> None:
        """Join the coordinator (raises `CoordinatorUnavailable` if it cannot be reached)."""
        self.coordinator.start(self.config.member, self._on_session)
        self.coordinator.watch(self._wake_balancer.set)

    def run(self) -> None:
        if self.limits_store is not None:
            if not self._limits_read:
                self.load_limits()
            threading.Thread(target=self._limits_loop, name="dispatcher-limits", daemon=True).start()
        balancer = threading.Thread(target=self._balance_loop, name="dispatcher-balance", daemon=True)
        balancer.start()
        try:
            self._fire_loop()
        finally:
            self._shutdown()

    def stop(self) -> None:
        """Ask `run` to stop gracefully: give every shard back (so others take over at
        once), then return. Safe from a signal handler."""
        self._stopping.set()
        self._wake_balancer.set()

    def _session_now(self) -> SessionState:
        return self._session

    def _on_session(self, state: SessionState) -> None:
        self._session = state
        log.warning("coordinator session %s", state.value, extra={"action": "session_" + state.value})
        self._wake_balancer.set()

    # The tenants' limits, read again every few seconds.

    def load_limits(self, attempts: int = LIMITS_ATTEMPTS) -> None:
        """Read the tenants' limits before anything else (before joining the coordinator:
        a member that joined and then waited would be counted in the split while firing
        nothing). `StoreUnavailable` if they cannot be read after `attempts` tries."""
        assert self.limits_store is not None
        error: SchedulerError | None = None
        for attempt in range(attempts):
            try:
                limits = self.limits_store.read()
            except SchedulerError as exc:
                log.warning("reading the tenants' limits failed (%d of %d): %s", attempt + 1, attempts, exc)
                error = exc
                if self._stopping.wait(1.0):
                    break
                continue
            self.gate.set_limits(limits)  # the fire loop is not running yet
            self._limits_read = True
            self.stats.limits_reads += 1
            return
        raise StoreUnavailable(f"the tenants' limits could not be read: {error}")

    def _limits_loop(self) -> None:
        while not self._stopping.wait(self.config.limits_interval_s):
            self._read_limits()

    def _read_limits(self) -> None:
        assert self.limits_store is not None
        try:
            limits = self.limits_store.read()
        except SchedulerError as exc:  # keep enforcing the limits read before
            self.stats.limits_failures += 1
            log.warning("reading the tenants' limits failed: %s; keeping the ones read before", exc,
                        extra={"action": "limits_read_failed"})
            return
        except Exception:
            self.stats.job_errors += 1
            log.exception("reading the tenants' limits failed unexpectedly", extra={"action": "limits_read_failed"})
            return
        self.stats.limits_reads += 1
        self._post(partial(self._limits_loaded, limits))

    def _limits_loaded(self, limits: Limits) -> None:
        if limits != self.gate.limits:
            log.info("tenant limits now: %d tenant(s) with their own, global rate %s", len(limits.tenants),
                     limits.global_rate, extra={"action": "limits_changed"})
        self.gate.set_limits(limits)

    # The balancer.

    def _balance_loop(self) -> None:
        while not self._stopping.is_set():
            self._wake_balancer.wait(self.config.balance_interval_s)
            self._wake_balancer.clear()
            if self._stopping.is_set() or self._session is not SessionState.CONNECTED:
                continue
            try:
                self._balance_once()
            except SchedulerError as exc:
                log.warning("balancing failed: %s", exc, extra={"action": "balance_failed"})
            except Exception:  # the balancer must outlive any surprise
                self.stats.job_errors += 1
                log.exception("balancing failed unexpectedly", extra={"action": "balance_failed"})

    def _balance_once(self) -> None:
        members = self.coordinator.members()
        holders = self.coordinator.lease_holders()
        with self._mine_lock:
            mine = set(self._mine)
        decided = plan(self.config.member, members, holders, mine, self.shard_count, self.config.shards)
        for shard in decided.give_back:
            self._post(partial(self._give_back, shard))
        for shard in decided.take:
            if self._stopping.is_set():
                return
            lease = self.coordinator.acquire(shard)
            if lease is None:
                continue
            with self._mine_lock:
                self._mine.add(shard)
            log.info("took the lease of shard %d (token %d)", shard, lease.token,
                     extra={"action": "lease_taken", "shard": shard, "token": lease.token})
            self._submit(self._writers, self._start_shard, lease, on_error=partial(self._give_up_lease, lease))

    def _submit(self, pool: ThreadPoolExecutor, job: Callable[..., None], *args: Any,
                on_error: Callable[[], None] | None = None) -> None:
        """Run `job` on `pool`; an unexpected exception is logged and `on_error` runs, since
        a pool would otherwise swallow it and leave the shard waiting forever."""

        def guarded() -> None:
            try:
                job(*args)
            except Exception:
                self.stats.job_errors += 1
                log.exception("%s failed unexpectedly", getattr(job, "__name__", "a job"),
                              extra={"action": "job_failed"})
                if on_error is not None:
                    try:
                        on_error()
                    except Exception:
                        log.exception("cleaning up after a failed job failed too")

        try:
            pool.submit(guarded)
        except RuntimeError:  # shutting down
            pass

    def _give_up_lease(self, lease: Lease) -> None:
        self._release(lease)
        self._forget_lease(lease.shard)

    def _release(self, lease: Lease) -> None:
        try:
            self.coordinator.release(lease)
        except SchedulerError as exc:  # the lease expires with the session anyway
            log.warning("releasing the lease of shard %d failed: %s", lease.shard, exc)

    def _forget_lease(self, shard: int) -> None:
        with self._mine_lock:
            self._mine.discard(shard)
        self._wake_balancer.set()

    # Work done off the fire loop; each sends its result back through the inbox.

    def _post(self, action: Callable[[], None]) -> None:
        self._inbox.put(action)

    def _start_shard(self, lease: Lease) -> None:
        """Record the token in the store, read the cursor, then hand the shard to the fire loop."""
        try:
            taken = self.store.take_shard(lease.shard, self.config.member, lease.token)
            state = self.store.read_shard(lease.shard) if taken else None
        except SchedulerError as exc:
            self.stats.store_failures += 1
            log.warning("taking shard %d in the store failed: %s; retrying", lease.shard, exc,
                        extra={"action": "take_failed", "shard": lease.shard})
            self._retry_later(lambda: self._start_shard(lease), lease)
            return
        if not taken or state is None or state.lease_token != lease.token:
            self.stats.fenced_out += 1
            log.error("the store refused shard %d for token %d: a newer token is recorded", lease.shard,
                      lease.token, extra={"action": "fenced_out", "shard": lease.shard})
            self._give_up_lease(lease)
            return
        start = state.fired_through_ms
        never_fired = start is None
        if start is None:  # never fired: from the store's creation, when it says
            created = self.store.created_ms
            start = created - 1 if created is not None else self.clock() - self.config.first_lookback_ms
        baselines = None if state.baselines is None else dict(state.baselines)
        self._post(partial(self._shard_started, lease, start, baselines, never_fired))

    def _retry_later(self, action: Callable[[], None], lease: Lease, delay_s: float = 1.0) -> None:
        def again() -> None:
            if not self._stopping.is_set() and self.coordinator.is_valid(lease):
                self._submit(self._writers, action, on_error=partial(self._give_up_lease, lease))
            else:
                self._give_up_lease(lease)

        timer = threading.Timer(delay_s * (0.5 + random.random()), again)
        timer.daemon = True
        timer.start()

    def _load_bucket(self, owned: OwnedShard, bucket: int, after: int) -> None:
        """Read one bucket of the shard, rows after `after`, and send it to the fire loop in
        chunks. Chunks end between two run_at values, so a read retried after a failure
        (here, or asked for again later) resumes after the last run_at sent and sends no
        row twice."""
        token, shard = owned.token, owned.shard
        read_started = self.clock()
        delay = 0.2
        for _ in range(LOAD_ATTEMPTS):
            if self._stopping.is_set() or not self._holds(shard, token):
                return
            try:
                chunk: list[StoredTask] = []
                bad: list[Row] = []
                for stored in self.store.read_partition(owned.partition(bucket), after_ms=after,
                                                        page_size=self.config.page_size,
                                                        on_bad_row=partial(self._bad_row, bad)):
                    if len(chunk) >= LOAD_CHUNK and stored.task.run_at_ms != chunk[-1].task.run_at_ms:
                        rows = rows_from(chunk, token, owned.long_types) + bad
                        after = chunk[-1].task.run_at_ms
                        self._post(partial(self._rows_loaded, shard, token, rows, bucket, after))
                        chunk = []
                        bad.clear()  # the same list: the read's `on_bad_row` appends to it
                    chunk.append(stored)
                rows = rows_from(chunk, token, owned.long_types) + bad
                self._post(partial(self._rows_loaded, shard, token, rows, bucket, bucket + BUCKET_MS - 1, read_started))
                return
            except SchedulerError as exc:
                self.stats.store_failures += 1
                log.warning("reading bucket %d of shard %d failed: %s; retrying", bucket, shard, exc,
                            extra={"action": "load_failed", "shard": shard})
                self._stopping.wait(delay)
                delay = min(delay * 2, 5.0)
        self._post(partial(self._bucket_failed, shard, token, bucket))

    def _bad_row(self, into: list[Row], bad: BadRow) -> None:
        """A row the store could not read: it goes to the dead-letter topic with its raw
        columns, and counts as handled (so the shard goes on and its counts still match)."""
        self.stats.bad_rows += 1
        log.error("row %d/%s of partition %s cannot be read (%s); dead-lettering it", bad.run_at_ms,
                  bad.task_id.hex(), bad.partition, bad.reason, extra={"action": "bad_row"})
        into.append(Row(bad.run_at_ms, bad.task_id, 0, None, dead_letters.for_bad_row(bad, self.clock())))

    def _read_rows(self, owned: OwnedShard, after_ms: int, through_ms: int) -> list[Row]:
        """The rows of the shard in `(after_ms, through_ms]` (one bucket), fit for the wheel."""
        bad: list[Row] = []
        stored = list(self.store.read_partition(owned.partition(minute_bucket(through_ms)), after_ms=after_ms,
                                                through_ms=through_ms, on_bad_row=partial(self._bad_row, bad)))
        return rows_from(stored, owned.token, owned.long_types) + bad

    def _count_slice(self, owned: OwnedShard, k: int, look: bool = False) -> None:
        """Count slice `k` in the store: before it fires (its verify), or after (`look`)."""
        token, shard = owned.token, owned.shard
        after, through = owned.count_range(k)
        try:
            stored = self.store.count_partition(owned.partition(minute_bucket(k * 1000)), after_ms=after,
                                                through_ms=through)
        except SchedulerError as exc:
            self.stats.store_failures += 1
            log.warning("counting a slice of shard %d failed: %s", shard, exc, extra={"action": "count_failed"})
            self._post(partial(self._slice_failed, shard, token, k, look))
            return
        self._post(partial(self._slice_counted, shard, token, k, stored, look))

    def _reread_slice(self, owned: OwnedShard, k: int, look: bool = False) -> None:
        token, shard = owned.token, owned.shard
        after, through = owned.count_range(k)
        try:
            rows = self._read_rows(owned, after, through)
        except SchedulerError as exc:
            self.stats.store_failures += 1
            log.warning("re-reading a slice of shard %d failed: %s", shard, exc, extra={"action": "reread_failed"})
            self._post(partial(self._slice_failed, shard, token, k, look))
            return
        self._post(partial(self._slice_reread, shard, token, k, rows, look))

    def _sweep(self, owned: OwnedShard, sweep: Sweep) -> None:
        """Count what the sweep covers behind the cursor, in one request."""
        token, shard = owned.token, owned.shard
        try:
            counts = self.store.count_buckets(shard, sweep.buckets, sweep.through_ms, sweep.after_ms)
        except SchedulerError as exc:
            self.stats.store_failures += 1
            log.warning("the sweep of shard %d failed: %s", shard, exc, extra={"action": "sweep_failed"})
            self._post(partial(self._sweep_failed, shard, token))
            return
        self._post(partial(self._swept, shard, token, sweep, counts))

    def _reread_bucket(self, owned: OwnedShard, bucket: int, sweep: Sweep) -> None:
        token, shard = owned.token, owned.shard
        after = bucket - 1 if sweep.after_ms is None else max(bucket - 1, sweep.after_ms)
        try:
            rows = self._read_rows(owned, after, min(sweep.through_ms, bucket + BUCKET_MS - 1))
        except SchedulerError as exc:
            self.stats.store_failures += 1
            log.warning("re-reading bucket %d of shard %d failed: %s; the next sweep tries again", bucket, shard, exc,
                        extra={"action": "reread_failed"})
            return
        self._post(partial(self._bucket_reread, shard, token, bucket, rows, sweep.after_ms is None))

    def _advance(self, shard: int, lease: Lease, through_ms: int, baselines: dict[int, int]) -> None:
        try:
            applied = self.store.advance_shard(shard, lease.token, through_ms, baselines)
        except SchedulerError as exc:
            self.stats.store_failures += 1
            log.warning("advancing the cursor of shard %d failed: %s", shard, exc,
                        extra={"action": "advance_failed", "shard": shard})
            self._post(partial(self._advanced, shard, lease, None))
            return
        self._post(partial(self._advanced, shard, lease, through_ms if applied else False))

    def _schedule_pass(self, shard: int, lease: Lease) -> None:
        """Off the fire loop: create the runs of the shard's schedules that are due soon."""
        runner = self.schedule_runner
        assert runner is not None

        def still_owner() -> bool:
            return not self._stopping.is_set() and self.coordinator.is_valid(lease)

        result: PassResult | None = None
        with self._passes_changed:
            self._passes_running += 1
        try:
            if still_owner():
                result = runner.run_shard(shard, lease.token, still_owner)
        except SchedulerError as exc:
            self.stats.schedule_failures += 1
            log.warning("the schedule pass of shard %d failed: %s", shard, exc,
                        extra={"action": "schedule_pass_failed", "shard": shard})
        finally:
            with self._passes_changed:
                self._passes_running -= 1
                self._passes_changed.notify_all()
        self._post(partial(self._schedule_passed, shard, lease, result))

    # Inbox handlers: these run on the fire loop.

    def _schedule_passed(self, shard: int, lease: Lease, result: PassResult | None) -> None:
        self._scheduling.discard(shard)
        if result is None:
            return
        self.stats.schedule_passes += 1
        self.stats.schedule_runs_created += result.created
        self.stats.schedule_misfires += result.missed
        self.stats.schedule_failures += result.failed
        if result.created:
            log.info("created %d run(s) of recurring schedules of shard %d", result.created, shard,
                     extra={"action": "schedule_runs_created", "shard": shard})
        if result.fenced_out and self._current(shard, lease.token) is not None:
            self.stats.fenced_out += 1
            self._drop(shard, "fenced out by the schedule store", lease)

    def _gate_holds_behind_cursor(self, shard: int) -> bool:
        """Whether a task waits in the gate at or before the shard's cursor (as written, or
        being written). Only the hand-off brings such a task (one submitted into the
        past): a new owner would not read it from the store, so the hand-off position
        must not be committed past it until it is released and acknowledged."""
        floor = self.gate.floor(shard)
        if floor is None:
            return False
        owned = self.shards[shard]
        return floor < max(owned.persisted_ms, self._advance_target.get(shard, owned.persisted_ms))

    def _cursor(self, owned: OwnedShard) -> int:
        """How far the shard's cursor may move: never past a task waiting in the gate."""
        through = owned.cursor_candidate()
        floor = self.gate.floor(owned.shard)
        return through if floor is None else min(through, floor)

    def _holds(self, shard: int, token: int) -> bool:
        owned = self.shards.get(shard)
        return owned is not None and owned.token == token

    def _current(self, shard: int, token: int) -> OwnedShard | None:
        owned = self.shards.get(shard)
        return owned if owned is not None and owned.token == token else None

    def _shard_started(self, lease: Lease, start_ms: int, baselines: dict[int, int] | None = None,
                       never_fired: bool = False) -> None:
        if self._stopping.is_set() or not self.coordinator.is_valid(lease):
            self._drop(lease.shard, "lease lost while starting", lease)
            return
        config = self.config
        owned = OwnedShard(
            shard=lease.shard, lease=lease, start_ms=start_ms, shard_count=self.shard_count,
            long_types=config.long_types, tick_ms=config.tick_ms, verify_grace_ms=config.verify_grace_ms,
            second_look_ms=config.second_look_ms, sweep_interval_ms=config.sweep_interval_ms,
            horizon_ms=config.sweep_horizon_ms, inherited=baselines, never_fired=never_fired,
        )
        try:
            self.handoff_reader.assign(lease.shard)
        except QueueError as exc:
            log.warning("reading the hand-off of shard %d failed: %s; giving it back", lease.shard, exc,
                        extra={"action": "assign_failed", "shard": lease.shard})
            self._submit(self._writers, self._finish_give_back, owned, on_error=partial(self._give_up_lease, lease))
            return
        self.shards[lease.shard] = owned
        self.gate.take_shard(lease.shard, self.clock())
        self.stats.taken += 1
        log.info("firing shard %d from %d (token %d)", lease.shard, start_ms, lease.token,
                 extra={"action": "shard_started", "shard": lease.shard, "token": lease.token})

    def _rows_loaded(self, shard: int, token: int, rows: list[Row], bucket: int, posted_through_ms: int,
                     read_started_ms: int | None = None) -> None:
        """Rows of a bucket read; with `read_started_ms`, the last of them."""
        owned = self._current(shard, token)
        if owned is None:
            return
        self.stats.loaded += owned.add_rows(rows)
        owned.rows_posted(bucket, posted_through_ms)
        if read_started_ms is not None:
            owned.bucket_loaded(bucket, read_started_ms)
            self._loads_since_trim += 1

    def _trim_memory(self) -> None:
        """After bucket reads, hand the memory they used back (see `memory`); at most once
        a second, and only when the readers are idle, so it never slows a load."""
        now = time.monotonic()
        if self._loads_since_trim and now - self._last_trim > 1.0 and self._readers_idle():
            self._loads_since_trim = 0
            self._last_trim = now
            self._submit(self._readers, trim_memory)  # off the fire loop: it can take a while

    def _readers_idle(self) -> bool:
        return not any(owned.requested_buckets - owned.completed_buckets for owned in self.shards.values())

    def _slice_counted(self, shard: int, token: int, k: int, stored: int, look: bool = False) -> None:
        owned = self._current(shard, token)
        if owned is None:
            return
        if look:
            self.stats.slices_looked += 1
            again = owned.slice_looked(k, stored)
            self.stats.looks_reread += again
        else:
            self.stats.slices_counted += 1
            again = owned.slice_counted(k, stored)
            self.stats.slices_reread += again
        if again:
            self._submit(self._lookers if look else self._readers, self._reread_slice, owned, k, look,
                         on_error=partial(self._post, partial(self._slice_failed, shard, token, k, look)))

    def _slice_reread(self, shard: int, token: int, k: int, rows: list[Row], look: bool = False) -> None:
        owned = self._current(shard, token)
        if owned is not None:
            added = owned.slice_reread(k, rows, look=look)
            if look:
                self.stats.rows_found_late += added
            else:
                self.stats.rows_merged += added
            if added:
                log.warning("slice %d of shard %d held %d tasks the dispatcher had not seen (%s); merged", k, shard,
                            added, "written after it fired: they fire now" if look else "before it fired",
                            extra={"action": "slice_merged", "shard": shard})

    def _slice_failed(self, shard: int, token: int, k: int, look: bool = False) -> None:
        owned = self._current(shard, token)
        if owned is not None:  # asked again a little later
            owned.slice_failed(k, self.clock() + int(500 + 1000 * random.random()), look=look)

    def _swept(self, shard: int, token: int, sweep: Sweep, counts: dict[int, int]) -> None:
        owned = self._current(shard, token)
        if owned is None:
            return
        self.stats.sweeps += 1
        for bucket in owned.swept(sweep, counts):
            self.stats.buckets_reread += 1
            self._submit(self._lookers, self._reread_bucket, owned, bucket, sweep)

    def _sweep_failed(self, shard: int, token: int) -> None:
        owned = self._current(shard, token)
        if owned is not None:
            owned.sweep_failed(self.clock() + int(1000 + 1000 * random.random()))

    def _bucket_reread(self, shard: int, token: int, bucket: int, rows: list[Row], whole: bool = True) -> None:
        owned = self._current(shard, token)
        if owned is not None:
            added = owned.bucket_reread(bucket, rows, whole=whole)
            self.stats.rows_swept += added
            if added:
                log.warning("bucket %d of shard %d held %d tasks behind the cursor that were never fired; firing "
                            "them now", bucket, shard, added, extra={"action": "bucket_merged", "shard": shard})

    def _bucket_failed(self, shard: int, token: int, bucket: int) -> None:
        owned = self._current(shard, token)
        if owned is not None:
            owned.bucket_failed(bucket, self.clock() + int(1000 + 1000 * random.random()))

    def _advanced(self, shard: int, lease: Lease, result: int | bool | None) -> None:
        self._advancing.discard(shard)
        owned = self._current(shard, lease.token)
        if result is False:
            self.stats.fenced_out += 1
            log.error("the store refused the cursor of shard %d for token %d: a newer owner exists; stopped "
                      "firing it", shard, lease.token, extra={"action": "fenced_out", "shard": shard})
            if owned is not None:
                self._drop(shard, "fenced out by the store", lease)
            return
        if isinstance(result, int) and not isinstance(result, bool) and owned is not None:
            owned.persisted_ms = max(owned.persisted_ms, result)
            self.stats.advances += 1

    def _give_back(self, shard: int) -> None:
        owned = self.shards.pop(shard, None)
        if owned is None:
            return
        through = self._cursor(owned)
        baselines = owned.baselines(self.clock(), through)
        self.gate.drop_shard(shard)
        position = self._ready_positions.get(shard)
        if position is not None and position != self._committed.get(shard):
            try:
                self.handoff_reader.commit({shard: position})
            except QueueError as exc:  # the next owner reads a little again: duplicates, never loss
                log.warning("committing the hand-off position of shard %d failed: %s", shard, exc)
        self._stop_reading(shard)
        log.info("stopped firing shard %d to give it back", shard,
                 extra={"action": "shard_stopped", "shard": shard})
        self._submit(self._writers, self._finish_give_back, owned, through, baselines,
                     on_error=partial(self._give_up_lease, owned.lease))

    def _stop_reading(self, shard: int) -> None:
        try:
            self.handoff_reader.unassign(shard)
        except QueueError as exc:
            log.warning("could not stop reading the hand-off of shard %d: %s", shard, exc)
        self._positions.pop(shard, None)
        self._advance_target.pop(shard, None)
        self._committed.pop(shard, None)
        self._ready_positions.pop(shard, None)

    def _finish_give_back(self, owned: OwnedShard, through: int | None = None,
                          baselines: dict[int, int] | None = None) -> None:
        """Off the fire loop: write the final cursor `through` (with its baselines), then
        release the lease."""
        try:
            if through is not None and through > owned.persisted_ms and self.coordinator.is_valid(owned.lease):
                self.store.advance_shard(owned.shard, owned.token, through, baselines)
        except SchedulerError as exc:
            log.warning("final cursor of shard %d not written: %s", owned.shard, exc)
        self._give_up_lease(owned.lease)
        self.stats.given_back += 1
        log.info("gave shard %d back (cursor %d)", owned.shard, through,
                 extra={"action": "shard_given_back", "shard": owned.shard})

    def _drop(self, shard: int, why: str, lease: Lease) -> None:
        """Stop firing a shard at once, without touching the store: it is not ours."""
        owned = self.shards.get(shard)
        if owned is not None and owned.token == lease.token:
            del self.shards[shard]
            self.gate.drop_shard(shard)
            self._stop_reading(shard)
            self.stats.leases_lost += 1
            log.warning("stopped firing shard %d: %s", shard, why, extra={"action": "shard_dropped", "shard": shard})
        self._give_up_lease(lease)

    # The fire loop.

    def _fire_loop(self) -> None:
        tick = self.config.tick_ms
        last_loop = time.monotonic()
        while not self._stopping.is_set():
            now = self.clock()
            wait_ms = tick - now % tick
            if self._release_at_ms is not None and now < self._release_at_ms < now + wait_ms:
                wait_ms = self._release_at_ms - now  # a full rate window frees up before the tick
            deadline = time.monotonic() + wait_ms / 1000
            while True:
                remaining = deadline - time.monotonic()
                try:
                    action = self._inbox.get(timeout=max(remaining, 0)) if remaining > 0 else self._inbox.get_nowait()
                except queue.Empty:
                    break
                action()
            gap = time.monotonic() - last_loop
            last_loop = time.monotonic()
            if gap > self.config.lease_timeout_s / 3:
                self.stats.stalls += 1
                self._confirm_leases(gap)
            self._tick()

    def _confirm_leases(self, gap_s: float) -> None:
        log.warning("the fire loop stalled for %.1f s; confirming leases before firing", gap_s,
                    extra={"action": "stall"})
        for shard, owned in list(self.shards.items()):
            try:
                confirmed = self.coordinator.confirm(owned.lease)
            except SchedulerError:
                confirmed = False
            if not confirmed:
                self._drop(shard, "its lease was not confirmed after a stall", owned.lease)

    def _tick(self) -> None:
        now = self.clock()
        self._read_handoffs()
        if self._pending and (now < self._retry_at_ms or not self._publish_pending()):
            self._check_give_up(now)
            self._write_stats(now)  # an outage shows in the stats file while it lasts
            return
        polled = self._fire(now)
        if not self._pending:
            # Every record of these shards read so far is now fired and flushed, or waits
            # in the wheel after the cursor, where a new owner's read of the store finds it.
            for shard in polled:
                if shard in self._positions and not self._gate_holds_behind_cursor(shard):
                    self._ready_positions[shard] = self._positions[shard]
        self._check_give_up(now)
        self._trim_memory()
        self._schedule_reads(now)
        self._advance_cursors(now)
        self._run_schedules(now)
        self._commit_handoffs(now)
        self._write_stats(now)

    def _check_give_up(self, now: int) -> None:
        since = self._failing_since_ms
        if since is not None and now - since > self.config.publish_give_up_s * 1000 and self.failed is None:
            self.failed = f"nothing could be published for {self.config.publish_give_up_s:.0f} s"
            log.error("%s: giving every shard back and stopping", self.failed, extra={"action": "give_up"})
            self.stop()

    def _read_handoffs(self) -> None:
        if not self.shards:
            return
        try:
            records = self.handoff_reader.poll(10_000, 0)
        except QueueError as exc:
            log.warning("reading the hand-off log failed: %s", exc, extra={"action": "handoff_read_failed"})
            return
        now = self.clock()
        for record in records:
            if record.timestamp_ms is not None:
                self._note_stamp(now, record.timestamp_ms)
            owned = self.shards.get(record.shard)
            if owned is None:
                continue
            try:
                item = handoff.decode(record.value)
                if isinstance(item, handoff.HandedCompletions):
                    self.stats.completions += self.gate.completed(item.task_ids)
                elif isinstance(item, handoff.HandedTask):
                    if item.task.id.shard(self.shard_count) != record.shard:
                        raise InvalidMessage(f"the task belongs to shard {item.task.id.shard(self.shard_count)}")
                    if owned.handed_task(item.task):
                        self.stats.handed_tasks += 1
                else:
                    self.stats.handed_cancels += 1
                    owned.handed_cancel(item.task_id.bytes, item.task_id.run_at_ms)
                    self.gate.cancel(record.shard, item.task_id.bytes)
            except Exception as exc:  # one bad record must not stop the shard, nor its next owner
                self.stats.bad_handoffs += 1
                log.error("skipped a bad hand-off record at shard %d offset %d: %s", record.shard, record.offset, exc,
                          extra={"action": "bad_handoff"})
            self._positions[record.shard] = record.offset + 1

    def _note_stamp(self, now: int, stamp_ms: int) -> None:
        """Measure the hand-off writers' clocks against this one: a record stamped ahead of
        now was stamped by a clock that is ahead (counted, logged once a window); the least
        lag over a window is how far behind the writers' clocks are, plus the transit."""
        lag = now - stamp_ms
        if lag < -SKEW_WARN_MS:
            self.stats.handoff_clock_ahead += 1
            if now - self._skew_logged_ms >= SKEW_WINDOW_MS:
                self._skew_logged_ms = now
                log.warning("a hand-off record was stamped %d ms ahead of this dispatcher's clock: a producer's or "
                            "worker's clock is ahead; its tasks due 'now' fire that much late (see the README on "
                            "clocks)", -lag, extra={"action": "clock_skew"})
        started, least = self._lag_window
        if now - started >= SKEW_WINDOW_MS:
            if least is not None:
                self.stats.handoff_min_lag_ms = least
            self._lag_window = (now, lag)
        elif least is None or lag < least:
            self._lag_window = (started, lag)

    def _fire(self, now: int) -> set[int]:
        """Fire what is due in every shard whose lease is valid; returns those shards."""
        polled: set[int] = set()
        if self._session is SessionState.SUSPENDED:
            return polled  # the leases may yet survive: keep the shards, fire nothing
        gate = self.gate
        gated = not gate.bypass
        for shard, owned in list(self.shards.items()):
            if not self.coordinator.is_valid(owned.lease):
                session = self._session_now()  # another thread may have changed it since the check above
                if session is not SessionState.SUSPENDED:
                    self._drop(shard, f"its lease is no longer valid (session {session.value})", owned.lease)
                continue
            batch = owned.fire(now, gated=gated)
            if batch.gated is not None:
                batch.by_tag = gate.admit(shard, batch.gated)
                passed = sum(len(values) for values in batch.by_tag.values())
                self.stats.gated += len(batch.gated) - passed
                batch.count, batch.gated = passed, None
            polled.add(shard)
            self.stats.skipped_cancelled += batch.skipped_cancelled
            self.stats.duplicates_dropped += batch.duplicates
            if batch.dead_letters and self.config.dead_letter_topic is None:
                batch.dead_letters = []  # nowhere to park them: logged when read
            if batch.by_tag or batch.dead_letters:
                self._pending.append((shard, owned.token, batch))
            else:
                owned.flushed(batch)
        if gated:
            self._let_out(now)
        if self._pending:
            self._publish_pending()
        return polled

    def _let_out(self, now: int) -> None:
        """Add what the gate lets out now to the batches to publish; the shards' wheel
        frontiers do not move with them (they moved when the tasks entered the gate)."""
        released = self.gate.release(now)
        self._release_at_ms = released.next_at_ms
        for shard, by_tag in released.by_shard.items():
            owned = self.shards[shard]  # a shard dropped has nothing left in the gate
            waiting = released.waiting[shard]
            batch = FireBatch(by_tag, owned.flushed_through_ms, len(waiting), 0, released=waiting,
                              released_at_ms=released.at_ms)
            self._pending.append((shard, owned.token, batch))

    def _publish_pending(self) -> bool:
        """Publish and flush the pending batches of shards whose lease is valid; on failure
        keep them to publish again. A batch of a shard since dropped is discarded: its
        next owner fires it again from the cursor. True when nothing is left pending."""
        sending: list[tuple[int, int, FireBatch]] = []
        keeping: list[tuple[int, int, FireBatch]] = []
        for shard, token, batch in self._pending:
            owned = self._current(shard, token)
            if owned is None:
                continue
            if self.coordinator.is_valid(owned.lease):
                sending.append((shard, token, batch))
            elif self._session_now() is SessionState.SUSPENDED:
                keeping.append((shard, token, batch))  # the lease may yet come back
            else:
                self._drop(shard, "its lease is no longer valid", owned.lease)
        try:
            if sending:
                by_topic: dict[tuple[str, int | None], list[bytes]] = {}
                for _, _, batch in sending:
                    for tag, values in batch.by_tag.items():
                        by_topic.setdefault((self.topics[tag], batch.released_at_ms), []).extend(values)
                    if batch.dead_letters and self.config.dead_letter_topic is not None:
                        by_topic.setdefault((self.config.dead_letter_topic, None), []).extend(batch.dead_letters)
                for (topic, stamp), values in by_topic.items():
                    self.publisher.publish(topic, values, stamp)
                self.publisher.flush(self.config.flush_timeout_s)
        except QueueError as exc:
            self.stats.publish_failures += 1
            now = self.clock()
            if self._failing_since_ms is None:
                self._failing_since_ms = now
            self._backoff_ms = min(max(self._backoff_ms * 2, 100), 5000)
            self._retry_at_ms = now + self._backoff_ms
            log.warning("publishing failed: %s; publishing again in %d ms", exc, self._backoff_ms,
                        extra={"action": "publish_failed"})
            self._pending = keeping + sending
            return False
        if sending:
            self._backoff_ms = 0
            self._failing_since_ms = None
        for shard, token, batch in sending:
            self.stats.fired += batch.count
            owned = self._current(shard, token)
            if owned is not None:
                owned.flushed(batch)
                if batch.released is not None:
                    self.stats.released += batch.count
                    self.gate.published(shard, batch.released)
        self._pending = keeping
        return not keeping

    def _schedule_reads(self, now: int) -> None:
        for shard, owned in self.shards.items():
            token = owned.token
            for bucket in owned.buckets_to_load(now, self.config.lookahead_ms):
                owned.read_asked(bucket)
                self._submit(self._readers, self._load_bucket, owned, bucket, owned.resume_after(bucket),
                             on_error=partial(self._post, partial(self._bucket_failed, shard, token, bucket)))
            for k in owned.slices_to_verify(now, self.config.verify_lead_ms):
                owned.ask_count(k)
                self._submit(self._readers, self._count_slice, owned, k,
                             on_error=partial(self._post, partial(self._slice_failed, shard, token, k)))
            for k in owned.slices_to_look(now):
                owned.ask_look(k)
                self._submit(self._lookers, self._count_slice, owned, k, True,
                             on_error=partial(self._post, partial(self._slice_failed, shard, token, k, True)))
            sweep = owned.sweep_due(now)
            if sweep is not None:
                owned.forget(now)
                self._submit(self._lookers, self._sweep, owned, sweep,
                             on_error=partial(self._post, partial(self._sweep_failed, shard, token)))

    def _advance_cursors(self, now: int) -> None:
        for shard, owned in self.shards.items():
            if shard in self._advancing or now - self._last_advance_ms.get(shard, 0) < self.config.advance_interval_ms:
                continue
            through = self._cursor(owned)
            if through > owned.persisted_ms and self.coordinator.is_valid(owned.lease):
                self._advancing.add(shard)
                self._last_advance_ms[shard] = now
                self._advance_target[shard] = through
                self._submit(self._writers, self._advance, shard, owned.lease, through, owned.baselines(now, through),
                             on_error=partial(self._post, partial(self._advanced, shard, owned.lease, None)))

    def _run_schedules(self, now: int) -> None:
        if self.schedule_runner is None:
            return
        interval = self.config.schedule_interval_ms
        for shard, owned in self.shards.items():
            if shard in self._scheduling or now - self._last_schedule_ms.get(shard, 0) < interval:
                continue
            self._scheduling.add(shard)
            self._last_schedule_ms[shard] = now
            self._submit(self._schedulers, self._schedule_pass, shard, owned.lease,
                         on_error=partial(self._post, partial(self._schedule_passed, shard, owned.lease, None)))

    def _commit_handoffs(self, now: int) -> None:
        if now - self._last_commit_ms < self.config.commit_interval_ms:
            return
        self._last_commit_ms = now
        positions = {shard: offset for shard, offset in self._ready_positions.items()
                     if shard in self.shards and self._committed.get(shard) != offset}
        if not positions:
            return
        try:
            self.handoff_reader.commit(positions)
        except QueueError as exc:
            log.warning("committing hand-off positions failed: %s", exc, extra={"action": "commit_failed"})
            return
        self._committed.update(positions)

    def _write_stats(self, now: int) -> None:
        path = self.config.stats_path
        if path is None or now - self._last_stats_ms < self.config.stats_interval_ms:
            return
        self._last_stats_ms = now
        try:
            write_json(path, self.snapshot())
        except OSError as exc:
            log.warning("could not write the stats file %s: %s", path, exc)

    def snapshot(self) -> dict[str, Any]:
        """What this dispatcher holds and has done, as one JSON-able document."""
        waiting = sum(len(owned.wheel) for owned in self.shards.values())
        wheel_bytes = sum(owned.wheel.nbytes for owned in self.shards.values())
        return {
            "member": self.config.member,
            "pid": os.getpid(),
            "at_ms": self.clock(),
            "session": self._session.value,
            "shards": sorted(self.shards),
            "tokens": {str(shard): owned.token for shard, owned in sorted(self.shards.items())},
            "waiting": waiting,
            "wheel_bytes": wheel_bytes,
            "seen_bytes": sum(owned.seen.nbytes for owned in self.shards.values()),
            "gate_waiting": self.gate.waiting,
            "tenants": self.gate.snapshot(),
            "stats": self.stats.__dict__,
        }

    def _shutdown(self) -> None:
        """Give every shard back, so other dispatchers take over without waiting: what
        was fired but not acknowledged is left for the next owner to fire again."""
        if self._pending:
            self._publish_pending()
        self._readers.shutdown(wait=False, cancel_futures=True)
        self._lookers.shutdown(wait=False, cancel_futures=True)
        self._schedulers.shutdown(wait=False, cancel_futures=True)
        with self._passes_changed:  # a pass under way sees the stop before its next schedule
            if not self._passes_changed.wait_for(lambda: self._passes_running == 0, SCHEDULE_STOP_WAIT_S):
                log.warning("a schedule pass still runs %.0f s after the stop; giving the shards back anyway",
                            SCHEDULE_STOP_WAIT_S)
        for shard in list(self.shards):
            self._give_back(shard)
        self._writers.shutdown(wait=True)
        self._write_stats(self.clock() + self.config.stats_interval_ms)


def trim_memory() -> None:
    memory.trim()


def write_json(path: Path, document: dict[str, Any]) -> None:
    """Replace `path` atomically, so a reader never sees half a document."""
    temporary = path.with_name(path.name + ".tmp")
    temporary.write_text(json.dumps(document))
    os.replace(temporary, path)
