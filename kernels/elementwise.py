"""RMSNorm, RoPE, gated activations, softmax, argmax and top-k."""

from __future__ import annotations

import numpy as np

from . import _native
from ._arrays import array, out_array, positive_int, writable
from .ffn import ACTIVATIONS


def _rows(name: str, x: object) -> tuple[np.ndarray, int, int]:
    x = array(name, x, np.float32, (1, 2))
    n, d = (1, x.shape[0]) if x.ndim == 1 else x.shape
    if n == 0 or d == 0:
        raise ValueError(f"{name} must not be empty, got shape {x.shape}")
    return x, n, d


def rms_norm(x: np.ndarray, weight: np.ndarray, eps: float, out: np.ndarray | None = None) -> np.ndarray:
    """y = x / sqrt(mean(x^2) + eps) * weight over the last axis (weight as stored: families that
    scale by 1 + w fold the 1 in first). out may be x itself."""
    x, n, d = _rows("x", x)
    w = array("weight", weight, np.float32, 1)
    if w.shape != (d,):
        raise ValueError(f"weight must have shape ({d},), got {w.shape}")
    if not eps >= 0:
        raise ValueError(f"eps must be >= 0, got {eps}")
    out = x if out is x else out_array("out", out, x.shape, inputs=(("weight", w),))
    _native.rms_norm(x, w, out, n, d, float(eps))
    return out


def rope(x: np.ndarray, positions: object, *, rot_dim: int, theta_base: float, freq_factors: np.ndarray | None = None,
         scale: float = 1.0) -> np.ndarray:
    """Rotate-half (NeoX) RoPE in place on x [n, n_heads, head_dim] float32 and returns x.

    Only the first rot_dim dims of each head rotate. Frequency i is theta_base^(-2i/rot_dim),
    divided by freq_factors[i] when given (Llama 3 rope_freqs); positions are divided by
    `scale` (linear scaling).
    """
    x = writable("x", array("x", x, np.float32, 3))
    n, heads, hd = x.shape
    rot_dim = positive_int("rot_dim", rot_dim)
    if rot_dim % 2 or rot_dim > hd:
        raise ValueError(f"rot_dim must be even and at most head_dim {hd}, got {rot_dim}")
    if not theta_base > 0 or not scale > 0:
        raise ValueError(f"theta_base and scale must be positive, got {theta_base} and {scale}")
    pos = np.asarray(positions)
    if pos.shape != (n,) or not np.issubdtype(pos.dtype, np.integer):
        raise ValueError(f"positions must be {n} integers, got {pos.dtype} {pos.shape}")
    ff = None
    if freq_factors is not None:
        ff = array("freq_factors", freq_factors, np.float32, 1)
        if ff.shape != (rot_dim // 2,):
            raise ValueError(f"freq_factors must have shape ({rot_dim // 2},), got {ff.shape}")
        if not (ff > 0).all():
            raise ValueError("freq_factors must all be positive")
    _native.rope(x, n, heads, hd, np.ascontiguousarray(pos, dtype=np.int32), rot_dim, float(theta_base), ff, float(scale))
    return x


def gated_act(gate: np.ndarray, up: np.ndarray, act: str = "silu", out: np.ndarray | None = None) -> np.ndarray:
    """act(gate) * up elementwise; act is 'silu' or 'gelu_tanh'. out may be gate or up."""
    if act not in ACTIVATIONS:
        raise ValueError(f"act must be one of {', '.join(ACTIVATIONS)}, got {act!r}")
    g = array("gate", gate, np.float32)
    u = array("up", up, np.float32)
    if g.shape != u.shape or g.size == 0:
        raise ValueError(f"gate and up must have the same non-empty shape, got {g.shape} and {u.shape}")
    out = out if out is g or out is u else out_array("out", out, g.shape)
    _native.gated_act(g, u, out, g.size, act)
    return out


def softmax(x: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """Softmax over the last axis of x [n, d] or [d]; out may be x."""
    x, n, d = _rows("x", x)
    out = x if out is x else out_array("out", out, x.shape)
    _native.softmax(x, out, n, d)
    return out


def argmax(x: np.ndarray) -> np.ndarray | int:
    """Index of the largest value of each row (first on ties): [n, d] -> int32 [n]; [d] -> int."""
    x2, n, d = _rows("x", x)
    out = np.empty(n, dtype=np.int32)
    _native.argmax(x2, n, d, out)
    return int(out[0]) if x2.ndim == 1 else out


def topk(x: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """The k largest values per row, descending (lower index first on ties): (values, int32 indices),
    each [n, k] for x [n, d] or [k] for x [d]."""
    x2, n, d = _rows("x", x)
    k = positive_int("k", k)
    if k > d:
        raise ValueError(f"k must be at most the row length {d}, got {k}")
    values = np.empty((n, k), dtype=np.float32)
    indices = np.empty((n, k), dtype=np.int32)
    _native.topk(x2, n, d, k, values, indices)
    return (values[0], indices[0]) if x2.ndim == 1 else (values, indices)
