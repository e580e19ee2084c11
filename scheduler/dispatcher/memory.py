"""Keeping a dispatcher's resident memory close to what its wheels hold.

Loading a minute creates many short-lived objects (rows, tasks, messages in flight) on
several reader threads. glibc gives each thread its own malloc arena and keeps freed
memory for reuse, so after a load the process stays at its high-water mark although
the wheels hold far less. Two glibc calls fix most of it: fewer arenas, set before the
threads start, and `malloc_trim` after each load, which hands freed pages back to the
system. Elsewhere (musl, macOS) both are no-ops.

What trimming cannot hand back is a page, or one of Python's 1 MiB small-object arenas,
that a long-lived object still touches. So the rest is kept small at the source: reads
ahead go two at a time in 500-row pages (`reading`), so a load's transient objects fill
few arenas, and the wheels keep their entries in large exact-size chunks made outside
them (`scheduler.wheel`). What RSS still grows by beyond the wheels is measured by
`bench/nine_oclock.py` (bench/README.md).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging

log = logging.getLogger(__name__)

_M_ARENA_MAX = -8  # from glibc's malloc.h

_libc: ctypes.CDLL | None
try:
    _name = ctypes.util.find_library("c")
    _libc = ctypes.CDLL(_name) if _name else None
    if _libc is not None and not hasattr(_libc, "malloc_trim"):
        _libc = None
except OSError:
    _libc = None


def limit_arenas(arenas: int = 2) -> bool:
    """Cap glibc's malloc arenas; call before starting threads. True if it applied."""
    if _libc is None:
        return False
    return bool(_libc.mallopt(_M_ARENA_MAX, arenas))


def trim() -> bool:
    """Return freed heap pages to the system. True if any were returned."""
    if _libc is None:
        return False
    return bool(_libc.malloc_trim(0))
