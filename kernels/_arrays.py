"""Argument checks shared by the kernel wrappers: one clear sentence per problem.

Wrong dtypes raise TypeError; wrong shapes, layouts, alignment or values raise ValueError.
Nothing is converted silently: a float64 array passed where float32 is expected is an error,
not a hidden copy on every call.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np


def array(name: str, a: object, dtype: type, ndim: Sequence[int] | int | None = None) -> np.ndarray:
    """`a` as an ndarray of exactly `dtype`, C-contiguous and aligned, with an allowed ndim.

    Called on every kernel entry, so the common (valid) path uses only cheap attribute checks.
    """
    if not isinstance(a, np.ndarray):
        raise TypeError(f"{name} must be a numpy array of {np.dtype(dtype).name}, got {type(a).__name__}")
    if a.dtype.type is not dtype:
        raise TypeError(f"{name} must have dtype {np.dtype(dtype).name}, got {a.dtype}")
    if ndim is not None and a.ndim != ndim and (isinstance(ndim, int) or a.ndim not in ndim):
        allowed = (ndim,) if isinstance(ndim, int) else tuple(ndim)
        want = " or ".join(f"{d}-D" for d in allowed)
        raise ValueError(f"{name} must be {want}, got shape {a.shape}")
    flags = a.flags
    if not flags.c_contiguous:
        raise ValueError(f"{name} must be C-contiguous (use np.ascontiguousarray), got strides {a.strides}")
    if not flags.aligned:
        raise ValueError(f"{name} is not aligned to {a.dtype.itemsize} bytes (address {a.ctypes.data:#x})")
    return a


def writable(name: str, a: np.ndarray) -> np.ndarray:
    if not a.flags.writeable:
        raise ValueError(f"{name} is read-only")
    return a


def out_array(name: str, out: object, shape: tuple[int, ...], dtype: type = np.float32,
              inputs: Sequence[tuple[str, np.ndarray]] = ()) -> np.ndarray:
    """A caller's output buffer checked against the expected shape, or a new one."""
    if out is None:
        return np.empty(shape, dtype=dtype)
    out = writable(name, array(name, out, dtype))
    if out.shape != tuple(shape):
        raise ValueError(f"{name} must have shape {tuple(shape)}, got {out.shape}")
    for in_name, a in inputs:
        if np.may_share_memory(out, a):
            raise ValueError(f"{name} overlaps {in_name}; pass a separate output buffer")
    return out


def positive_int(name: str, v: object) -> int:
    if isinstance(v, bool) or not isinstance(v, (int, np.integer)):
        raise TypeError(f"{name} must be an int, got {type(v).__name__}")
    if v <= 0:
        raise ValueError(f"{name} must be positive, got {v}")
    return int(v)


def index_array(name: str, a: object, limit: int) -> np.ndarray:
    """int32 indices in [0, limit); a list or any integer array is accepted and converted."""
    if isinstance(a, (list, tuple)):
        a = np.asarray(a) if len(a) else np.zeros(0, dtype=np.int32)
    if not isinstance(a, np.ndarray) or not np.issubdtype(a.dtype, np.integer):
        raise TypeError(f"{name} must be an integer array, got {getattr(a, 'dtype', type(a).__name__)}")
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D, got shape {a.shape}")
    if a.size and (a.min() < 0 or a.max() >= limit):
        bad = int(a[(a < 0) | (a >= limit)][0])
        raise ValueError(f"{name} contains {bad}, outside [0, {limit})")
    return np.ascontiguousarray(a, dtype=np.int32)
