"""Give freed heap memory back to the operating system once a tokenizer is built.

Building the compact tables frees tens of MB of temporaries (the spec's lists, numpy scratch
arrays). glibc keeps such memory in its heap -- after a large free it even raises its own
threshold for trimming -- so the process's RSS, which a memory budget is measured by, would
keep counting memory nothing uses. `malloc_trim(0)` hands the free pages back. With another C
library (musl, bionic, macOS) there is no such call and nothing is done.
"""

from __future__ import annotations

import ctypes
import sys
from collections.abc import Callable


def _find_malloc_trim() -> Callable[[int], int] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        trim = ctypes.CDLL(None).malloc_trim
    except (OSError, AttributeError):
        return None
    trim.argtypes = [ctypes.c_size_t]
    trim.restype = ctypes.c_int
    return trim


# Looked up at import, not at the first build: objects made while a model's metadata is alive
# would sit among its objects and keep their memory pages from being freed.
_MALLOC_TRIM = _find_malloc_trim()


def release_free_heap() -> None:
    """Return the C heap's free pages to the OS (glibc only; a fast no-op elsewhere)."""
    if _MALLOC_TRIM is not None:
        _MALLOC_TRIM(0)
