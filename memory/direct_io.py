"""Reading weights with direct I/O (O_DIRECT): the bytes go from flash into this process's own
memory without passing through the page cache, which a memory budget would otherwise have to
count. Destinations and offsets are aligned to the device's block size (ALIGN)."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import numpy as np
from edgeflash.base.errors import ModelFormatError
from edgeflash.memory.layout import ALIGN


def aligned_empty(nbytes: int) -> np.ndarray:
    """uint8 buffer whose first byte is ALIGN-aligned (direct I/O destinations must be)."""
    raw = np.empty(nbytes + ALIGN, dtype=np.uint8)
    skip = (-raw.ctypes.data) % ALIGN
    return raw[skip:skip + nbytes]


def open_direct(path: str | Path) -> tuple[int, bool]:
    """A read-only descriptor with O_DIRECT when the file system allows it (tmpfs does not)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags), False


def read_range(fd: int, path: str | Path, offset: int, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
    """Read [offset, offset + nbytes); an aligned range may run past the end of the file, whose
    missing tail reads as zeros."""
    buf = aligned_empty(nbytes) if out is None else out[:nbytes]
    view = memoryview(buf)
    size = os.fstat(fd).st_size
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0 and offset + done >= size:
            buf[done:] = 0
            break
        if got == 0:
            raise ModelFormatError(f"{path}: the file ends at byte {offset + done}, {offset + nbytes} expected "
                                   "(truncated?)")
        done += got
    return buf
