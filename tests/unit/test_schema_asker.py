"""How `schema.apply` asks a statement again: a statement that may have reached its node
(it timed out, the connection broke) is asked only of that node, so a table is never
made twice under two ids; one that never left the client (its node had no open
connection) goes to another node; a refusal is not asked again; and asking ends after
the patience with the last error. The node-level path (a paused Cassandra) is in
tests/integration/test_cassandra.py."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from cassandra import InvalidRequest, OperationTimedOut
from cassandra.cluster import NoHostAvailable
from cassandra.connection import ConnectionException

from scheduler.adapters.cassandra import schema
from scheduler.adapters.cassandra.schema import PATIENCE_S


@dataclass(eq=False)
class Node:
    endpoint: str
    is_up: bool = True
    open: bool = True


@dataclass
class ScriptedSession:
    """Answers each `execute` from a script of outcomes (an exception to raise, or a
    result), and records which node each ask went to."""

    nodes: list[Node]
    script: Iterator[Any]
    asked: list[str] = field(default_factory=list)

    def get_pool_state(self) -> dict[Node, dict[str, int]]:
        return {node: {"open_count": int(node.open)} for node in self.nodes}

    def execution_profile_clone_update(self, _profile: object, **_changes: object) -> object:
        return object()

    def execute(self, _statement: str, _values: object, *, timeout: float, host: Node, execution_profile: object) -> Any:
        if not host.open:  # as the driver does: no pool, nothing sent
            raise NoHostAvailable("Unable to complete the operation against any hosts", {})
        self.asked.append(host.endpoint)
        outcome = next(self.script)
        if isinstance(outcome, Exception):
            raise outcome
        return outcome


def asker(session: ScriptedSession, sleep: Any = lambda _seconds: None, clock: Any = lambda: 0.0) -> Any:
    """An asker whose waits take no time (the clock stands still unless given)."""
    return schema._Asker(session, sleep=sleep, clock=clock)


@dataclass
class Reconnects:
    """A wait (the asker's `sleep`) during which `node` has no open connection until the
    `after_waits`-th wait, when the driver has reconnected to it."""

    node: Node
    after_waits: int
    waits: int = 0

    def __call__(self, _seconds: float) -> None:
        self.waits += 1
        self.node.open = self.waits >= self.after_waits


def timeout() -> OperationTimedOut:
    return OperationTimedOut("Client request timeout")


def test_a_statement_that_timed_out_is_asked_again_of_the_same_node_only() -> None:
    a, b = Node("10.0.0.1:9042"), Node("10.0.0.2:9042")
    session = ScriptedSession([a, b], iter([timeout(), "done"]))
    assert asker(session)("CREATE TABLE IF NOT EXISTS k.t (a int PRIMARY KEY)") == "done"
    assert session.asked == ["10.0.0.1:9042", "10.0.0.1:9042"]


def test_a_node_that_went_away_after_a_timeout_is_waited_for_not_replaced() -> None:
    a, b = Node("10.0.0.1:9042"), Node("10.0.0.2:9042")
    script = iter([ConnectionException("Connection defunct by heartbeat"), "done"])
    session = ScriptedSession([a, b], script)
    wait = Reconnects(a, after_waits=3)
    ask = asker(session, sleep=wait)
    assert ask("CREATE TABLE IF NOT EXISTS k.t (a int PRIMARY KEY)") == "done"
    assert wait.waits == 3
    assert session.asked == ["10.0.0.1:9042", "10.0.0.1:9042"]  # never 10.0.0.2


def test_a_statement_that_never_left_goes_to_a_node_with_an_open_connection() -> None:
    a, b = Node("10.0.0.1:9042", open=False), Node("10.0.0.2:9042")
    session = ScriptedSession([a, b], iter(["done", "done too"]))
    ask = asker(session)
    assert ask("CREATE KEYSPACE IF NOT EXISTS k") == "done"
    a.open = True  # the first node back: the next statement stays where the last went
    assert ask("CREATE TABLE IF NOT EXISTS k.t (a int PRIMARY KEY)") == "done too"
    assert session.asked == ["10.0.0.2:9042", "10.0.0.2:9042"]


@dataclass
class Answer:
    """A result whose change the driver did (or did not) see on every node in time."""

    response_future: Any


@dataclass
class Future:
    is_schema_agreed: bool


def test_after_a_change_not_yet_on_every_node_the_next_statement_waits_for_its_node() -> None:
    """`ALTER TABLE t` asked of another node before `CREATE TABLE t` reached it would be
    refused there as a table it does not know."""
    a, b = Node("10.0.0.1:9042"), Node("10.0.0.2:9042")
    session = ScriptedSession([a, b], iter([Answer(Future(is_schema_agreed=False)), "altered"]))
    ask = asker(session, sleep=Reconnects(a, after_waits=2))
    ask("CREATE TABLE IF NOT EXISTS k.t (a int PRIMARY KEY)")
    a.open = False
    assert ask("ALTER TABLE k.t ADD IF NOT EXISTS b int") == "altered"
    assert session.asked == ["10.0.0.1:9042", "10.0.0.1:9042"]


def test_a_node_held_up_without_an_open_connection_is_not_chosen() -> None:
    session = ScriptedSession([Node("10.0.0.1:9042", open=False), Node("10.0.0.9:9042")], iter(["done"]))
    assert asker(session)("CREATE KEYSPACE IF NOT EXISTS k") == "done"
    assert session.asked == ["10.0.0.9:9042"]


def test_a_refusal_is_not_asked_again() -> None:
    session = ScriptedSession([Node("10.0.0.1:9042")], iter([InvalidRequest("unknown strategy"), "done"]))
    with pytest.raises(InvalidRequest):
        asker(session)("CREATE KEYSPACE IF NOT EXISTS k")
    assert len(session.asked) == 1


def test_asking_ends_after_the_patience_with_the_last_error() -> None:
    now = [0.0]

    def wait(seconds: float) -> None:
        now[0] += seconds

    session = ScriptedSession([Node("10.0.0.1:9042")], iter(timeout, None))
    with pytest.raises(OperationTimedOut):
        asker(session, sleep=wait, clock=lambda: now[0])("CREATE KEYSPACE IF NOT EXISTS k")
    # Waits of 1, 2, 5, then 10 s: the asks end within the patience, the last after 170 s.
    assert PATIENCE_S - 10 <= now[0] < PATIENCE_S
    assert len(session.asked) == 1 + 3 + int((now[0] - 8) / 10)
