"""Cutting one process off from one server, in the kernel.

A `CutGroup` is a cgroup (v2) of its own that a process is started in (`enter`, as
its `preexec_fn`): every socket the process opens belongs to that cgroup. `cut(ports)`
adds an iptables rule that drops each packet such a socket sends to those TCP ports;
`restore` removes it. The process sees what a network partition looks like: its open
connections go silent (nothing arrives, nothing is refused) and new ones time out,
while every other process, and its own traffic to other ports, goes on.

Why not a TCP proxy in front of the server: the Cassandra driver learns every node's
address from the cluster itself (`system.peers`) and connects to each directly, so a
proxy in front of the contact point cuts one connection of many. The same holds for a
ZooKeeper ensemble, whose client connects to any member.

Needs root, iptables with the `cgroup` match, and a cgroup2 hierarchy (`available`
says what is missing). A socket belongs to the cgroup of the process that opened it,
so the process must be started in the group: moving it there later would leave its
open connections uncut."""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path


def cgroup2_root() -> Path | None:
    try:
        mounts = Path("/proc/mounts").read_text().splitlines()
    except OSError:
        return None
    for line in mounts:
        fields = line.split()
        if len(fields) >= 3 and fields[2] == "cgroup2":
            return Path(fields[1])
    return None


def available() -> str | None:
    """None if cuts can be made here, else what is missing."""
    if os.geteuid() != 0:
        return "cutting a process off needs root (iptables and cgroups)"
    if shutil.which("iptables") is None:
        return "iptables is not installed (Debian: apt-get install iptables)"
    if cgroup2_root() is None:
        return "no cgroup2 hierarchy is mounted"
    return None


class CutGroup:
    """A cgroup for one process, and the iptables rules that cut it off."""

    def __init__(self, label: str) -> None:
        root = cgroup2_root()
        if root is None:
            raise RuntimeError("no cgroup2 hierarchy is mounted")
        self.root = root
        self.name = f"scheduler-chaos-{label}-{uuid.uuid4().hex[:8]}"
        self.path = root / self.name
        self.path.mkdir()
        self.rules: list[list[str]] = []

    def enter(self) -> None:
        """Move the calling process into the group (run in the child, before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def rule(self, port: int) -> list[str]:
        return ["OUTPUT", "-p", "tcp", "--dport", str(port), "-m", "cgroup", "--path", self.name, "-j", "DROP"]

    def cut(self, ports: list[int]) -> None:
        for port in ports:
            rule = self.rule(port)
            subprocess.run(["iptables", "-w", "-I", *rule], check=True, capture_output=True)
            self.rules.append(rule)

    def dropped(self) -> int:
        """Packets the group's rules have dropped so far: 0 means the cut cut nothing."""
        listing = subprocess.run(["iptables", "-w", "-L", "OUTPUT", "-v", "-x", "-n"], check=True,
                                 capture_output=True, text=True).stdout
        return sum(int(line.split()[0]) for line in listing.splitlines() if f"cgroup {self.name}" in line)

    def restore(self) -> None:
        """Remove every rule; a rule that cannot be removed is an error, never left silently."""
        while self.rules:
            rule = self.rules[-1]
            subprocess.run(["iptables", "-w", "-D", *rule], check=False, capture_output=True)
            if subprocess.run(["iptables", "-w", "-C", *rule], capture_output=True).returncode == 0:
                raise RuntimeError(f"could not remove the iptables rule {' '.join(rule)}: remove it by hand "
                                   f"(iptables -D {' '.join(rule)})")
            self.rules.pop()

    def remove(self) -> None:
        """Restore, move what is left in the group to the root, and delete the group."""
        self.restore()
        try:
            for pid in (self.path / "cgroup.procs").read_text().split():
                (self.root / "cgroup.procs").write_text(pid)
            self.path.rmdir()
        except FileNotFoundError:
            pass
