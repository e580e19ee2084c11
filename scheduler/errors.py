"""Every error the scheduler raises on purpose derives from `SchedulerError`.

Adapters translate driver exceptions at the boundary (`raise StoreError(...) from exc`),
so callers never need to import a driver to handle a failure. Messages say what was
wrong and what to do about it.
"""

from __future__ import annotations


class SchedulerError(Exception):
    """Root of the scheduler's errors."""


class InvalidTask(SchedulerError, ValueError):
    """A task description is malformed: bad time, tenant, type, priority or attempts."""


class InvalidTaskId(InvalidTask):
    """Text or bytes that do not form a task id."""


class InvalidPayload(InvalidTask):
    """A payload that msgpack cannot encode, or one over the size limit."""


class InvalidSchedule(InvalidTask):
    """A recurring schedule that cannot be stored: bad cron expression, unknown time
    zone, bad misfire policy, negative jitter or grace, or a bad task template."""


class InvalidMessage(SchedulerError):
    """Bytes taken from a queue that do not decode to a task message.

    Workers dead-letter such messages with this error's text as the reason; they never
    crash on them or block the partition behind them.
    """


class ConfigError(SchedulerError, ValueError):
    """A setting that cannot be used (bad keyspace name, shard count, consistency level...)."""


class HandoffFailed(SchedulerError):
    """A task (or cancel) due soon was stored but could not be handed to the dispatcher,
    so it may not take effect in time: submitting it again with its idempotency key, or
    cancelling again, is the remedy."""


class StoreError(SchedulerError):
    """The task store failed or could not be reached."""


class StoreUnavailable(StoreError):
    """No node of the store could be reached."""


class StoreAccessDenied(StoreError, ConfigError):
    """Cassandra answered, and refused the scheduler: its credentials (a wrong password, no
    user where authentication is on), its TLS (no CA, a certificate it does not trust, no
    client certificate where one is required) or a statement its role is not granted. A
    setting to fix, not an outage to wait out: a `ConfigError` as well, so the CLI exits 2."""


class SchemaConflict(StoreError):
    """The keyspace exists with settings that differ from the ones asked for (e.g. shard count)."""


class CoordinatorError(SchedulerError):
    """The coordinator (ZooKeeper, or the embedded one) failed or could not be reached."""


class CoordinatorUnavailable(CoordinatorError):
    """No coordinator server answered within the connection timeout."""


class CoordinatorAccessDenied(CoordinatorError, ConfigError):
    """ZooKeeper answered, and refused the scheduler's authentication, or an operation
    that the ACL of a node does not grant its identity (a wrong password, no identity on
    a protected root, a root another identity made). A setting to fix, not an outage to
    wait out: a `ConfigError` as well, so the CLI exits 2."""


class QueueError(SchedulerError):
    """The queue (Kafka, or the embedded one) refused or lost a publish, or failed a read.
    After a failed publish, which messages were stored is unknown: publish them again
    (duplicates are allowed downstream, loss is not)."""


class QueueAccessDenied(QueueError, ConfigError):
    """Kafka answered, and refused the scheduler: its SASL credentials, its TLS, or an
    operation its ACLs do not allow (writing to a ready topic, reading as a group). A
    setting to fix, not an outage to wait out: a `ConfigError` as well, so the CLI exits
    2. What the refused call was to publish is not known stored: a call that wrote to
    several topics may have stored what went to the ones it may write to."""


class QueueUnavailable(QueueError):
    """No queue broker answered within the connection timeout."""
