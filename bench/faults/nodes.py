"""The three-node local cluster as the chaos bench drives it: through
`deploy/local/cluster.py --nodes 3`, the same commands an operator types (`status`,
`kill`, `start --only NODE`), and SIGSTOP/SIGCONT to a node's pid for a pause.

Fails with `BenchFailure` quoting the command's output when a command fails, so a node
that does not come back stops the run instead of skewing its figures."""

from __future__ import annotations

import json
import os
import shlex
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.nine.common import BenchFailure

REPOSITORY = Path(__file__).resolve().parents[2]
CLUSTER_SCRIPT = REPOSITORY / "deploy" / "local" / "cluster.py"
START_TIMEOUT_S = 300


@dataclass(frozen=True)
class Nodes:
    """The nodes of a local cluster of `count` nodes of each server."""

    count: int = 3
    cluster_dir: Path | None = None

    def command(self, *arguments: str) -> list[str]:
        extra = ["--cluster-dir", str(self.cluster_dir)] if self.cluster_dir else []
        return [sys.executable, str(CLUSTER_SCRIPT), arguments[0], "--nodes", str(self.count), *extra,
                *arguments[1:]]

    def run(self, *arguments: str, timeout_s: float = START_TIMEOUT_S, check: bool = True) -> str:
        done = subprocess.run(self.command(*arguments), capture_output=True, text=True, timeout=timeout_s,
                              stdin=subprocess.DEVNULL)
        if check and done.returncode != 0:
            raise BenchFailure(f"`cluster.py {' '.join(arguments)}` failed (exit {done.returncode}):\n"
                               f"{done.stdout}{done.stderr}")
        return done.stdout

    def status(self) -> dict[str, dict[str, Any]]:
        text = self.run("status", "--json", check=False)
        try:
            found: dict[str, dict[str, Any]] = json.loads(text)
        except json.JSONDecodeError as exc:
            raise BenchFailure(f"`cluster.py status --json` printed no JSON: {text[:500]}") from exc
        return found

    def all_up(self) -> bool:
        return all(node["state"] == "up" for node in self.status().values())

    def env(self) -> dict[str, str]:
        """The SCHEDULER_* variables that point the scheduler at the cluster (`cluster.py env`)."""
        variables: dict[str, str] = {}
        for line in self.run("env").splitlines():
            words = shlex.split(line)
            if len(words) == 2 and words[0] == "export" and "=" in words[1]:
                name, value = words[1].split("=", 1)
                variables[name] = value
        return variables

    def pid(self, name: str) -> int:
        node = self.status().get(name)
        if not node or not node.get("pid"):
            raise BenchFailure(f"{name} is not running")
        return int(node["pid"])

    def kill(self, name: str) -> None:
        said = self.run("kill", "--only", name)
        if f"{name}: killed" not in said:
            raise BenchFailure(f"`cluster.py kill --only {name}` killed nothing: {said.strip()}")

    def start(self, name: str) -> float:
        """Start `name` again on its data and wait until it answers; the seconds it took."""
        began = time.monotonic()
        self.run("start", "--only", name)
        return time.monotonic() - began

    def pause(self, name: str) -> int:
        pid = self.pid(name)
        os.kill(pid, signal.SIGSTOP)
        return pid

    def resume(self, pid: int) -> None:
        os.kill(pid, signal.SIGCONT)

    def zookeeper_leader(self) -> str:
        leaders = [name for name, node in self.status().items()
                   if node["kind"] == "zookeeper" and node.get("role") == "leader"]
        if len(leaders) != 1:
            raise BenchFailure(f"the ZooKeeper ensemble has {len(leaders)} leaders by `status`, not 1")
        return leaders[0]

    def node_of(self, kind: str, number: int) -> str:
        return f"{kind}-{number}" if self.count > 1 else kind
