"""Helpers shared by the tests: waiting on a condition with a deadline (never sleeping
and hoping), running the `scheduler` command, and ZooKeeper sessions."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

from kazoo.client import KazooClient

from scheduler.adapters.zookeeper.tls import tls_options
from scheduler.settings import TlsFiles

T = TypeVar("T")

EXTERNAL_CLUSTER_VARIABLES = ("SCHEDULER_CASSANDRA_HOSTS", "SCHEDULER_KAFKA_BOOTSTRAP", "SCHEDULER_ZOOKEEPER_HOSTS")
"""Any one of these set means: test against the cluster they name, not deploy/local."""


def max_window(releases: Sequence[tuple[int, int]], window_ms: int = 1000) -> int:
    """The most units in any half-open window `[a, a + window_ms)` of `(at_ms, units)`."""
    ordered = sorted(releases)
    best = total = start = 0
    for at, units in ordered:
        total += units
        while ordered[start][0] <= at - window_ms:
            total -= ordered[start][1]
            start += 1
        best = max(best, total)
    return best


def wait_until(condition: Callable[[], T], *, timeout_s: float, interval_s: float = 0.05, what: str = "condition") -> T:
    """Poll `condition` until it returns something truthy and return that, or fail
    with `what` once `timeout_s` has passed."""
    deadline = time.monotonic() + timeout_s
    while True:
        result = condition()
        if result:
            return result
        if time.monotonic() >= deadline:
            raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")
        time.sleep(interval_s)


def all_at_once(calls: Sequence[Callable[[], T]], *, timeout_s: float = 60) -> list[T]:
    """Run each of `calls` on a thread of its own, released together by a barrier, and
    return their results in order; re-raise the first failure, fail on a hang."""
    start = threading.Barrier(len(calls))
    results: list[T | None] = [None] * len(calls)
    errors: list[BaseException] = []

    def run(index: int, call: Callable[[], T]) -> None:
        try:
            start.wait(timeout=timeout_s)
            results[index] = call()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=pair) for pair in enumerate(calls)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=timeout_s)
    if any(thread.is_alive() for thread in threads):
        raise AssertionError(f"calls still running after {timeout_s} s")
    if errors:
        raise errors[0]
    return results  # type: ignore[return-value]


def run_cli(*args: str, env: Mapping[str, str] | None = None, timeout_s: float = 90) -> subprocess.CompletedProcess[str]:
    """`scheduler ARGS...` in a new process, as a user runs it: exit code, stdout, stderr."""
    return subprocess.run(
        [sys.executable, "-c", "from scheduler.cli import main; main()", *args],
        capture_output=True, text=True, env=env, timeout=timeout_s,
    )


def alive(pid: int) -> bool:
    """Whether a process of this pid exists (ours or not)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def run_script(script: Path, *args: str, env: Mapping[str, str] | None = None, timeout_s: float = 55,
               stop_timeout_s: float = 60) -> tuple[int, str, str]:
    """Run a bench script; if it overruns, SIGTERM it first (it stops what it started and
    cleans up), and kill it only if that does not end it. Exit code, stdout, stderr."""
    process = subprocess.Popen([sys.executable, str(script), *args], stdout=subprocess.PIPE,
                               stderr=subprocess.PIPE, text=True, env=env)
    try:
        stdout, stderr = process.communicate(timeout=timeout_s)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.communicate(timeout=stop_timeout_s)
            except subprocess.TimeoutExpired:
                process.kill()
                process.communicate()
    return process.returncode, stdout, stderr


@contextmanager
def zookeeper_session(hosts: str, tls: TlsFiles | None = None, timeout_s: float = 15) -> Iterator[KazooClient]:
    """A started kazoo client on `hosts` (which may end in a chroot), over TLS with `tls`
    as the scheduler connects (a secure cluster's port speaks nothing else), closed
    afterwards. No identity: add one with `add_auth` where a test needs it."""
    client = KazooClient(hosts=hosts, timeout=10, **tls_options(tls))
    client.start(timeout=timeout_s)
    try:
        yield client
    finally:
        client.stop()
        client.close()


def local_credentials(directory: Path, hosts: Sequence[str]) -> Any:
    """A CA of its own in `directory`, with a server certificate for each of `hosts` and a
    client certificate, made as the secure cluster makes its own: deploy/local's
    `Credentials` (returned, for its paths)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "deploy" / "local"))
    try:
        from credentials import Credentials  # type: ignore[import-not-found]
    finally:
        sys.path.pop(0)
    made = Credentials(directory)
    made.ensure(list(hosts))
    return made
