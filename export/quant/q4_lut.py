"""q4_lut by sensitivity-weighted k-means: one 16-level table per row, one scale per block of 32.

Layout (docs/weight-formats.md): per row an f32 scale `s` and 16 int8 levels, then per block of
32 values one byte `k` and 16 bytes of 4-bit indices; value = s * k^2 * levels[index].

Why both: a table per row alone cannot follow the magnitude of a block of 32 values the way
q4_0's per-block scale does, and on real tensors its error was about twice q4_0's. With the
block scale, the table only has to fit the *shape* of the block-normalized values, where a
non-uniform 16-level table beats q4_0's uniform grid.

The fit, per row (all rows of a chunk at once, numpy-vectorized, float32):
1. block scales from each block's largest magnitude; values normalized by them;
2. the 16 levels: a 1-D k-means over the row's normalized values in which value j counts with
   weight sqrt(E[x_j^2]) * scale^2 (E[x_j^2] weighs column j's share of the first-order output
   error sum_j E[x_j^2] dw_j^2; its square root keeps rare large columns from taking over the
   table), on a histogram of 1/2-level bins, started at weighted quantiles, then from the
   previous round's levels; snapped to int8 with the largest level at 127;
3. per block, a search over candidate scales (the previous round's, and six around the block's
   largest magnitude): indices to the nearest level, then the weighted least-squares scale (full
   E[x_j^2] weights) for those indices; the best candidate wins;
4. steps 2-3 for FIT_ROUNDS rounds in all (the table is refit to the values as the blocks really
   scale them; each round lowers the weighted error);
5. the block scales rounded to s * k^2 (k = 0..255, s = the row's largest block scale / 255^2:
   relative steps of 2/k, finer than fp16's for every block above 1/60 of the row's largest),
   indices re-assigned to the rounded scales.
Nearest-level indices come from a per-row table over ceil(2u) (`index_table`): the levels are
integers, so that lookup is exact and replaces 15 compares per value.
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
FIT_ROUNDS = 4
# candidate block scales, as fractions of (block's largest magnitude / 127)
SCALE_STEPS = np.array([0.9, 0.95, 1.0, 1.05, 1.1, 1.18])
_CHUNK_VALUES = 1 << 20  # values per chunk: bounds the temporaries to tens of MB
_CONVERGED = 0.02  # centroid moves below this (in int8 level units) no longer change the rounded levels
_HALF_SPAN = 256  # ceil(2u) of a normalized value u, clipped to [-256, 256] (levels lie in [-127, 127])
_TABLE = 2 * _HALF_SPAN + 1
_MAX_CODE = 255
_LEVEL_MAX = 127.0
_BIN = 0.5  # histogram bin of the k-means, in level units
KMEANS_POWER = 0.5
REFINE = 0


def index_table(levels: np.ndarray) -> np.ndarray:
    """Nearest-level index of every value u of a row, tabulated by t = ceil(2u) in [-256, 256].
    Levels are integers, so the midpoints m between them are multiples of 1/2 and u > m exactly
    when ceil(2u) > 2m: one table lookup per value replaces 15 compares.
    levels: [R, 16] sorted integer-valued -> uint8 [R, 513]."""
    rows = levels.shape[0]
    twice_mid = (levels[:, 1:] + levels[:, :-1]).astype(np.int64)  # [R, 15], within [-254, 254]
    # count of midpoints below t = prefix sum of a histogram with each midpoint at t = 2m + 1
    pos = twice_mid + _HALF_SPAN + 1 + np.arange(rows)[:, None] * _TABLE
    hist = np.bincount(pos.reshape(-1), minlength=rows * _TABLE).reshape(rows, _TABLE)
    return np.cumsum(hist, axis=1).astype(np.uint8)


def lookup(u2: np.ndarray, table: np.ndarray) -> np.ndarray:
    """table[r, ceil(u2)] for u2 = twice the normalized values [R, C] (float32); table: [R, 513]."""
    t = np.ceil(u2)
    np.clip(t, -_HALF_SPAN, _HALF_SPAN, out=t)
    flat = t.astype(np.intp)
    flat += (np.arange(u2.shape[0], dtype=np.intp) * _TABLE + _HALF_SPAN)[:, None]
    return np.take(table.reshape(-1), flat, mode="clip")  # in range by construction; "clip" skips the check


def assign(v: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the nearest level for every value. v: [R, C]; levels: [R, 16] sorted integers."""
    return lookup(2.0 * np.asarray(v, dtype=np.float32), index_table(levels))


def kmeans_rows(v: np.ndarray, w: np.ndarray, start: np.ndarray | None = None, iterations: int = ITERATIONS
                ) -> np.ndarray:
    """Weighted 1-D k-means per row, on a histogram: values in [-127, 127] fall in bins of 1/2 level
    (the levels are rounded to integers in the end), each bin keeping its weight and weighted sum,
    so a Lloyd step is 15 boundary bins (arithmetic, the bins are uniform) and prefix-sum
    differences: the cost is one pass over the values, not a sort per row.
    v: [R, C] within [-127, 127]; w: weights broadcastable to [R, C]; start: [R, 16] sorted centroids, or None for the
    weighted (2k + 1) / 32 quantiles. Returns centroids [R, 16] sorted."""
    rows = v.shape[0]
    bins = int(2 * _LEVEL_MAX / _BIN) + 1
    # nearest bin (v lies in [-127, 127], so the shifted value is positive and truncation floors it)
    flat = (v * np.float32(1 / _BIN) + np.float32(_LEVEL_MAX / _BIN + 0.5)).astype(np.intp)  # [R, C]
    flat += np.arange(rows, dtype=np.intp)[:, None] * bins
    flat = flat.reshape(-1)
    ww = np.broadcast_to(w, v.shape)
    hw = np.bincount(flat, weights=ww.reshape(-1), minlength=rows * bins).reshape(rows, bins)
    hwv = np.bincount(flat, weights=(ww * v).reshape(-1), minlength=rows * bins).reshape(rows, bins)
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


def _fit_levels(xb: np.ndarray, wk: np.ndarray, d: np.ndarray, start: np.ndarray | None) -> np.ndarray:
    """Levels [R, 16] for values xb [R, B, 32] under block scales d [R, B]; wk: k-means weights [1, B, 32]."""
    rows = xb.shape[0]
    safe = np.where(d > 0, d, 1.0).astype(np.float32)[..., None]
    u = np.clip(xb / safe, -127.0, 127.0).reshape(rows, -1)
    kw = (wk * (safe * safe)).reshape(rows, -1)
    # a start from the previous round's levels is close: a few Lloyd steps settle it
    return _snap_levels(kmeans_rows(u, kw, start, ITERATIONS if start is None else WARM_ITERATIONS))


def _block_scales(xb: np.ndarray, wb: np.ndarray, levels: np.ndarray, previous: np.ndarray) -> np.ndarray:
    """Per block the weighted least-squares scale of the best candidate, [R, B]: the previous
    round's scale (so a round never loses what the last one found) and the steps around the
    block's largest magnitude."""
    rows, nb, _ = xb.shape
    amax = np.abs(xb).max(axis=2)  # [R, B]
    safe_amax = np.where(amax > 0, amax, 1.0)
    best_gain = np.full((rows, nb), -1.0, dtype=np.float32)
    best_d = amax / 127.0
    wx = wb * xb
    values = np.take_along_axis(levels.astype(np.float32), index_table(levels).astype(np.int64), axis=1)  # [R, 513]

    def keep_better(inv: np.ndarray) -> None:
        """Levels for the values times inv [R, B], then their least-squares scale; kept per block
        where it lowers the weighted error."""
        nonlocal best_gain, best_d
        lv = lookup((xb * (2.0 * inv)[..., None]).reshape(rows, -1), values).reshape(xb.shape)
        sxl = np.einsum("rbk,rbk->rb", wx, lv)
        sll = np.einsum("rbk,rbk->rb", wb * lv, lv)
        ok = sll > 0
        dd = np.where(ok, sxl / np.where(ok, sll, 1.0), 0.0)
        gain = np.where(ok & (dd > 0), sxl * dd, 0.0)  # weighted error = sum w x^2 - gain
        better = gain > best_gain
        best_gain = np.where(better, gain, best_gain)
        best_d = np.where(better, np.maximum(dd, 0.0), best_d)

    keep_better((1.0 / np.where(previous > 0, previous, safe_amax / 127.0)).astype(np.float32))
    for step in SCALE_STEPS:
        keep_better((127.0 * step / safe_amax).astype(np.float32))
    for _ in range(REFINE):  # indices to the best scale, then its least-squares scale again
        keep_better((1.0 / np.where(best_d > 0, best_d, 1.0)).astype(np.float32))
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
    wb = w.reshape(1, nb, BLOCK).astype(np.float32)
    wk = wb ** np.float32(KMEANS_POWER)
    out = np.zeros((rows, HEADER_BYTES + nb * BLOCK_BYTES), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // cols)

    def chunk(start: int) -> None:
        xb = np.asarray(values[start:start + step], dtype=np.float32).reshape(-1, nb, BLOCK)  # [R, B, 32]
        r = xb.shape[0]
        d = np.abs(xb).max(axis=2) / 127.0
        levels = None
        for _ in range(FIT_ROUNDS):
            levels = _fit_levels(xb, wk, d, levels)
            d = _block_scales(xb, wb, levels, d)
        s, k = _scale_codes(d.astype(np.float64))
        dq = s[:, None].astype(np.float64) * (k * k)  # [R, B]
        inv2 = np.where(dq > 0, 2.0 / np.where(dq > 0, dq, 1.0), 0.0).astype(np.float32)[..., None]
        idx = lookup((xb * inv2).reshape(r, -1), index_table(levels))
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
