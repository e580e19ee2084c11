"""The bench's fixed settings, the targets its figures are judged by, the reference
ceilings it quotes, the scenarios and their defaults, and the options of one run
(`Options`, from the command line of `bench/nine_oclock.py`)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

TASK_TYPE = "sms"
BOARD_SHARE = 0.8
READ_AHEAD_S = 60
"""The dispatcher reads a minute's partitions this long before the minute starts."""
ASSUMED_INGEST_ROWS_PER_S = 15_000
"""For choosing M: about half the SDK's measured rate, so ingest is done in time."""
LEASE_TIMEOUT_S = 10
SHARDS = 64
READY_PARTITIONS = 8
SETTLE_TIMEOUT_S = 120
STOP_TIMEOUT_S = 30
DRAIN_TIMEOUT_S = 30
AFTER_BURST_S = 60
"""How long after the last due second the bench waits for stragglers."""
DUPLICATE_WATCH_S = 2.0
"""How long the reader goes on after the last task was seen, to catch repeats."""
SAMPLE_FENCE = 1 << 33
"""A fencing token of the size ZooKeeper's zxids have, for the ceiling's messages."""

TARGET_FIRE_RATE = 25_000
TARGET_P99_MS = 1_000
TARGET_MAX_MS = 2_000
TARGET_OVERHEAD_BYTES = 64
TARGET_HANDLER_P99_MS = 2_000
"""With `--workers`: handler start - run_at, p99."""
WORKER_CONCURRENCY = 8
WORKER_RATE_FLOOR = 500
"""With `--workers`, the bench waits for them up to tasks / this many seconds past the
dispatchers' deadline (M + S + `AFTER_BURST_S`)."""

SCENARIOS = ("burst", "failover", "pause", "fairness")
"""burst: the dispatchers alone; failover: one dispatcher is killed (SIGKILL) mid-burst;
pause: one is stopped (SIGSTOP) mid-burst for `--pause-s`, then continued (SIGCONT);
fairness: results day under a global rate, tenants of different weights (`FairnessMix`)."""
SCENARIO_DEFAULTS: dict[str, dict[str, int]] = {
    "burst": {"tasks": 300_000, "spread_s": 10, "dispatchers": 1},
    "failover": {"tasks": 150_000, "spread_s": 30, "dispatchers": 2},
    "pause": {"tasks": 150_000, "spread_s": 30, "dispatchers": 2},
    "fairness": {"tasks": 24_450, "spread_s": 6, "dispatchers": 2},
}
"""What `--tasks`, `--spread-s` and `--dispatchers` default to in each scenario: a
failover or pause needs a second dispatcher to take over, and a burst long enough to
show the gap and the recovery (the lease alone takes `LEASE_TIMEOUT_S` to expire). In
the fairness scenario `--tasks` is the sum of its mix (`FairnessMix.tasks`), and the
spread covers the college's due moment."""
PAUSE_DEFAULT_S = LEASE_TIMEOUT_S + 5
"""How long a pause lasts by default: past the lease, so the paused dispatcher's shards
go to the others and it comes back to find its leases gone."""
REOWN_TIMEOUT_S = 60
"""How long after a kill (after the end of a pause) the bench waits for the other
dispatchers to hold every shard again."""

REFERENCE_CEILINGS = {
    "source": "/work/shared/LOCAL-CLUSTER.md: 2-core machine, servers co-located",
    "kafka_produce_msgs_per_s": "100k msg/s (200 B, acks=all, idempotent, lz4, linger 5 ms)",
    "cassandra_partition_read_rows_per_s": "49k rows/s (16 concurrent, paged 5,000); sequential 32k",
    "cassandra_insert_rows_per_s": "17k-35k rows/s (single-partition UNLOGGED batches)",
    "zookeeper_sync_writes_per_s": "~380/s",
}


FAIRNESS_WEIGHTS = {"board": 1, "college": 1, "gold": 3, "free": 1}
"""The tenants of the fairness scenario and the weights the bench sets for them."""
TARGET_COLLEGE_P99_MS = 2_000
"""Fairness: the college's release lateness (Kafka timestamp - run_at), p99."""
TARGET_WEIGHT_ERROR = 0.10
"""Fairness: gold/free units while both were backlogged within this share of 3."""
TARGET_DRAIN_SHARE = 0.90
"""Fairness: all tenants together release at least this share of the global rate in
the middle 10 s of the board's releases."""


@dataclass(frozen=True)
class FairnessMix:
    """The fairness scenario's workload and limits: at M the board's `board_tasks` of
    `board_cost` units each and `weight_tasks` tasks of cost 1 for each of gold (weight 3)
    and free (weight 1); at M + `college_at_s` the college's `college_tasks` of cost 1,
    priority high; everything under a global rate of `global_rate` units/s."""

    board_tasks: int = 400
    board_cost: int = 75
    weight_tasks: int = 12_000
    college_tasks: int = 50
    college_at_s: float = 5.0
    global_rate: float = 2_000.0

    @property
    def tasks(self) -> int:
        return self.board_tasks + 2 * self.weight_tasks + self.college_tasks

    @property
    def units(self) -> int:
        return self.board_tasks * self.board_cost + 2 * self.weight_tasks + self.college_tasks

    @property
    def drain_s(self) -> float:
        """How long the global rate takes to let every unit out."""
        return self.units / self.global_rate


@dataclass(frozen=True)
class Options:
    tasks: int
    spread_s: int
    dispatchers: int
    payload_bytes: int
    tenants: int
    lead_s: int
    reader: str
    ceiling_messages: int
    keep: bool
    work_dir: Path | None
    py_spy: Path | None
    workers: int = 0
    """`scheduler worker` processes running the burst's handlers (0: none, the dispatchers alone)."""
    worker_concurrency: int = WORKER_CONCURRENCY
    align: bool = True
    """M is a minute boundary; False (`--no-align`): the first whole second at least the
    lead ahead, so a quick check need not wait for the next minute."""
    scenario: str = "burst"
    event_at_s: float | None = None
    """failover and pause: when the victim gets its signal, in seconds after M."""
    pause_s: float = PAUSE_DEFAULT_S
    """pause: how long the victim stays stopped."""
    backend: str = "cassandra"
    """cassandra (Cassandra, Kafka, ZooKeeper) or embedded (the SQLite files)."""
    fairness: FairnessMix | None = None
    """fairness: the workload and limits; None in the other scenarios."""
    metrics: bool = False
    """Every process with `--metrics-port 0`, scraped every second (`bench.scraper`)."""
    fill: int = 0
    """Other tasks written into the keyspace before the burst (`fill.py`); 0: none."""
    fill_processes: int = 2
    """Processes writing the fill."""
