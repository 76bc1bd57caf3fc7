"""Decode / verify attention over a slot-addressed KV cache, and the KV write helper.

A cache for one layer is two arrays, K and V, each [n_kv_heads, capacity, head_dim] float16
(format f16) or [n_kv_heads, capacity, kv_row_bytes('q8_0', head_dim)] uint8 (format q8_0:
head_dim/32 GGML q8_0 blocks per vector), plus slot_pos int32 [capacity]: the position held by
each slot, -1 when empty. Slots need not be in position order, so a sliding-window layer can
keep a ring buffer of `window` slots.

Format kivi2 (KIVI's 2-bit cache) keeps K and V as uint8 [n_kv_heads, bytes per head] (K larger
than V) and one more array, `sealed` (int64 [1]). Keys are quantized per channel over blocks of
KIVI["key_group"] positions: before RoPE (`rope`: the rotation the written keys carry), an f16
mean, and the orthonormal Walsh-Hadamard transform of the rest over the block's positions on
2^b symmetric levels of an f16 step (a multiple of its RMS), b from 0 to KIVI["key_bits_max"] bits
per channel and KIVI["key_bits"] on average, set per KV head when its first block is stored (the
channels of largest mean square get the most); values per position, an f16 scale and minimum per
KIVI["group"] channels, 2-bit codes (4 levels). Positions stay in a ring of q8_0 rows until a
write starts kivi_recent(capacity) positions past their block of KIVI["group"]; in a cache that
does not wrap the first block stays in q8_0 (the attention sink; a wrapping cache serves a
sliding window, which leaves it behind). Position p must go to slot p % capacity (capacity a
multiple of KIVI["group"]); `sealed` is the first position not yet moved out of the ring. The
byte layout is in kernels/include/edgeflash/kernels.h.
"""

from __future__ import annotations

import numpy as np

from . import _native
from ._arrays import array, index_array, out_array, writable
from .formats import kv_cache_bytes, kv_key_bytes, kv_row_bytes

# group, key_group, key_bits, key_bits_max, recent_min, recent_max, max_write
KIVI: dict[str, int] = dict(_native.kivi_constants())


def kivi_recent(capacity: int) -> int:
    """Positions before a decoded token that a kivi2 cache of `capacity` slots keeps in q8_0 (at
    least): an eighth of the capacity in whole blocks, from KIVI["recent_min"] to KIVI["recent_max"]."""
    return int(_native.kv_recent(int(capacity)))


def _rope(rope: tuple[int, float] | None, head_dim: int) -> tuple[int, float]:
    """(rot_dim, theta) of the NeoX RoPE a kivi2 cache's keys carry; (0, 1e4) for none."""
    if rope is None:
        return 0, 10000.0
    rot_dim, theta = rope
    integer = isinstance(rot_dim, (int, np.integer)) and not isinstance(rot_dim, bool)
    if not integer or rot_dim <= 0 or rot_dim % 2 or rot_dim > head_dim or not theta > 0:
        raise ValueError(f"rope must be (rot_dim, theta) with an even rot_dim in (0, {head_dim}] and "
                         f"theta > 0, got {rope!r}")
    return int(rot_dim), float(theta)


def new_kv_cache(n_kv_heads: int, capacity: int, head_dim: int, fmt: str = "f16",
                 wraps: bool = True) -> tuple[np.ndarray, ...]:
    """Empty (k, v, slot_pos) for one layer; kivi2 adds `sealed`: (k, v, slot_pos, sealed), and
    without `wraps` (positions stay below the capacity) needs no 2-bit store for its sink block."""
    if fmt == "kivi2":
        k_bytes = kv_key_bytes(fmt, n_kv_heads, capacity, head_dim, wraps)
        v_bytes = kv_cache_bytes(fmt, n_kv_heads, capacity, head_dim, wraps) - k_bytes
        return (np.zeros((n_kv_heads, k_bytes // n_kv_heads), dtype=np.uint8),
                np.zeros((n_kv_heads, v_bytes // n_kv_heads), dtype=np.uint8),
                np.full(capacity, -1, dtype=np.int32), np.zeros(1, dtype=np.int64))
    rb = kv_row_bytes(fmt, head_dim)
    if fmt == "f16":
        k = np.zeros((n_kv_heads, capacity, head_dim), dtype=np.float16)
    else:
        k = np.zeros((n_kv_heads, capacity, rb), dtype=np.uint8)
    return k, np.zeros_like(k), np.full(capacity, -1, dtype=np.int32)


def _cache(k_cache: object, v_cache: object, slot_pos: object, head_dim: int,
           sealed: object = None) -> tuple[str, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray | None]:
    if not isinstance(k_cache, np.ndarray):
        raise TypeError(f"k_cache must be a numpy array, got {type(k_cache).__name__}")
    if sealed is not None:
        return _kivi2_cache(k_cache, v_cache, slot_pos, head_dim, sealed)
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
    return fmt, n_kv, cap, k, v, sp, None


def _kivi2_cache(k_cache: np.ndarray, v_cache: object, slot_pos: object, head_dim: int,
                 sealed: object) -> tuple[str, int, int, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    k = writable("k_cache", array("k_cache", k_cache, np.uint8, 2))
    v = writable("v_cache", array("v_cache", v_cache, np.uint8, 2))
    sp = writable("slot_pos", array("slot_pos", slot_pos, np.int32, 1))
    n_kv, cap = k.shape[0], sp.shape[0]
    wraps = k.size != kv_key_bytes("kivi2", n_kv, cap, head_dim, False)  # also checks head_dim and the capacity
    want_k = kv_key_bytes("kivi2", n_kv, cap, head_dim, wraps)
    want_v = kv_cache_bytes("kivi2", n_kv, cap, head_dim, wraps) - want_k
    if k.size != want_k or v.shape != (n_kv, want_v // n_kv):
        raise ValueError(f"a kivi2 cache of {cap} slots for head_dim {head_dim} needs K {(n_kv, want_k // n_kv)} "
                         f"and V {(n_kv, want_v // n_kv)} bytes, got {k.shape} and {v.shape}")
    s = writable("sealed", array("sealed", sealed, np.int64, 1))
    if s.shape != (1,):
        raise ValueError(f"sealed must have shape (1,), got {s.shape}")
    return "kivi2", n_kv, cap, k, v, sp, s


def attention(q: np.ndarray, k_cache: np.ndarray, v_cache: np.ndarray, slot_pos: np.ndarray, q_pos: object, *,
              scale: float, window: int = 0, mask: np.ndarray | None = None, softcap: float = 0.0,
              out: np.ndarray | None = None, sealed: np.ndarray | None = None,
              rope: tuple[int, float] | None = None) -> np.ndarray:
    """Attention of q [n_q, n_heads, head_dim] float32 over the cache -> [n_q, n_heads, head_dim].

    Slot j is visible to query i iff slot_pos[j] >= 0, slot_pos[j] <= q_pos[i], (window == 0 or
    q_pos[i] - slot_pos[j] < window) and (mask is None or mask[i, j]); mask is bool
    [n_q, capacity] (a token tree's ancestor mask). GQA: head h reads KV head h // (n_heads /
    n_kv_heads). A query that sees no slot gets zeros. A kivi2 cache takes the `rope` its keys
    were written with (kv_write).
    """
    q = array("q", q, np.float32, 3)
    n_q, n_heads, hd = q.shape
    fmt, n_kv, cap, k, v, sp, sl = _cache(k_cache, v_cache, slot_pos, hd, sealed)
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
                      float(softcap), out, sl, *_rope(rope, hd))
    return out


def kv_write(k_cache: np.ndarray, v_cache: np.ndarray, slot_pos: np.ndarray, k: np.ndarray, v: np.ndarray,
             slots: object, positions: object, sealed: np.ndarray | None = None,
             rope: tuple[int, float] | None = None) -> None:
    """Stores k, v [n, n_kv_heads, head_dim] float32 into `slots` (converting to the cache format)
    and records slot_pos[slots[i]] = positions[i]. A kivi2 cache (`sealed` given) also moves
    blocks old enough into its 2-bit store, unrotating keys that carry `rope` = (rot_dim, theta)
    (NeoX RoPE at their positions) first; attention and kv_read must be given the same `rope`."""
    k = array("k", k, np.float32, 3)
    v = array("v", v, np.float32, 3)
    if v.shape != k.shape:
        raise ValueError(f"v has shape {v.shape}, k has {k.shape}")
    n, n_kv_in, hd = k.shape
    fmt, n_kv, cap, kc, vc, sp, sl = _cache(k_cache, v_cache, slot_pos, hd, sealed)
    if n_kv_in != n_kv:
        raise ValueError(f"k has {n_kv_in} KV heads, the cache has {n_kv}")
    ids = index_array("slots", slots, cap)
    if ids.shape != (n,):
        raise ValueError(f"slots must hold {n} entries, got {ids.shape[0]}")
    pos = np.asarray(positions)
    if pos.shape != (n,) or not np.issubdtype(pos.dtype, np.integer) or (n and (pos.min() < 0 or pos.max() > 2**31 - 1)):
        raise ValueError(f"positions must be {n} non-negative int32 values")
    _native.kv_write(kc, vc, fmt, n_kv, cap, hd, sp, k, v, n, ids, np.ascontiguousarray(pos, dtype=np.int32),
                     sl, *_rope(rope, hd))


def kv_read(k_cache: np.ndarray, v_cache: np.ndarray, slot_pos: np.ndarray, head_dim: int,
            sealed: np.ndarray | None = None,
            rope: tuple[int, float] | None = None) -> tuple[np.ndarray, np.ndarray]:
    """The keys and values attention reads, float32 [n_kv_heads, capacity, head_dim] each (zeros
    for empty slots)."""
    fmt, n_kv, cap, kc, vc, sp, sl = _cache(k_cache, v_cache, slot_pos, head_dim, sealed)
    k = np.empty((n_kv, cap, head_dim), dtype=np.float32)
    v = np.empty_like(k)
    _native.kv_read(kc, vc, fmt, n_kv, cap, head_dim, sp, sl, k, v, *_rope(rope, head_dim))
    return k, v
