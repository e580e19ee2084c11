"""What each tenant may use: its plan weight, its concurrency cap and its rate, plus the
one global rate that keeps every tenant together under the provider's limit.

Units: a rate counts **cost units** a second. A task's `cost` (1 unless the producer
says otherwise) is what it spends of a rate, e.g. 500 for a task that sends 500 SMS,
so a provider contract of 2,000 SMS a second is `global rate 2000` whatever the tasks'
sizes. A cap counts running tasks, whatever their cost.

A tenant without a row of its own gets the default row's values (weight 1, no cap, no
rate unless an operator set the default). The values are checked here, once, for the
CLI and for what a dispatcher reads from the store, so a bad row never reaches the
release path: `LimitsError` says which value is wrong and what is allowed.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from scheduler.errors import ConfigError

MAX_WEIGHT = 1000
MAX_CAP = 1_000_000
MAX_RATE = 10_000_000.0


class LimitsError(ConfigError):
    """A weight, cap or rate outside what is allowed."""


def check_weight(weight: object) -> int:
    if isinstance(weight, bool) or not isinstance(weight, int) or not 1 <= weight <= MAX_WEIGHT:
        raise LimitsError(f"weight must be a whole number from 1 to {MAX_WEIGHT} (turns relative to weight-1 "
                          f"tenants), got {weight!r}")
    return weight


def check_cap(cap: object) -> int | None:
    if cap is None:
        return None
    if isinstance(cap, bool) or not isinstance(cap, int) or not 1 <= cap <= MAX_CAP:
        raise LimitsError(f"cap must be a whole number of running tasks from 1 to {MAX_CAP}, or none, got {cap!r}")
    return cap


def check_rate(rate: object) -> float | None:
    if rate is None:
        return None
    if isinstance(rate, bool) or not isinstance(rate, int | float) or not math.isfinite(rate) \
            or not 0 < rate <= MAX_RATE:
        raise LimitsError(f"rate must be a number of cost units a second above 0 and at most {MAX_RATE:.0f}, "
                          f"or none, got {rate!r}")
    return float(rate)


@dataclass(frozen=True, slots=True)
class TenantLimits:
    """One tenant's plan: `weight` turns in the round robin, at most `cap` tasks running
    at once (None: no cap), at most `rate` cost units a second (None: no rate)."""

    weight: int = 1
    cap: int | None = None
    rate: float | None = None

    def __post_init__(self) -> None:
        check_weight(self.weight)
        check_cap(self.cap)
        object.__setattr__(self, "rate", check_rate(self.rate))


UNLIMITED = TenantLimits()


@dataclass(frozen=True, slots=True)
class Limits:
    """Every tenant's limits as read at one moment; what a dispatcher enforces."""

    tenants: Mapping[str, TenantLimits] = field(default_factory=dict)
    default: TenantLimits = UNLIMITED
    """The limits of a tenant without a row of its own."""
    global_rate: float | None = None
    """Cost units a second across every tenant and every dispatcher (None: no limit)."""

    def __post_init__(self) -> None:
        object.__setattr__(self, "global_rate", check_rate(self.global_rate))

    def of(self, tenant: str) -> TenantLimits:
        return self.tenants.get(tenant, self.default)

    @property
    def unlimited(self) -> bool:
        """True when nothing limits release: no global rate, and no tenant (nor the
        default) has a cap or a rate. Weights alone change nothing then, since nothing
        waits."""
        if self.global_rate is not None or self.default.cap is not None or self.default.rate is not None:
            return False
        return all(limits.cap is None and limits.rate is None for limits in self.tenants.values())


NO_LIMITS = Limits()


# How the store adapters key and read their rows (`scheduler.ports.LimitsStore`).

DEFAULT_SCOPE = "default"
GLOBAL_SCOPE = "global"
TENANT_SCOPE_PREFIX = "tenant:"


def tenant_scope(tenant: str) -> str:
    """The row key of `tenant`'s limits: the prefix and the name as it is (colons too)."""
    if not isinstance(tenant, str) or not tenant:
        raise LimitsError(f"a tenant is a non-empty name, got {tenant!r}")
    return TENANT_SCOPE_PREFIX + tenant


class ScopedRows:
    """What both store adapters do the same way over their own `_write` (one whole row)
    and `_delete` (True if the row was there)."""

    def _write(self, scope: str, weight: int | None, cap: int | None, rate: float | None) -> None:
        raise NotImplementedError

    def _delete(self, scope: str) -> bool:
        raise NotImplementedError

    def set_tenant(self, tenant: str, limits: TenantLimits) -> None:
        self._write(tenant_scope(tenant), limits.weight, limits.cap, limits.rate)

    def set_default(self, limits: TenantLimits) -> None:
        self._write(DEFAULT_SCOPE, limits.weight, limits.cap, limits.rate)

    def set_global_rate(self, rate: float | None) -> None:
        rate = check_rate(rate)
        if rate is None:
            self._delete(GLOBAL_SCOPE)
        else:
            self._write(GLOBAL_SCOPE, None, None, rate)

    def delete_tenant(self, tenant: str) -> bool:
        return self._delete(tenant_scope(tenant))


def limits_from_rows(rows: Iterable[Sequence[Any]], log: logging.Logger) -> Limits:
    """The stored rows `(scope, weight, cap, rate)` as one `Limits`. A row that fails the
    checks above (written by hand, or by a newer version) is left out with a warning
    naming it and the reason, never raised: a dispatcher reading it keeps running, and
    that tenant (or the default, or the global rate) is read as if it had no row."""
    tenants: dict[str, TenantLimits] = {}
    default = UNLIMITED
    global_rate: float | None = None
    for scope, weight, cap, rate in rows:
        try:
            if scope == GLOBAL_SCOPE:
                global_rate = check_rate(rate)  # weight and cap mean nothing here
            elif scope == DEFAULT_SCOPE:
                default = TenantLimits(weight, cap, rate)
            elif isinstance(scope, str) and scope.startswith(TENANT_SCOPE_PREFIX) \
                    and len(scope) > len(TENANT_SCOPE_PREFIX):
                tenants[scope[len(TENANT_SCOPE_PREFIX):]] = TenantLimits(weight, cap, rate)
            else:
                raise LimitsError(f"the scope is none of '{TENANT_SCOPE_PREFIX}<name>', '{DEFAULT_SCOPE}' "
                                  f"and '{GLOBAL_SCOPE}'")
        except LimitsError as exc:
            log.warning("skipping the limits row %r (weight=%r, cap=%r, rate=%r): %s", scope, weight, cap, rate,
                        exc, extra={"action": "limits_row_skipped"})
    return Limits(tenants, default, global_rate)
