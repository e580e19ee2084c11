"""The chaos bench's network cut, on this machine's kernel: a process started in a cut
group stops reaching a port once the group is cut (its packets are dropped, so a
connect times out rather than being refused), while a process outside the group still
reaches it; restored, the group's process reaches it again."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator

import pytest

from bench.faults import netcut

MISSING = netcut.available()
pytestmark = pytest.mark.skipif(MISSING is not None and not os.environ.get("CI"), reason=str(MISSING))

CONNECT = """
import socket, sys
try:
    socket.create_connection(("127.0.0.1", int(sys.argv[1])), timeout=1.5).close()
    print("connected")
except OSError as error:
    print(type(error).__name__)
"""


@pytest.fixture
def listener() -> Iterator[int]:
    with socket.create_server(("127.0.0.1", 0)) as server:
        server.listen(16)
        yield server.getsockname()[1]


def attempt(port: int, group: netcut.CutGroup | None) -> str:
    done = subprocess.run([sys.executable, "-c", CONNECT, str(port)], capture_output=True, text=True, timeout=30,
                          preexec_fn=group.enter if group else None)
    return done.stdout.strip()


def test_a_cut_group_loses_the_port_and_gets_it_back_while_others_keep_it(listener: int) -> None:
    assert MISSING is None, MISSING
    group = netcut.CutGroup("test")
    try:
        assert attempt(listener, group) == "connected"
        group.cut([listener])
        assert attempt(listener, group) in ("TimeoutError", "timeout"), "dropped, not refused"
        assert attempt(listener, None) == "connected", "a process outside the group is not cut"
        assert group.dropped() > 0, "the rule counted the packets it dropped"
        group.restore()
        assert attempt(listener, group) == "connected"
    finally:
        group.remove()
    assert not group.path.exists()
