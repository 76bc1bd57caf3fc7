"""Calibrated (activation-weighted) scale search for the GGML block formats.

Round-to-nearest picks each block's scale from its largest value. The output error of a linear
layer, though, is sum_j E[x_j^2] * (w_j - w'_j)^2 to first order (x = the input activations), so a
column that meets large activations matters more than one that meets small ones. For every block
we try a grid of scales around the round-to-nearest one, take for each candidate the levels it
rounds to and the least-squares-optimal scale for those levels under the importance weights, and
keep the candidate with the smallest weighted error. Given the final (fp16) scale, rounding each
value to its nearest level is optimal, so levels are recomputed once more at the end.

The search functions take float32 `x [n_blocks, 32]` and weights `w` of the same shape; the
`quantize_weighted_*` functions take a matrix and per-column importance and work through it in
row chunks (bounded temporaries, cache-sized buffers).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

import numpy as np
from edgeflash.export.quant.blocks import pack_q4_0, pack_q4_1, pack_q5_0, pack_q8_0

# Candidate level counts around the round-to-nearest one (n): inverse scales (n + step) / max|x|.
SYMMETRIC_STEPS = np.arange(-0.6, 1.21, 0.3, dtype=np.float32)
AFFINE_STEPS = np.arange(-1.0, 1.01, 0.25, dtype=np.float32)
_CHUNK_BLOCKS = 1 << 15  # 32768 blocks of 32 values: 4 MiB per float32 buffer


def _signed_absmax(x: np.ndarray) -> np.ndarray:
    idx = np.argmax(np.abs(x), axis=1)
    return np.take_along_axis(x, idx[:, None], axis=1)[:, 0]  # [n]


def symmetric_search(x: np.ndarray, w: np.ndarray, lo: int, hi: int) -> tuple[np.ndarray, np.ndarray]:
    """Levels in [lo, hi] and fp16-representable scales d, value = d * level.

    Round-to-nearest maps the block's extreme to the wider end of the range: ggml's q4_0/q5_0 use
    d = m / lo for the signed extreme m (lo = -8 / -16), q8_0 uses d = max|x| / hi."""
    if -lo > hi:  # asymmetric range: the signed extreme goes to lo
        ref_scale, n = -_signed_absmax(x), float(-lo)
    else:
        ref_scale, n = np.abs(x).max(axis=1), float(hi)
    safe = np.where(ref_scale == 0, 1.0, ref_scale).astype(np.float32)
    best_gain = np.full(x.shape[0], -1.0, dtype=np.float32)
    best_d = np.zeros(x.shape[0], dtype=np.float32)
    levels = np.empty_like(x)
    wl = np.empty_like(x)
    for step in SYMMETRIC_STEPS:
        np.multiply(x, ((n + step) / safe)[:, None], out=levels)
        np.rint(levels, out=levels)
        np.clip(levels, lo, hi, out=levels)
        np.multiply(w, levels, out=wl)
        sum_lx = np.einsum("ij,ij->i", wl, x)
        sum_l2 = np.einsum("ij,ij->i", wl, levels)
        ok = sum_l2 > 0
        d = np.where(ok, sum_lx / np.where(ok, sum_l2, 1.0), 0.0)
        # weighted error = sum w x^2 - sum_lx^2 / sum_l2 at the optimal d: maximize the second term
        gain = np.where(ok, sum_lx * d, 0.0)
        better = gain > best_gain
        best_gain = np.where(better, gain, best_gain)
        best_d = np.where(better, d, best_d)
    d16 = np.where(ref_scale == 0, 0.0, best_d).astype(np.float16).astype(np.float32)
    inv = np.where(d16 != 0, 1.0 / np.where(d16 != 0, d16, 1.0), 0.0).astype(np.float32)
    np.multiply(x, inv[:, None], out=levels)
    np.rint(levels, out=levels)
    np.clip(levels, lo, hi, out=levels)
    return d16, levels.astype(np.int32)


def affine_search(x: np.ndarray, w: np.ndarray, nlevels: int, clamp_min_to_zero: bool = False
                  ) -> tuple[np.ndarray, np.ndarray]:
    """(d, m) with value = d * q + m, q in [0, nlevels - 1], chosen by weighted least squares.

    For each candidate scale the levels are rounded from the block minimum, then (d, m) is the
    weighted least-squares fit to those levels. `clamp_min_to_zero` keeps m <= 0 (K-quants store
    the minimum as a non-negative number that is subtracted)."""
    lo = x.min(axis=1)
    hi = x.max(axis=1)
    if clamp_min_to_zero:
        lo = np.minimum(lo, 0.0)
    span = np.where(hi > lo, hi - lo, 1.0).astype(np.float32)
    sw = w.sum(axis=1)
    swx = np.einsum("ij,ij->i", w, x)
    swx2 = np.einsum("ij,ij,ij->i", w, x, x)
    best_err = np.full(x.shape[0], np.inf, dtype=np.float32)
    best_d = np.zeros(x.shape[0], dtype=np.float32)
    best_m = lo.astype(np.float32)
    shifted = x - lo[:, None]
    q = np.empty_like(x)
    wq = np.empty_like(x)
    for step in AFFINE_STEPS:
        np.multiply(shifted, ((nlevels - 1 + step) / span)[:, None], out=q)
        np.rint(q, out=q)
        np.clip(q, 0, nlevels - 1, out=q)
        np.multiply(w, q, out=wq)
        swq = wq.sum(axis=1)
        swq2 = np.einsum("ij,ij->i", wq, q)
        swqx = np.einsum("ij,ij->i", wq, x)
        det = swq2 * sw - swq * swq
        ok = det > 1e-12 * np.maximum(swq2 * sw, 1e-30)
        safe = np.where(ok, det, 1.0)
        d = np.where(ok, (swqx * sw - swq * swx) / safe, 0.0)
        m = np.where(ok, (swq2 * swx - swq * swqx) / safe, swx / np.maximum(sw, 1e-30))
        if clamp_min_to_zero:
            # refit d alone with m pinned at 0 where the fit wanted a positive minimum
            pos = m > 0
            d = np.where(pos, swqx / np.maximum(swq2, 1e-30), d)
            m = np.where(pos, 0.0, m)
        d = np.maximum(d, 0.0)
        err = swx2 - 2 * d * swqx - 2 * m * swx + d * d * swq2 + 2 * d * m * swq + m * m * sw
        better = err < best_err
        best_err = np.where(better, err, best_err)
        best_d = np.where(better, d, best_d)
        best_m = np.where(better, m, best_m)
    return best_d.astype(np.float32), best_m.astype(np.float32)


_threads = 1  # row chunks quantized at once (numpy releases the GIL in its loops)


@contextmanager
def quantize_threads(n: int) -> Iterator[None]:
    """Quantize the row chunks of a matrix on `n` threads inside the block."""
    global _threads
    before, _threads = _threads, max(1, n)
    try:
        yield
    finally:
        _threads = before


def quantize_thread_count() -> int:
    """Threads a quantizer may use for the row chunks of one matrix (set by `quantize_threads`)."""
    return _threads


def by_row_chunks(values: np.ndarray, importance: np.ndarray | None, block: int,
                  fn: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> np.ndarray:
    """Apply `fn(x [n, 32], w [n, 32]) -> packed [n_blocks_of_row_chunk, bytes]` over row chunks of
    a matrix; `block` is the number of values one packed unit covers (32, or 256 for K-quants)."""
    rows, cols = values.shape
    per_row = cols // 32
    step = max(1, _CHUNK_BLOCKS // per_row)
    imp = np.ones(cols, dtype=np.float32) if importance is None else np.asarray(importance, dtype=np.float32)
    w_row = imp.reshape(per_row, 32)

    def one(start: int) -> np.ndarray:
        chunk = np.ascontiguousarray(values[start:start + step], dtype=np.float32)
        n = chunk.shape[0]
        return fn(chunk.reshape(n * per_row, 32), np.tile(w_row, (n, 1))).reshape(n, -1)

    starts = range(0, rows, step)
    if _threads > 1 and len(starts) > 1:
        with ThreadPoolExecutor(_threads) as pool:
            pieces = list(pool.map(one, starts))
    else:
        pieces = [one(start) for start in starts]
    return np.concatenate(pieces) if len(pieces) > 1 else pieces[0]


def quantize_weighted_q4_0(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return by_row_chunks(values, importance, 32, lambda x, w: pack_q4_0(*symmetric_search(x, w, -8, 7)))


def quantize_weighted_q5_0(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return by_row_chunks(values, importance, 32, lambda x, w: pack_q5_0(*symmetric_search(x, w, -16, 15)))


def quantize_weighted_q8_0(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return by_row_chunks(values, importance, 32, lambda x, w: pack_q8_0(*symmetric_search(x, w, -127, 127)))


def _q4_1_blocks(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    d, m = affine_search(x, w, 16)
    d16 = d.astype(np.float16).astype(np.float32)
    m16 = m.astype(np.float16).astype(np.float32)
    inv = np.where(d16 > 0, 1.0 / np.where(d16 > 0, d16, 1.0), 0.0)
    q = np.clip(np.rint((x - m16[:, None]) * inv[:, None]), 0, 15).astype(np.int32)
    return pack_q4_1(d16, m16, q)


def quantize_weighted_q4_1(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    return by_row_chunks(values, importance, 32, _q4_1_blocks)
