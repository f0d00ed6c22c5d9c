"""Opt-in: keep the memory a run frees for the next run (glibc's allocator, process-wide).

Every run allocates its activations and buffers afresh (numpy arrays), the same sizes each
time, and frees them as their last reader is done. glibc gives the top of its heap back to the
system once more than its trim threshold is free there (128 KiB at first, then twice the
largest mapped block freed so far, at most 64 MiB), and serves blocks above its mmap threshold
with fresh mappings: a run that
frees tens of MiB returns them, and the next run touches new pages, one page fault per 4 KiB
(tests/test_memory.py: 3433 faults per run for 32 MiB of buffers). On one thread this costs
SqueezeNet 1.75x its time here (29-31 ms against 17 ms; docs/real-models.md).
Setting both thresholds, as ``MALLOC_MMAP_THRESHOLD_`` and ``MALLOC_TRIM_THRESHOLD_`` in the
environment do, keeps the freed memory in the process for the next run.

This changes the whole process's allocator and keeps up to ``trim_bytes`` of freed memory,
so the library never does it by itself: a deployment calls :func:`hold_freed_memory` once
(or sets the environment variables).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import platform

__all__ = ["MAX_MMAP_THRESHOLD", "hold_freed_memory"]

# mallopt parameters (malloc.h)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
MAX_MMAP_THRESHOLD = 32 << 20  # glibc's largest mmap threshold on 64-bit systems


def hold_freed_memory(trim_bytes: int = 256 << 20) -> bool:
    """Make glibc serve blocks under 32 MiB from its heap and keep up to ``trim_bytes`` of
    freed memory at its top, for the whole process. Returns False, changing nothing, where
    the C library is not glibc (macOS, Windows, musl)."""
    if isinstance(trim_bytes, bool) or not isinstance(trim_bytes, int) or trim_bytes < 0:
        raise ValueError(f"trim_bytes must be an int >= 0, got {trim_bytes!r}")
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
    mallopt = libc.mallopt
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    trim = min(trim_bytes, 2**31 - 1)  # mallopt takes an int
    return bool(mallopt(_M_MMAP_THRESHOLD, MAX_MMAP_THRESHOLD) and mallopt(_M_TRIM_THRESHOLD, trim))
