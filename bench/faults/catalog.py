"""The faults, one per run: what each does to the cluster, how long it lasts, and how
it is undone.

Each is `inject`ed at a set moment of the burst and `recover`ed after `hold_s`. What
they do, and why for that long:

- `cassandra-kill`: SIGKILL one Cassandra node (unflushed writes die with it), start it
  again 20 s later on its data; hints from the other nodes bring it the writes it
  missed. RF 3 with LOCAL_QUORUM: every read and write still has two replicas.
- `cassandra-pause`: SIGSTOP one Cassandra node for longer than the driver's request
  timeout (30 s), then SIGCONT: connections to it stay open but nothing answers, the
  harder case for a client than a node that is gone.
- `kafka-leader-kill`: SIGKILL the broker that leads the most ready-topic partitions,
  start it again 20 s later: leadership moves to an in-sync replica (RF 3,
  min.insync.replicas 2, acks=all, no unclean election).
- `zookeeper-leader-kill`: SIGKILL the ensemble's leader, start it again 20 s later: the
  other two elect a new leader; sessions that cannot reconnect within the lease
  timeout expire and their shards move.
- `dispatcher-zookeeper-cut`: drop every packet one dispatcher sends to ZooKeeper for the
  lease timeout + 10 s: its session expires, its shards go to the other, and it must
  stop firing them (fencing), then rejoin.
- `dispatcher-cassandra-cut`: drop every packet the other dispatcher sends to Cassandra
  for 40 s (longer than the driver's request timeout): it keeps its leases but can
  neither load nor write a cursor.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from confluent_kafka.admin import AdminClient

from bench.nine.common import BenchFailure, echo, now_ms
from bench.nine.deployment import DispatcherProcess
from bench.nine.settings import LEASE_TIMEOUT_S
from scheduler.adapters.kafka.security import client_config
from scheduler.settings import KafkaSettings

from .netcut import CutGroup
from .nodes import Nodes

CASSANDRA_PORT = 9042
ZOOKEEPER_PORT = 2181
DRIVER_REQUEST_TIMEOUT_S = 30


@dataclass
class Scene:
    """What a fault acts on."""

    nodes: Nodes
    kafka: KafkaSettings
    ready_topics: list[str]
    dispatchers: list[DispatcherProcess] = field(default_factory=list)
    cut_groups: dict[str, CutGroup] = field(default_factory=dict)
    """Dispatcher name -> the cgroup it was started in, for the cut faults."""


@dataclass
class Fault:
    name: str
    hold_s: float
    cut_dispatcher: str | None = None
    """For a cut: the dispatcher that must be started in a cgroup of its own."""
    target: str | None = None
    injected_ms: int | None = None
    recovered_ms: int | None = None
    restart_s: float | None = None
    details: dict[str, Any] = field(default_factory=dict)
    _paused_pid: int | None = None

    def inject(self, scene: Scene) -> None:
        action = INJECT[self.name]
        self.target = action(self, scene)
        self.injected_ms = now_ms()
        echo(f"fault: {self.name} on {self.target}")

    def recover(self, scene: Scene) -> None:
        UNDO[self.name](self, scene)
        self.recovered_ms = now_ms()
        echo(f"fault: {self.name} undone after {(self.recovered_ms - (self.injected_ms or 0)) / 1000:.1f} s"
             + (f" (the node answered {self.restart_s:.1f} s after its start)" if self.restart_s else ""))

    def figures(self) -> dict[str, Any]:
        return {"fault": self.name, "target": self.target, "hold_s": self.hold_s,
                "restart_s": None if self.restart_s is None else round(self.restart_s, 1), **self.details}


def kafka_leader(scene: Scene) -> str:
    """The broker node leading the most ready-topic partitions."""
    admin = AdminClient(client_config(scene.kafka))
    metadata = admin.list_topics(timeout=30)
    leaders: Counter[int] = Counter()
    for topic in scene.ready_topics:
        found = metadata.topics.get(topic)
        if found is None:
            raise BenchFailure(f"topic {topic} is missing")
        leaders.update(partition.leader for partition in found.partitions.values() if partition.leader >= 0)
    if not leaders:
        raise BenchFailure("no ready-topic partition has a leader")
    broker, led = leaders.most_common(1)[0]
    return f"kafka-{broker}:{led}"


def kill_cassandra(fault: Fault, scene: Scene) -> str:
    name = scene.nodes.node_of("cassandra", 2)
    scene.nodes.kill(name)
    return name


def pause_cassandra(fault: Fault, scene: Scene) -> str:
    name = scene.nodes.node_of("cassandra", 2)
    fault._paused_pid = scene.nodes.pause(name)
    return name


def kill_kafka_leader(fault: Fault, scene: Scene) -> str:
    name, led = kafka_leader(scene).split(":")
    fault.details["partitions_led"] = int(led)
    scene.nodes.kill(name)
    return name


def kill_zookeeper_leader(fault: Fault, scene: Scene) -> str:
    name = scene.nodes.zookeeper_leader()
    scene.nodes.kill(name)
    return name


def cut(port: int) -> Callable[[Fault, Scene], str]:
    def apply(fault: Fault, scene: Scene) -> str:
        assert fault.cut_dispatcher is not None
        scene.cut_groups[fault.cut_dispatcher].cut([port])
        return fault.cut_dispatcher
    return apply


def restart(fault: Fault, scene: Scene) -> None:
    assert fault.target is not None
    fault.restart_s = scene.nodes.start(fault.target)


def resume(fault: Fault, scene: Scene) -> None:
    assert fault._paused_pid is not None
    scene.nodes.resume(fault._paused_pid)


def uncut(fault: Fault, scene: Scene) -> None:
    assert fault.cut_dispatcher is not None
    group = scene.cut_groups[fault.cut_dispatcher]
    fault.details["dropped_packets"] = group.dropped()
    group.restore()


INJECT: dict[str, Callable[[Fault, Scene], str]] = {
    "cassandra-kill": kill_cassandra,
    "cassandra-pause": pause_cassandra,
    "kafka-leader-kill": kill_kafka_leader,
    "zookeeper-leader-kill": kill_zookeeper_leader,
    "dispatcher-zookeeper-cut": cut(ZOOKEEPER_PORT),
    "dispatcher-cassandra-cut": cut(CASSANDRA_PORT),
}
UNDO: dict[str, Callable[[Fault, Scene], None]] = {
    "cassandra-kill": restart,
    "cassandra-pause": resume,
    "kafka-leader-kill": restart,
    "zookeeper-leader-kill": restart,
    "dispatcher-zookeeper-cut": uncut,
    "dispatcher-cassandra-cut": uncut,
}
FAULTS = tuple(INJECT)


def make(name: str) -> Fault:
    """The fault called `name`, with its hold time."""
    if name not in INJECT:
        raise ValueError(f"unknown fault {name!r}; choose from {', '.join(FAULTS)}")
    hold = {"cassandra-pause": DRIVER_REQUEST_TIMEOUT_S + 5, "dispatcher-zookeeper-cut": LEASE_TIMEOUT_S + 10,
            "dispatcher-cassandra-cut": DRIVER_REQUEST_TIMEOUT_S + 10}.get(name, 20)
    victim = {"dispatcher-zookeeper-cut": "dispatcher-1", "dispatcher-cassandra-cut": "dispatcher-2"}.get(name)
    return Fault(name, hold, cut_dispatcher=victim)
