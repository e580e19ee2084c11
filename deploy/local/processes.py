"""Linux process and port facts for cluster.py, read from /proc and the socket API.

Owns no state. Every function is best effort and never raises for a process that
has gone: a vanished pid reads as an empty cmdline, no RSS, no pidfd.

Signals go through a pidfd (``os.pidfd_open``) opened *before* the process is
checked: if the pid is recycled after the check, the pidfd still names the old,
exited process and the signal fails instead of hitting a stranger.
"""
from __future__ import annotations

import os
import re
import select
import socket
from collections.abc import Iterable
from pathlib import Path

LISTEN = "0A"  # TCP state code in /proc/net/tcp


def cmdline(pid: int) -> list[str]:
    """The argv of ``pid``; empty if it is gone or a zombie."""
    try:
        raw = Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return []
    return raw.decode(errors="replace").split("\0")[:-1]


def rss_mb(pid: int) -> float | None:
    """Resident memory (VmRSS) of ``pid`` in MB, one decimal."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    match = re.search(r"^VmRSS:\s+(\d+) kB", status, re.MULTILINE)
    return round(int(match.group(1)) / 1024, 1) if match else None


def open_pidfd(pid: int) -> int | None:
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def exited(pidfds: Iterable[int], timeout_s: float) -> list[int]:
    """Those of ``pidfds`` whose process has exited (a pidfd turns readable then),
    waiting up to ``timeout_s`` for at least one."""
    readable, _, _ = select.select(list(pidfds), [], [], max(timeout_s, 0.0))
    return readable


def port_is_free(host: str, port: int) -> bool:
    """Whether a server could listen on ``host:port`` now."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family) as sock:
        # As the servers do: only a listener makes the port busy, not a TIME_WAIT leftover.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind((host, port))
        except OSError:
            return False
    return True


def port_holder(port: int) -> str:
    """'pid N (command line)' of the process listening on ``port``, else 'another process'."""
    sockets = _listening_socket_inodes(port)
    for fd_dir in Path("/proc").glob("[0-9]*/fd"):
        try:
            if any(os.readlink(fd) in sockets for fd in fd_dir.iterdir()):
                pid = int(fd_dir.parent.name)
                return f"pid {pid} ({' '.join(cmdline(pid))[:100]})"
        except OSError:  # gone, or not ours to read
            continue
    return "another process"


def _listening_socket_inodes(port: int) -> set[str]:
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            rows = Path(table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            local_port = int(fields[1].rsplit(":", 1)[1], 16)
            if local_port == port and fields[3] == LISTEN:
                inodes.add(f"socket:[{fields[9]}]")
    return inodes
