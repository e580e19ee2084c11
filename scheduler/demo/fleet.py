"""The demo's processes: `scheduler dispatcher` and `scheduler worker`, each a real
process (so kill -9 is real), with its log and stats file in the demo's directory."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

STOP_TIMEOUT_S = 20.0


def _die_with_parent() -> None:
    """In the child, before exec: on Linux, ask for SIGTERM when the demo's process ends,
    however it ends, so no dispatcher or worker outlives a demo that was killed."""
    if sys.platform.startswith("linux"):
        import ctypes

        PR_SET_PDEATHSIG = 1
        ctypes.CDLL(None, use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


@dataclass
class Member:
    name: str
    kind: str
    process: subprocess.Popen[bytes]
    log_path: Path
    stats_path: Path
    log_file: IO[bytes]
    killed_at_ms: int | None = None

    def stats(self) -> dict[str, Any]:
        try:
            document: dict[str, Any] = json.loads(self.stats_path.read_text())
        except (OSError, json.JSONDecodeError):
            return {}
        return document

    def shards(self) -> list[int]:
        return list(self.stats().get("shards", [])) if self.alive() else []

    def alive(self) -> bool:
        return self.process.poll() is None

    def kill(self, at_ms: int) -> None:
        """kill -9: no goodbye, no hand-back; what it held must be taken over."""
        self.killed_at_ms = at_ms
        self.process.send_signal(signal.SIGKILL)
        self.process.wait()

    def log_tail(self, lines: int = 15) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError:
            return ""


@dataclass
class Fleet:
    directory: Path
    backend_args: Sequence[str]
    env: Mapping[str, str]
    members: list[Member] = field(default_factory=list)

    def _start(self, name: str, kind: str, arguments: list[str]) -> Member:
        log_path = self.directory / f"{name}.log"
        stats_path = self.directory / f"{name}.json"
        log_file = log_path.open("ab")
        process = subprocess.Popen(
            [sys.executable, "-m", "scheduler", kind, *arguments, *self.backend_args, "--member", name,
             "--stats-file", str(stats_path)],
            stdout=log_file, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, env={**os.environ, **self.env},
            preexec_fn=_die_with_parent,
        )
        member = Member(name, kind, process, log_path, stats_path, log_file)
        self.members.append(member)
        return member

    def dispatcher(self, name: str, lease_timeout_s: float) -> Member:
        return self._start(name, "dispatcher", ["--shards", "auto", "--lease-timeout", str(lease_timeout_s)])

    def worker(self, name: str, app: str, concurrency: int, session_timeout_s: float) -> Member:
        return self._start(name, "worker", ["--app", app, "--concurrency", str(concurrency),
                                            "--session-timeout", str(session_timeout_s), "--drain-timeout", "10"])

    def of_kind(self, kind: str) -> list[Member]:
        return [member for member in self.members if member.kind == kind]

    def died(self) -> Member | None:
        """A member that exited without being killed by the demo."""
        return next((m for m in self.members if not m.alive() and m.killed_at_ms is None), None)

    def stop(self) -> dict[str, int | None]:
        """SIGTERM every live member (workers first, so they drain while dispatchers still
        run), wait, kill what outlives the timeout; the exit codes."""
        ordered = self.of_kind("worker") + self.of_kind("dispatcher")
        for member in ordered:
            if member.alive():
                member.process.send_signal(signal.SIGTERM)
        deadline = time.monotonic() + STOP_TIMEOUT_S
        codes: dict[str, int | None] = {}
        for member in ordered:
            try:
                codes[member.name] = member.process.wait(max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                member.process.kill()
                codes[member.name] = member.process.wait()
            member.log_file.close()
        return codes
