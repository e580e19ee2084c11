"""Running `scheduler worker` processes in tests, on one test's deployment.

A `Workers` fleet starts workers as real processes (so kill -9 and SIGTERM are real)
running the test application `tests.worker.apps:app`, each with its own log and stats
file, all reporting to one `Sink` (a SQLite file named by `SCHEDULER_TEST_SINK`) that
records every handler start and every effect across processes. `group_members` asks
Kafka which members a worker pool's consumer group has and what each holds, so a test
can wait for a stable group before it does anything a rebalance would disturb.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from confluent_kafka import ConsumerGroupState
from confluent_kafka.admin import AdminClient

from scheduler.adapters.kafka.security import client_config
from scheduler.settings import KafkaSettings
from tests.dispatchers import ManagedProcess
from tests.support import wait_until
from tests.worker.apps import Sink

REPO = Path(__file__).resolve().parents[1]
APP = "tests.worker.apps:app"
SESSION_TIMEOUT_S = 6.0
"""Session timeout of the workers tests start: short, so a killed worker's partitions move quickly."""


@dataclass
class WorkerProcess(ManagedProcess):
    @property
    def pid(self) -> int:
        return self.process.pid

    def kill(self) -> None:
        """kill -9, and reap the process."""
        self.signal(signal.SIGKILL)
        self.process.wait(timeout=10)

    def check_alive(self) -> None:
        if not self.alive():
            raise AssertionError(f"worker {self.name} exited ({self.process.returncode}):\n{self.log()[-3000:]}")


@dataclass
class Workers:
    env: Mapping[str, str]
    """The deployment's environment (`SCHEDULER_*`), as the dispatchers get it."""
    directory: Path
    sink_path: Path
    workers: list[WorkerProcess] = field(default_factory=list)

    def __post_init__(self) -> None:
        Sink(self.sink_path).close()  # the tables exist before any worker or reader opens it

    def start(self, name: str, *args: str, pool: str = "default", concurrency: int | None = None,
              session_timeout_s: float = SESSION_TIMEOUT_S, env: Mapping[str, str] | None = None) -> WorkerProcess:
        log_path = self.directory / f"worker-{name}.log"
        stats_path = self.directory / f"worker-{name}.json"
        log_file = log_path.open("wb")
        command = [sys.executable, "-m", "scheduler", "worker", "--app", APP, "--member", name,
                   "--stats-file", str(stats_path), "--session-timeout", str(session_timeout_s), "--pool", pool]
        if concurrency is not None:
            command += ["--concurrency", str(concurrency)]
        process = subprocess.Popen(
            [*command, *args], stdout=subprocess.DEVNULL, stderr=log_file, cwd=REPO,
            env={**os.environ, **self.env, "SCHEDULER_TEST_SINK": str(self.sink_path), **(env or {})},
        )
        worker = WorkerProcess(name, process, log_path, stats_path, log_file)
        self.workers.append(worker)
        return worker

    def sink(self) -> Sink:
        """A reader of the shared sink (close it when done)."""
        return Sink(self.sink_path)

    def wait_started(self, *workers: WorkerProcess, timeout_s: float = 30) -> None:
        """Until each worker has written its first stats document (it is consuming)."""
        def started() -> bool:
            for worker in workers:
                worker.check_alive()
            return all(worker.stats() for worker in workers)

        wait_until(started, timeout_s=timeout_s, what=f"workers {[w.name for w in workers]} to start")

    def stop_all(self, timeout_s: float = 15) -> None:
        """SIGTERM every live worker, kill -9 those still running after `timeout_s`."""
        for worker in self.workers:
            if worker.alive():
                worker.signal(signal.SIGCONT)
                worker.process.terminate()
        for worker in self.workers:
            try:
                worker.process.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                worker.process.kill()
                worker.process.wait(timeout=10)
            worker.log_file.close()


def group_members(kafka: KafkaSettings, pool: str = "default") -> dict[str, set[tuple[str, int]]] | None:
    """Member (client id, i.e. `--member`) -> partitions it holds, of the pool's consumer
    group, if the group is stable; None while it is rebalancing (or unknown)."""
    admin = AdminClient(client_config(kafka))
    group = kafka.worker_group(pool)
    description = admin.describe_consumer_groups([group], request_timeout=10)[group].result(timeout=15)
    if description.state != ConsumerGroupState.STABLE:
        return None
    return {
        member.client_id: {(tp.topic, tp.partition) for tp in member.assignment.topic_partitions}
        for member in description.members
    }


def wait_for_group(kafka: KafkaSettings, members: Collection[str], *, pool: str = "default",
                   partitions: int, timeout_s: float = 60) -> dict[str, set[tuple[str, int]]]:
    """Until the pool's group is stable with exactly `members`, each holding some of the
    `partitions` (all of them between them); the assignment."""
    names = set(members)

    def stable() -> dict[str, set[tuple[str, int]]] | None:
        held = group_members(kafka, pool)
        if held is None or set(held) != names or any(not parts for parts in held.values()):
            return None
        if sum(len(parts) for parts in held.values()) != partitions:
            return None
        return held

    held = wait_until(stable, timeout_s=timeout_s, interval_s=0.2, what=f"a stable group of {sorted(names)}")
    assert held is not None
    return held
