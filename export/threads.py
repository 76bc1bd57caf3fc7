"""Thread pools during an export: numpy's BLAS and torch kept out of each other's way.

An export mixes numpy and torch, and each brings a thread pool (numpy: OpenBLAS; torch: OpenMP)
whose idle workers spin for a while after every call. On a 2-core machine that is also running
other work, measured here: a loop of [64, 576] x [576, 1536] numpy matmuls each followed by a
torch SiLU ran 11.3 s with both pools at 2 threads and 0.4 s single-threaded; a small QR
factorization took 216 ms with 2 BLAS threads and 0.2 ms with one. So the export runs torch's
elementwise and attention ops on one thread and numpy's BLAS on one thread, and raises BLAS to
`threads` only around matrix products large enough to be worth waking a second core for.
"""

from __future__ import annotations

import ctypes
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import lru_cache

_SETTERS = ("scipy_openblas_set_num_threads64_", "scipy_openblas_set_num_threads", "openblas_set_num_threads64_",
            "openblas_set_num_threads")
_GETTERS = ("scipy_openblas_get_num_threads64_", "scipy_openblas_get_num_threads", "openblas_get_num_threads64_",
            "openblas_get_num_threads")
LARGE_PRODUCT_MACS = 1 << 27  # multiply-adds above which a product uses every allowed thread


@lru_cache(maxsize=1)
def _blas_controls() -> tuple[Callable[[int], None], Callable[[], int]] | None:
    """(set, get) for the OpenBLAS numpy loaded (found in this process's memory map), or None."""
    import numpy  # noqa: F401  (its BLAS must be loaded before we look for it)

    try:
        with open("/proc/self/maps", encoding="utf-8") as f:
            paths = sorted({m.group(0) for m in re.finditer(r"/\S*openblas\S*\.so[\w.]*", f.read())})
    except OSError:
        return None
    for path in paths:
        try:
            lib = ctypes.CDLL(path)
        except OSError:
            continue
        setter = next((getattr(lib, n) for n in _SETTERS if hasattr(lib, n)), None)
        getter = next((getattr(lib, n) for n in _GETTERS if hasattr(lib, n)), None)
        if setter is not None and getter is not None:
            getter.restype = ctypes.c_int
            return _bind(setter, getter)
    return None


def _bind(setter, getter) -> tuple[Callable[[int], None], Callable[[], int]]:
    return (lambda n: setter(ctypes.c_int(n))), (lambda: int(getter()))


@contextmanager
def blas_threads(n: int) -> Iterator[None]:
    """Run the block with numpy's OpenBLAS limited to `n` threads (a no-op if it is not found)."""
    controls = _blas_controls()
    if controls is None:
        yield
        return
    set_threads, get_threads = controls
    before = get_threads()
    set_threads(n)
    try:
        yield
    finally:
        set_threads(before)


@contextmanager
def export_threads() -> Iterator[None]:
    """One thread for torch and for numpy's BLAS during the block: the layerwise runner parallelizes
    over windows with worker threads instead (their spinning pools cost more than they gave)."""
    import torch

    torch_before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        with blas_threads(1):
            yield
    finally:
        torch.set_num_threads(torch_before)
