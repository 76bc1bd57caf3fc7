"""q4_lut by sensitivity-weighted k-means: one 16-level table per row, one scale per block of 32.

Layout (docs/weight-formats.md): per row an f32 scale `s` and 16 int8 levels, then per block of
32 values one byte `k` and 16 bytes of 4-bit indices; value = s * k^2 * levels[index].

Why both: a table per row alone cannot follow the magnitude of a block of 32 values the way
q4_0's per-block scale does, and on real tensors its error was about twice q4_0's. With the
block scale, the table only has to fit the *shape* of the block-normalized values, where a
non-uniform 16-level table beats q4_0's uniform grid.

The fit, per row (all rows of a chunk at once, numpy-vectorized):
1. block scales from each block's largest magnitude; values normalized by them;
2. the 16 levels: a 1-D k-means over the row's normalized values in which value j counts with
   weight E[x_j^2] * scale^2 (its share of the first-order output error sum_j E[x_j^2] dw_j^2),
   started at weighted quantiles; snapped to int8 with the largest level at 127;
3. per block, a search over candidate scales: indices to the nearest level, then the weighted
   least-squares scale for those indices; the best candidate wins;
4. steps 2-3 once more with the block scales of step 3 (the table is refit to the values as the
   blocks really scale them);
5. the block scales rounded to s * k^2 (k = 0..255, s = the row's largest block scale / 255^2:
   relative steps of 2/k, finer than fp16's for every block above 1/60 of the row's largest),
   indices re-assigned to the rounded scales.
"""

from __future__ import annotations

from concurrent.futures import ThreadPoolExecutor

import numpy as np
from edgeflash.export.quant import weighted

LEVELS = 16
BLOCK = 32
HEADER_BYTES = 20  # f32 row scale + 16 int8 levels
BLOCK_BYTES = 17  # scale code + 16 bytes of indices
ITERATIONS = 20
WARM_ITERATIONS = 6
FIT_ROUNDS = 3
# candidate block scales, as fractions of (block's largest magnitude / 127)
SCALE_STEPS = np.array([0.9, 0.95, 1.0, 1.05, 1.1, 1.18])
_CHUNK_VALUES = 1 << 20  # values per chunk: bounds the temporaries to tens of MB
_CONVERGED = 0.02  # centroid moves below this (in int8 level units) no longer change the rounded levels
_ROW_GAP = 1024.0  # rows are shifted apart by this much in joint searches; levels lie in [-127, 127]
_MAX_CODE = 255
_LEVEL_MAX = 127.0
_BIN = 0.5  # histogram bin of the k-means, in level units
KMEANS_POWER = 0.5
REFINE = 0


def _row_shift(rows: int) -> np.ndarray:
    return np.arange(rows, dtype=np.float64)[:, None] * _ROW_GAP  # [R, 1]


def assign(v: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the nearest level for every value. v: [R, C]; levels: [R, 16] sorted.
    Counts the midpoints below each value (15 vector compares: faster than a search)."""
    mids = (0.5 * (levels[:, 1:] + levels[:, :-1])).astype(np.float32)  # [R, 15]
    vv = v.astype(np.float32)
    idx = np.zeros(v.shape, dtype=np.uint8)
    for k in range(LEVELS - 1):
        idx += vv > mids[:, k:k + 1]
    return idx


def kmeans_rows(v: np.ndarray, w: np.ndarray, start: np.ndarray | None = None, iterations: int = ITERATIONS
                ) -> np.ndarray:
    """Weighted 1-D k-means per row, on a histogram: values in [-127, 127] fall in bins of 1/2 level
    (the levels are rounded to integers in the end), each bin keeping its weight and weighted sum,
    so a Lloyd step is 15 boundary bins (arithmetic, the bins are uniform) and prefix-sum
    differences: the cost is one pass over the values, not a sort per row.
    v: [R, C]; w: weights broadcastable to [R, C]; start: [R, 16] sorted centroids, or None for the
    weighted (2k + 1) / 32 quantiles. Returns centroids [R, 16] sorted."""
    rows = v.shape[0]
    bins = int(2 * _LEVEL_MAX / _BIN) + 1
    b = np.clip(np.rint((v + _LEVEL_MAX) / _BIN), 0, bins - 1).astype(np.int64)  # [R, C]
    flat = (b + np.arange(rows)[:, None] * bins).reshape(-1)
    ww = np.broadcast_to(w, v.shape).reshape(-1)
    hw = np.bincount(flat, weights=ww, minlength=rows * bins).reshape(rows, bins)
    hwv = np.bincount(flat, weights=ww * v.reshape(-1), minlength=rows * bins).reshape(rows, bins)
    zero = np.zeros((rows, 1))
    cw = np.concatenate([zero, np.cumsum(hw, axis=1)], axis=1)  # [R, bins + 1]
    cwv = np.concatenate([zero, np.cumsum(hwv, axis=1)], axis=1)
    if start is None:
        targets = cw[:, -1:] * (2 * np.arange(LEVELS) + 1) / (2 * LEVELS)  # [R, 16]
        pos = np.clip(np.stack([np.searchsorted(cw[r], targets[r]) for r in range(rows)]) - 1, 0, bins - 1)
        centroids = pos * _BIN - _LEVEL_MAX
    else:
        centroids = np.array(start, dtype=np.float64)
    for _ in range(iterations):
        mids = 0.5 * (centroids[:, 1:] + centroids[:, :-1])  # [R, 15]
        # bins whose centre lies above the midpoint belong to the upper cluster
        cut = np.clip(np.floor((mids + _LEVEL_MAX) / _BIN).astype(np.int64) + 1, 0, bins)
        bounds = np.concatenate([np.zeros((rows, 1), dtype=np.int64), cut, np.full((rows, 1), bins)], axis=1)
        mass = np.diff(np.take_along_axis(cw, bounds, axis=1), axis=1)  # [R, 16]
        total = np.diff(np.take_along_axis(cwv, bounds, axis=1), axis=1)
        empty = mass <= 0
        new = np.where(empty, centroids, total / np.where(empty, 1.0, mass))
        new.sort(axis=1)
        moved = np.abs(new - centroids).max()
        centroids = new
        if moved <= _CONVERGED:
            break
    return centroids


def _snap_levels(centroids: np.ndarray) -> np.ndarray:
    """Centroids [R, 16] -> int8-valued levels (float64), the largest magnitude at 127, sorted."""
    top = np.abs(centroids).max(axis=1, keepdims=True)
    levels = np.clip(np.rint(centroids * (127.0 / np.where(top > 0, top, 1.0))), -127, 127)
    levels.sort(axis=1)
    return levels


def _fit_levels(xb: np.ndarray, wb: np.ndarray, d: np.ndarray, start: np.ndarray | None) -> np.ndarray:
    """Levels [R, 16] for values xb [R, B, 32] under block scales d [R, B]."""
    rows = xb.shape[0]
    safe = np.where(d > 0, d, 1.0)[..., None]
    u = np.clip(xb / safe, -127.0, 127.0).reshape(rows, -1)
    kw = (np.broadcast_to(wb ** KMEANS_POWER, xb.shape) * safe * safe).reshape(rows, -1)
    # a start from the previous round's levels is close: a few Lloyd steps settle it
    return _snap_levels(kmeans_rows(u, kw, start, ITERATIONS if start is None else WARM_ITERATIONS))


def _block_scales(xb: np.ndarray, wb: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Per block the weighted least-squares scale of the best candidate, [R, B]."""
    rows, nb, _ = xb.shape
    amax = np.abs(xb).max(axis=2)  # [R, B]
    best_gain = np.full((rows, nb), -1.0)
    best_d = amax / 127.0
    wx = wb * xb

    def keep_better(d: np.ndarray) -> None:
        """Indices to scale d, then their least-squares scale; kept per block where it lowers the error."""
        nonlocal best_gain, best_d
        idx = assign((xb / d[..., None]).reshape(rows, -1), levels).reshape(xb.shape)
        lv = np.take_along_axis(levels, idx.reshape(rows, -1), axis=1).reshape(xb.shape)
        sxl = np.einsum("rbk,rbk->rb", wx, lv)
        sll = np.einsum("rbk,rbk,rbk->rb", wb, lv, lv)
        ok = sll > 0
        dd = np.where(ok, sxl / np.where(ok, sll, 1.0), 0.0)
        gain = np.where(ok & (dd > 0), sxl * dd, 0.0)  # weighted error = sum w x^2 - gain
        better = gain > best_gain
        best_gain = np.where(better, gain, best_gain)
        best_d = np.where(better, np.maximum(dd, 0.0), best_d)

    for step in SCALE_STEPS:
        keep_better(np.where(amax > 0, amax / (127.0 * step), 1.0))
    for _ in range(REFINE):  # indices to the best scale, then its least-squares scale again
        keep_better(np.where(best_d > 0, best_d, 1.0))
    return np.where(amax > 0, best_d, 0.0)


def _scale_codes(d: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Block scales d [R, B] -> row scale s [R] (f32) and codes k [R, B] with d ~ s * k^2."""
    top = d.max(axis=1)
    s = np.where(top > 0, top / _MAX_CODE**2, 1.0).astype(np.float32).astype(np.float64)
    t = np.sqrt(d / s[:, None])
    lo = np.clip(np.floor(t), 0, _MAX_CODE)
    hi = np.clip(lo + 1, 0, _MAX_CODE)
    r = d / s[:, None]
    k = np.where(np.abs(hi * hi - r) < np.abs(r - lo * lo), hi, lo)
    return s.astype(np.float32), k.astype(np.int64)


def quantize_q4_lut(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, row_bytes] in the q4_lut layout."""
    rows, cols = values.shape
    if cols % BLOCK:
        raise ValueError(f"q4_lut needs rows that are a multiple of {BLOCK} values, got {cols}")
    nb = cols // BLOCK
    w = np.ones(cols) if importance is None else np.asarray(importance, dtype=np.float64).reshape(cols)
    wb = w.reshape(1, nb, BLOCK)
    out = np.zeros((rows, HEADER_BYTES + nb * BLOCK_BYTES), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // cols)

    def chunk(start: int) -> None:
        xb = np.asarray(values[start:start + step], dtype=np.float64).reshape(-1, nb, BLOCK)  # [R, B, 32]
        r = xb.shape[0]
        d = np.abs(xb).max(axis=2) / 127.0
        levels = None
        for _ in range(FIT_ROUNDS):
            levels = _fit_levels(xb, wb, d, levels)
            d = _block_scales(xb, wb, levels)
        s, k = _scale_codes(d)
        dq = s[:, None].astype(np.float64) * (k * k)  # [R, B]
        safe = np.where(dq > 0, dq, 1.0)[..., None]
        idx = assign((xb / safe).reshape(r, -1), levels)
        out[start:start + step] = pack_q4_lut(s, levels.astype(np.int8), k, idx)

    starts = range(0, rows, step)
    threads = weighted.quantize_thread_count()
    if threads > 1 and len(starts) > 1:
        with ThreadPoolExecutor(threads) as pool:
            list(pool.map(chunk, starts))
    else:
        for start in starts:
            chunk(start)
    return out


def pack_q4_lut(scale: np.ndarray, levels: np.ndarray, codes: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """scale [R] f32, levels [R, 16] int8, codes [R, B] in 0..255, idx [R, C] in 0..15 -> [R, row_bytes] uint8."""
    rows, cols = idx.shape
    nb = cols // BLOCK
    header = np.zeros((rows, HEADER_BYTES), dtype=np.uint8)
    header[:, 0:4] = scale.astype("<f4").reshape(rows, 1).view(np.uint8)
    header[:, 4:20] = levels.astype(np.int8).view(np.uint8)
    blocks = np.empty((rows, nb, BLOCK_BYTES), dtype=np.uint8)
    blocks[:, :, 0] = codes
    half = idx.astype(np.uint8).reshape(rows, nb, 2, 16)  # [R, B, half, 16]
    blocks[:, :, 1:] = half[:, :, 0, :] | (half[:, :, 1, :] << 4)  # byte j: value j low, value j + 16 high
    return np.concatenate([header, blocks.reshape(rows, nb * BLOCK_BYTES)], axis=1)
