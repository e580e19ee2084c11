"""The limits store's port: the fairness limits that dispatchers enforce at release."""

from __future__ import annotations

from typing import Protocol

from scheduler.fairness.limits import Limits, TenantLimits


class LimitsStore(Protocol):
    """Durable home of the fairness limits (`scheduler.fairness.limits`), kept by two
    adapters that meet one contract suite (`tests/contract/test_limits_store.py`).

    One row per scope: a tenant's (`tenant:<name>`), the `default` row (for tenants
    without one) and the `global` row (its rate only). Operators write them through
    `scheduler limits`; every dispatcher re-reads them all every few seconds. Writes are
    whole rows, last writer wins. Failures: `StoreError`, never a driver's exception.
    Thread-safe.
    """

    def read(self) -> Limits:
        """Every row, as one `Limits`. A row that does not pass the checks of
        `scheduler.fairness.limits` is left out with a warning, never raised, so a row
        written by hand cannot stop a dispatcher (`limits_from_rows`)."""
        ...

    def set_tenant(self, tenant: str, limits: TenantLimits) -> None:
        """Write `tenant`'s whole row (a cap or rate of None is stored as none)."""
        ...

    def set_default(self, limits: TenantLimits) -> None:
        """Write the default row: the limits of every tenant without a row of its own."""
        ...

    def set_global_rate(self, rate: float | None) -> None:
        """Set the rate across all tenants, or remove it (None)."""
        ...

    def delete_tenant(self, tenant: str) -> bool:
        """Remove `tenant`'s row, so the default applies to it; False if it had none."""
        ...

    def close(self) -> None: ...
