"""The release gate: due tasks leave a dispatcher fairly between tenants, not in time order.

Where it sits
-------------
The wheel says what is due; the gate says what may leave now. With no limit configured
anywhere, nothing would wait, so the dispatcher skips the gate. Otherwise every due
task of a limited tenant (every task, when a global rate is set) is **admitted** into
its tenant's queue, and each tick the gate **releases** what the limits allow:

- **Deficit round robin** between tenants with due work (Shreedhar and Varghese): at
  its turn a tenant's deficit grows by `weight * quantum` cost units, and it releases
  tasks while their cost fits the deficit. A tenant with 50 due tasks is served within
  its first turn, whatever another tenant has due, and a tenant of weight 3 gets three
  times the units of a tenant of weight 1 while both have work.
- **Priorities within the tenant's share**: a tenant's turn serves its high, normal and
  low queues 7 : 2 : 1 (smooth weighted round robin over the non-empty ones), so an OTP
  never waits behind the same tenant's monthly report.
- **Caps**: a tenant of cap N holds at most its share of N tasks released and not yet
  reported finished. Workers send a completion for every finished attempt through the
  hand-off log (`completed`); a task whose completion never comes (its worker died and
  nothing redelivered it) frees its place after `hold_timeout_ms`.
- **Rates**: a `WindowRate` per tenant and one for everyone, each at this dispatcher's
  share of the configured rate. A tenant over its own cap or rate sits out the rest of
  the tick without gaining credit; when the global rate is spent, the tick ends and the
  next one resumes the round where it stopped.

Shares: tasks spread evenly over shards, so a dispatcher holding `k` of `n` shards
enforces `k / n` of each rate and cap, without talking to the others. A shard counts
toward the share only `window_ms` after it was taken, so that its previous owner's
releases of the last window and this dispatcher's never add up in one window. A cap's
share is rounded down, but is at least 1 while the dispatcher holds a shard, so a
tenant is never shut out; the caps add up exactly when a tenant's cap is at least the
number of dispatchers.

The cursor: a task stays in the gate's accounting from admission until the queue has
acknowledged it (`published`), and `floor(shard)` is the run_at before the earliest of
those, so a shard's cursor never passes a task that is waiting here. A shard given back
or lost drops its waiting tasks (`drop_shard`); its next owner reads them again from
the store.

Everything here runs on the dispatcher's fire loop: no threads, no I/O, no clock.
"""

from __future__ import annotations

import heapq
import math
from collections import Counter, deque
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field

from scheduler.errors import InvalidMessage
from scheduler.fairness.limits import NO_LIMITS, Limits, TenantLimits
from scheduler.fairness.rate import WindowRate
from scheduler.model import MESSAGE_ID_SLICE, peek_release_fields

PRIORITY_WEIGHTS = (7, 2, 1)
"""Turns of high, normal and low within a tenant's share."""

PRUNE_EVERY_MS = 60_000
"""How often tenants with nothing left in the gate are forgotten."""


class Waiting:
    """One due task in the gate: where it came from, what it costs, and the message."""

    __slots__ = ("shard", "run_at_ms", "tag", "item", "cost", "priority")

    def __init__(self, shard: int, run_at_ms: int, tag: int, item: bytes, cost: int, priority: int) -> None:
        self.shard = shard
        self.run_at_ms = run_at_ms
        self.tag = tag
        self.item = item
        self.cost = cost
        self.priority = priority


@dataclass
class TenantStats:
    admitted: int = 0
    released: int = 0
    released_units: int = 0
    completed: int = 0
    expired_holds: int = 0
    capped: int = 0
    """Turns skipped because the tenant was at its cap."""
    rate_limited: int = 0
    """Turns skipped because the tenant's own rate was spent."""
    cancelled: int = 0
    """Waiting tasks cancelled, dropped without being released."""


class _Tenant:
    __slots__ = ("name", "queues", "size", "deficit", "current", "choice", "rate", "running", "stats")

    def __init__(self, name: str, window_ms: int) -> None:
        self.name = name
        self.queues: tuple[deque[Waiting], ...] = (deque(), deque(), deque())
        self.size = 0
        self.deficit = 0.0
        self.current = [0, 0, 0]
        """Smooth weighted round robin state over the three priorities."""
        self.choice: int | None = None
        self.rate = WindowRate(window_ms=window_ms)
        self.running = 0
        self.stats = TenantStats()

    def head(self) -> Waiting:
        """The next task of this tenant: 7 : 2 : 1 over its non-empty priority queues."""
        if self.choice is None:
            total = 0
            best = -1
            for code, queue in enumerate(self.queues):
                if queue:
                    weight = PRIORITY_WEIGHTS[code]
                    self.current[code] += weight
                    total += weight
                    if best < 0 or self.current[code] > self.current[best]:
                        best = code
            self.current[best] -= total
            self.choice = best
        return self.queues[self.choice][0]

    def pop(self) -> Waiting:
        assert self.choice is not None
        waiting = self.queues[self.choice].popleft()
        self.choice = None
        self.size -= 1
        return waiting


@dataclass
class Release:
    """What one `release` let out, grouped for publishing, and what to settle after."""

    by_shard: dict[int, dict[int, list[bytes]]] = field(default_factory=dict)
    """shard -> wheel tag -> messages."""
    waiting: dict[int, list[Waiting]] = field(default_factory=dict)
    count: int = 0
    at_ms: int = 0
    """The moment of release: the dispatcher stamps the messages with it."""
    next_at_ms: int | None = None
    """When a full global window frees up, if that stopped this release: the dispatcher
    releases again then rather than at its next tick."""


class ReleaseGate:
    """`quantum`: cost units a weight-1 tenant gets per turn. Small, so turns interleave
    finely (two tenants of weights 3 and 1 alternate every 40 units, not every 400);
    a task costlier than its tenant's turn waits a few turns, as deficit round robin
    allows."""

    def __init__(self, shard_count: int, *, quantum: int = 10, window_ms: int = 1000,
                 hold_timeout_ms: int = 300_000) -> None:
        self.shard_count = shard_count
        self.quantum = quantum
        self.window_ms = window_ms
        self.hold_timeout_ms = hold_timeout_ms
        self.limits: Limits = NO_LIMITS
        self._tenants: dict[str, _Tenant] = {}
        self._ring: deque[_Tenant] = deque()
        """Tenants with waiting tasks, in round-robin order; the first one has the turn."""
        self._turn_open = False
        """Whether the first tenant of the ring already got its quantum for this turn."""
        self._global = WindowRate(window_ms=window_ms)
        self._eligible_at: dict[int, int] = {}
        """Held shard -> when it starts counting toward the share."""
        self._holds: dict[bytes, tuple[_Tenant, int, int]] = {}
        """Task id -> (tenant, expiry, shard) of released tasks of capped tenants."""
        self._expiries: deque[tuple[int, bytes]] = deque()
        self._cancelled: dict[bytes, int] = {}
        """Ids of waiting tasks cancelled -> their shard."""
        self._unsettled: dict[int, Counter[int]] = {}
        """shard -> run_at -> tasks admitted and not yet published."""
        self._run_ats: dict[int, list[int]] = {}
        """shard -> heap of the run_ats in `_unsettled` (lazily cleaned)."""
        self.waiting = 0
        self._pruned_at_ms = 0

    # Configuration and ownership.

    def set_limits(self, limits: Limits) -> None:
        self.limits = limits

    @property
    def bypass(self) -> bool:
        """True when nothing needs the gate: no limit anywhere and nothing waiting."""
        return self.limits.unlimited and not self._unsettled

    def take_shard(self, shard: int, now_ms: int) -> None:
        self._eligible_at[shard] = now_ms + self.window_ms

    def drop_shard(self, shard: int) -> int:
        """Forget a shard given back or lost: its waiting tasks leave the queues (its next
        owner reads them from the store). Returns how many were dropped."""
        self._eligible_at.pop(shard, None)
        self._run_ats.pop(shard, None)
        self._forget_cancels(shard)
        # Its tasks' completions now go to the shard's next owner: free their places here
        # rather than hold them to the timeout (the next owner does not count them).
        for task_id, (tenant, _, held_shard) in list(self._holds.items()):
            if held_shard == shard:
                del self._holds[task_id]
                tenant.running -= 1
        if self._unsettled.pop(shard, None) is None:
            return 0
        dropped = 0
        for tenant in list(self._ring):
            for code, queue in enumerate(tenant.queues):
                kept = deque(w for w in queue if w.shard != shard)
                dropped += len(queue) - len(kept)
                tenant.size -= len(queue) - len(kept)
                tenant.queues[code].clear()
                tenant.queues[code].extend(kept)
            if tenant.choice is not None and not tenant.queues[tenant.choice]:
                tenant.choice = None  # its chosen queue held only the dropped shard's tasks
            if not tenant.size:
                tenant.deficit = 0.0
                self._leave_ring(tenant)
        self.waiting -= dropped
        return dropped

    def share(self, now_ms: int) -> float:
        eligible = sum(1 for at in self._eligible_at.values() if at <= now_ms)
        return eligible / self.shard_count

    # Admission.

    def admit(self, shard: int, entries: Iterable[tuple[int, int, bytes]],
              through_run_ats: list[int] | None = None) -> dict[int, list[bytes]]:
        """Take the due entries `(run_at, tag, message)` of a shard; returns, by tag, those
        that need no gate (their tenant has no limit and there is no global rate), and
        appends their run_ats to `through_run_ats` if given."""
        limits = self.limits
        through: dict[int, list[bytes]] = {}
        passed = through_run_ats.append if through_run_ats is not None else None
        unsettled = self._unsettled.setdefault(shard, Counter())
        run_ats = self._run_ats.setdefault(shard, [])
        for run_at, tag, item in entries:
            try:
                tenant_name, priority, cost = peek_release_fields(item)
            except InvalidMessage:  # a worker dead-letters it; the gate has nothing to weigh
                through.setdefault(tag, []).append(item)
                if passed is not None:
                    passed(run_at)
                continue
            if limits.global_rate is None:
                own = limits.of(tenant_name)
                if own.cap is None and own.rate is None:
                    through.setdefault(tag, []).append(item)
                    if passed is not None:
                        passed(run_at)
                    continue
            tenant = self._tenants.get(tenant_name)
            if tenant is None:
                tenant = self._tenants[tenant_name] = _Tenant(tenant_name, self.window_ms)
            tenant.queues[priority].append(Waiting(shard, run_at, tag, item, cost, priority))
            tenant.stats.admitted += 1
            if not tenant.size:
                self._ring.append(tenant)
            tenant.size += 1
            self.waiting += 1
            if not unsettled[run_at]:
                heapq.heappush(run_ats, run_at)
            unsettled[run_at] += 1
        if not unsettled:
            del self._unsettled[shard]
            del self._run_ats[shard]
        return through

    # Release.

    def release(self, now_ms: int) -> Release:
        """Let out what the limits allow at `now_ms`, tenants in deficit round robin."""
        out = Release(at_ms=now_ms)
        self._expire(now_ms)
        if now_ms - self._pruned_at_ms >= PRUNE_EVERY_MS:
            self._prune(now_ms)
        if not self._ring:
            return out
        limits = self.limits
        share = self.share(now_ms)
        if share <= 0:
            return out
        global_rate = limits.global_rate * share if limits.global_rate is not None else None
        blocked: set[str] = set()
        ring = self._ring
        idle = 0
        """Turns ended in a row because the head cost more than the deficit."""
        while ring and len(blocked) < len(ring):
            tenant = ring[0]
            if tenant.name in blocked:
                self._next_turn()
                continue
            own = limits.of(tenant.name)
            head = tenant.head()
            if self._cancelled and head.item[MESSAGE_ID_SLICE] in self._cancelled:
                self._drop_cancelled(tenant)  # spends nothing: no rate, no turn
                if not tenant.size:
                    tenant.deficit = 0.0
                    self._leave_ring(tenant)
                continue
            if not self._turn_open:
                if self._own_limit(tenant, own, head, share, now_ms):
                    self._block(tenant, head, blocked)
                    continue
                tenant.deficit += own.weight * self.quantum
                self._turn_open = True
            if head.cost > tenant.deficit:
                self._next_turn()
                idle += 1
                if idle >= len(ring) - len(blocked):
                    self._skip_rounds(blocked)
                    idle = 0
                continue
            if self._own_limit(tenant, own, head, share, now_ms):
                self._block(tenant, head, blocked)
                continue
            if global_rate is not None and not self._global.allows(now_ms, head.cost, global_rate):
                free_at = self._global.window_frees_at(head.cost, global_rate)
                if free_at is not None:  # the pace alone waits for the next tick, within its tolerance
                    out.next_at_ms = math.ceil(free_at)
                break
            self._let_out(tenant, own, tenant.pop(), share, global_rate, now_ms, out)
            idle = 0
            if not tenant.size:
                tenant.deficit = 0.0
                self._leave_ring(tenant)
        return out

    def cancel(self, shard: int, task_id: bytes) -> None:
        """A cancel for a task of `shard`: if it waits here, it leaves when it comes to the
        head of its queue, spending nothing. Remembered only while the shard has tasks here."""
        if shard in self._unsettled:
            self._cancelled[task_id] = shard

    def _drop_cancelled(self, tenant: _Tenant) -> None:
        waiting = tenant.pop()
        task_id = waiting.item[MESSAGE_ID_SLICE]
        del self._cancelled[task_id]
        self.waiting -= 1
        tenant.stats.cancelled += 1
        self.published(waiting.shard, [waiting])  # no longer holds the cursor

    def _block(self, tenant: _Tenant, head: Waiting, blocked: set[str]) -> None:
        """The tenant is at its own cap or rate: it sits out the rest of the release, and
        keeps no more credit than its next task needs, so it cannot hoard turns while
        held back and then crowd the others out."""
        tenant.deficit = min(tenant.deficit, float(head.cost))
        blocked.add(tenant.name)
        self._next_turn()

    def _skip_rounds(self, blocked: set[str]) -> None:
        """A whole round let nothing out (every head costs more than its tenant's deficit):
        give every tenant at once the turns it would get in the rounds until one can
        afford its head, rather than going round quantum by quantum (a 500-unit task
        with a 10-unit quantum would take 50 rounds)."""
        limits = self.limits
        waiting = [t for t in self._ring if t.name not in blocked]
        rounds = min(math.ceil((t.head().cost - t.deficit) / (limits.of(t.name).weight * self.quantum))
                     for t in waiting) - 1
        if rounds > 0:
            for t in waiting:
                t.deficit += rounds * limits.of(t.name).weight * self.quantum

    def _own_limit(self, tenant: _Tenant, own: TenantLimits, head: Waiting, share: float, now_ms: int) -> str:
        if own.cap is not None and tenant.running >= cap_share(own.cap, share):
            tenant.stats.capped += 1
            return "cap"
        if own.rate is not None and not tenant.rate.allows(now_ms, head.cost, own.rate * share):
            tenant.stats.rate_limited += 1
            return "rate"
        return ""

    def _let_out(self, tenant: _Tenant, own: TenantLimits, waiting: Waiting, share: float,
                 global_rate: float | None, now_ms: int, out: Release) -> None:
        tenant.deficit -= waiting.cost
        self.waiting -= 1
        if own.rate is not None:
            tenant.rate.take(now_ms, waiting.cost, own.rate * share)
        if global_rate is not None:
            self._global.take(now_ms, waiting.cost, global_rate)
        if own.cap is not None:
            task_id = waiting.item[MESSAGE_ID_SLICE]
            if task_id not in self._holds:
                tenant.running += 1
            expiry = now_ms + self.hold_timeout_ms
            self._holds[task_id] = (tenant, expiry, waiting.shard)
            self._expiries.append((expiry, task_id))
        tenant.stats.released += 1
        tenant.stats.released_units += waiting.cost
        out.by_shard.setdefault(waiting.shard, {}).setdefault(waiting.tag, []).append(waiting.item)
        out.waiting.setdefault(waiting.shard, []).append(waiting)
        out.count += 1

    def _next_turn(self) -> None:
        self._ring.rotate(-1)
        self._turn_open = False

    def _leave_ring(self, tenant: _Tenant) -> None:
        if self._ring and self._ring[0] is tenant:
            self._ring.popleft()
            self._turn_open = False
        else:
            self._ring.remove(tenant)

    # What comes back.

    def published(self, shard: int, released: Sequence[Waiting]) -> None:
        """The queue acknowledged `released` (of `shard`): they stop holding its cursor."""
        unsettled = self._unsettled.get(shard)
        if unsettled is not None:
            for waiting in released:
                left = unsettled[waiting.run_at_ms] - 1
                if left > 0:
                    unsettled[waiting.run_at_ms] = left
                else:
                    del unsettled[waiting.run_at_ms]
            if not unsettled:
                del self._unsettled[shard]
                del self._run_ats[shard]
                self._forget_cancels(shard)

    def _forget_cancels(self, shard: int) -> None:
        if self._cancelled:
            self._cancelled = {key: at for key, at in self._cancelled.items() if at != shard}

    def completed(self, task_ids: Iterable[bytes]) -> int:
        """Workers finished these attempts; returns how many held a capped place."""
        freed = 0
        for task_id in task_ids:
            held = self._holds.pop(task_id, None)
            if held is not None:
                held[0].running -= 1
                held[0].stats.completed += 1
                freed += 1
        return freed

    def _prune(self, now_ms: int) -> None:
        """Forget tenants with nothing waiting, nothing running and no rate history: of
        3,000 colleges, most have nothing due most of the day."""
        self._pruned_at_ms = now_ms
        for name, tenant in list(self._tenants.items()):
            if not tenant.size and not tenant.running and tenant.rate.settled(now_ms):
                del self._tenants[name]

    def _expire(self, now_ms: int) -> None:
        expiries = self._expiries
        while expiries and expiries[0][0] <= now_ms:
            expiry, task_id = expiries.popleft()
            held = self._holds.get(task_id)
            if held is not None and held[1] == expiry:
                del self._holds[task_id]
                held[0].running -= 1
                held[0].stats.expired_holds += 1

    def floor(self, shard: int) -> int | None:
        """The last millisecond before the earliest task of `shard` still in the gate's
        accounting (waiting, or released and not acknowledged); None if there is none."""
        unsettled = self._unsettled.get(shard)
        if not unsettled:
            return None
        heap = self._run_ats[shard]
        while heap[0] not in unsettled:
            heapq.heappop(heap)
        return heap[0] - 1

    def snapshot(self, top: int = 20) -> dict[str, dict[str, int]]:
        """Per tenant (the `top` with the most waiting): waiting, running, and counters."""
        tenants = sorted(self._tenants.values(), key=lambda t: (-t.size, t.name))[:top]
        return {t.name: {"waiting": t.size, "running": t.running, **t.stats.__dict__} for t in tenants}


def cap_share(cap: int, share: float) -> int:
    """This dispatcher's part of a cap: rounded down, at least 1 while it holds shards."""
    if share <= 0:
        return 0
    return max(1, math.floor(cap * share + 1e-9))
