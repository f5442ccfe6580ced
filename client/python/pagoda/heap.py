"""Keeps freed memory in this process's heap, as pagoda-server and the C++
tools do (pagoda/heap_retention.h).

glibc's malloc gives blocks of 128 KiB and more back to the kernel when they
are freed; a process that builds and drops a call's tensors every call (gRPC's
message buffers, numpy's arrays) then faults their pages in again each call.
Raising glibc's trim and mmap thresholds to 32 MiB keeps them.
"""

from __future__ import annotations

import ctypes
import os

RETAINED_BYTES = 32 << 20
_M_TRIM_THRESHOLD = -1  # malloc.h
_M_MMAP_THRESHOLD = -3


def retain_freed_heap(glibc_tunables: str | None = None) -> bool:
    """Sets glibc's trim and mmap thresholds to RETAINED_BYTES; returns whether
    both were set. A glibc.malloc setting in GLIBC_TUNABLES (or the argument)
    stands instead, and a C library without mallopt is left alone."""
    tunables = os.environ.get("GLIBC_TUNABLES", "") if glibc_tunables is None else glibc_tunables
    if "glibc.malloc." in tunables:
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes = (ctypes.c_int, ctypes.c_int)
    mallopt.restype = ctypes.c_int
    return mallopt(_M_TRIM_THRESHOLD, RETAINED_BYTES) == 1 and mallopt(_M_MMAP_THRESHOLD, RETAINED_BYTES) == 1
