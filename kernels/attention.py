"""Decode / verify attention over a slot-addressed KV cache, and the KV write helper.

A cache for one layer is two arrays, K and V, each [n_kv_heads, capacity, head_dim] float16
(format f16) or [n_kv_heads, capacity, kv_row_bytes('q8_0', head_dim)] uint8 (format q8_0:
head_dim/32 GGML q8_0 blocks per vector), plus slot_pos int32 [capacity]: the position held by
each slot, -1 when empty. Slots need not be in position order, so a sliding-window layer can
keep a ring buffer of `window` slots.
"""

from __future__ import annotations

import numpy as np

from . import _native
from ._arrays import array, index_array, out_array, writable
from .formats import kv_row_bytes


def new_kv_cache(n_kv_heads: int, capacity: int, head_dim: int, fmt: str = "f16") -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Empty (k, v, slot_pos) for one layer."""
    rb = kv_row_bytes(fmt, head_dim)
    if fmt == "f16":
        k = np.zeros((n_kv_heads, capacity, head_dim), dtype=np.float16)
    else:
        k = np.zeros((n_kv_heads, capacity, rb), dtype=np.uint8)
    return k, np.zeros_like(k), np.full(capacity, -1, dtype=np.int32)


def _cache(k_cache: object, v_cache: object, slot_pos: object, head_dim: int) -> tuple[str, int, int, np.ndarray, np.ndarray, np.ndarray]:
    if not isinstance(k_cache, np.ndarray):
        raise TypeError(f"k_cache must be a numpy array, got {type(k_cache).__name__}")
    if k_cache.dtype == np.float16:
        fmt = "f16"
    elif k_cache.dtype == np.uint8:
        fmt = "q8_0"
    else:
        raise TypeError(f"k_cache must be float16 (f16 cache) or uint8 (q8_0 cache), got {k_cache.dtype}")
    k = writable("k_cache", array("k_cache", k_cache, k_cache.dtype.type, 3))
    v = writable("v_cache", array("v_cache", v_cache, k_cache.dtype.type, 3))
    if v.shape != k.shape:
        raise ValueError(f"v_cache has shape {v.shape}, k_cache has {k.shape}")
    n_kv, cap, last = k.shape
    rb = kv_row_bytes(fmt, head_dim)  # also checks head_dim
    want = head_dim if fmt == "f16" else rb
    if last != want:
        raise ValueError(f"a {fmt} cache for head_dim {head_dim} needs a last dimension of {want}, got {last}")
    sp = writable("slot_pos", array("slot_pos", slot_pos, np.int32, 1))
    if sp.shape != (cap,):
        raise ValueError(f"slot_pos must have shape ({cap},) to match the cache capacity, got {sp.shape}")
    return fmt, n_kv, cap, k, v, sp


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_pos: np.ndarray, q_pos: object, *,
              scale: float, window: int = 0, mask: np.ndarray | None = None, softcap: float = 0.0,
              out: np.ndarray | None = None) -> np.ndarray:
    """Attention of q [n_q, n_heads, head_dim] float32 over the cache -> [n_q, n_heads, head_dim].

    Slot j is visible to query i iff slot_pos[j] >= 0, slot_pos[j] <= q_pos[i], (window == 0 or
    q_pos[i] - slot_pos[j] < window) and (mask is None or mask[i, j]); mask is bool
    [n_q, capacity] (a token tree's ancestor mask). GQA: head h reads KV head h // (n_heads /
    n_kv_heads). A query that sees no slot gets zeros.
    """
    q = array("q", q, np.float32, 3)
    n_q, n_heads, hd = q.shape
    fmt, n_kv, cap, k, v, sp = _cache(k_cache, v_cache, slot_pos, hd)
    if n_q == 0:
        raise ValueError("q has no rows")
    if n_heads % n_kv:
        raise ValueError(f"n_heads {n_heads} of q is not a multiple of the cache's {n_kv} KV heads")
    qp = np.asarray(q_pos)
    if qp.ndim != 1 or qp.shape[0] != n_q or not np.issubdtype(qp.dtype, np.integer):
        raise ValueError(f"q_pos must be {n_q} integer positions, got {qp.dtype} {qp.shape}")
    qp = np.ascontiguousarray(qp, dtype=np.int32)
    if isinstance(window, bool) or not isinstance(window, (int, np.integer)) or window < 0:
        raise ValueError(f"window must be an int >= 0, got {window!r}")
    if not np.isfinite(scale):
        raise ValueError(f"scale must be finite, got {scale}")
    if not softcap >= 0:
        raise ValueError(f"softcap must be >= 0, got {softcap}")
    m = None
    if mask is not None:
        m = array("mask", mask, np.bool_, 2)
        if m.shape != (n_q, cap):
            raise ValueError(f"mask must have shape ({n_q}, {cap}), got {m.shape}")
    out = out_array("out", out, (n_q, n_heads, hd), inputs=(("q", q),))
    _native.attention(k, v, fmt, n_kv, cap, hd, sp, q, n_q, n_heads, qp, int(window), m, float(scale),
                      float(softcap), out)
    return out


def kv_write(k_cache: np.ndarray, v_cache: np.ndarray, slot_pos: np.ndarray, k: np.ndarray, v: np.ndarray,
             slots: object, positions: object) -> None:
    """Stores k, v [n, n_kv_heads, head_dim] float32 into `slots` (converting to the cache format)
    and records slot_pos[slots[i]] = positions[i]."""
    k = array("k", k, np.float32, 3)
    v = array("v", v, np.float32, 3)
    if v.shape != k.shape:
        raise ValueError(f"v has shape {v.shape}, k has {k.shape}")
    n, n_kv_in, hd = k.shape
    fmt, n_kv, cap, kc, vc, sp = _cache(k_cache, v_cache, slot_pos, hd)
    if n_kv_in != n_kv:
        raise ValueError(f"k has {n_kv_in} KV heads, the cache has {n_kv}")
    ids = index_array("slots", slots, cap)
    if ids.shape != (n,):
        raise ValueError(f"slots must hold {n} entries, got {ids.shape[0]}")
    pos = np.asarray(positions)
    if pos.shape != (n,) or not np.issubdtype(pos.dtype, np.integer) or (n and (pos.min() < 0 or pos.max() > 2**31 - 1)):
        raise ValueError(f"positions must be {n} non-negative int32 values")
    _native.kv_write(kc, vc, fmt, n_kv, cap, hd, sp, k, v, n, ids, np.ascontiguousarray(pos, dtype=np.int32))
