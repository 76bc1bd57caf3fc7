"""The C heap under a memory budget. RSS is what the budget is measured by, so freed memory must
go back to the operating system instead of sitting in the allocator.

glibc raises its mmap threshold after large frees (up to 32 MiB), after which big temporaries such
as a step's logits live in the heap and stay resident when freed. `keep_large_allocations_mapped`
pins the threshold, so any block of 256 KiB or more is its own mapping and is unmapped when freed;
`release_free_heap` hands the heap's free pages back (both no-ops outside glibc).
"""

from __future__ import annotations

import ctypes
import sys

_M_MMAP_THRESHOLD = -3  # mallopt parameter numbers from glibc's malloc.h
MMAP_THRESHOLD = 256 * 1024


def _libc():
    if not sys.platform.startswith("linux"):
        return None
    try:
        lib = ctypes.CDLL(None)
        lib.malloc_trim.argtypes = [ctypes.c_size_t]
        lib.mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
        return lib
    except (OSError, AttributeError):
        return None


_LIBC = _libc()


def release_free_heap() -> None:
    """Return the C heap's free pages to the OS (glibc only; a fast no-op elsewhere)."""
    if _LIBC is not None:
        _LIBC.malloc_trim(0)


def keep_large_allocations_mapped() -> None:
    if _LIBC is not None:
        _LIBC.mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)
