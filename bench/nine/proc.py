"""CPU and memory of processes, read from /proc: a process's RSS and CPU seconds, the
machine's busy CPU seconds, the PIDs of the Cassandra, Kafka and ZooKeeper running on
this machine, and the CPU each used over a window. A process that is gone, or never
ran here, reads as None or is left out; nothing here raises for it."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

TICKS_PER_S = os.sysconf("SC_CLK_TCK")


def rss_bytes(pid: int) -> int | None:
    try:
        for line in Path(f"/proc/{pid}/status").read_text().splitlines():
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def cpu_seconds(pid: int) -> float | None:
    """User plus system CPU time of process `pid`, all its threads."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return (int(fields[11]) + int(fields[12])) / TICKS_PER_S


def machine_busy_seconds() -> float:
    """CPU seconds all cores spent not idle since boot."""
    values = [int(v) for v in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    return (sum(values[:8]) - values[3] - values[4]) / TICKS_PER_S


SERVER_MARKERS = {"cassandra": "org.apache.cassandra.service.CassandraDaemon", "kafka": "kafka.Kafka",
                  "zookeeper": "org.apache.zookeeper.server.quorum.QuorumPeerMain"}


def server_pids() -> dict[str, int]:
    """PIDs of the Cassandra, Kafka and ZooKeeper JVMs on this machine, if they run here."""
    found: dict[str, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            arguments = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        for name, marker in SERVER_MARKERS.items():
            if marker.encode() in arguments and name not in found:
                found[name] = int(entry.name)
    return found


def cpu_snapshot(pids: dict[str, int]) -> dict[str, float]:
    snapshot = {name: cpu for name, pid in pids.items() if (cpu := cpu_seconds(pid)) is not None}
    snapshot["machine"] = machine_busy_seconds()
    return snapshot


def cpu_window(before: dict[str, float], after: dict[str, float], seconds: float) -> dict[str, Any]:
    """CPU seconds each process used between two snapshots, and cores' worth of it."""
    used = {name: round(after[name] - before[name], 2) for name in before if name in after}
    return {"seconds": round(seconds, 2), "cpu_s": used,
            "cores": {name: round(cpu / seconds, 2) for name, cpu in used.items()} if seconds > 0 else {}}
