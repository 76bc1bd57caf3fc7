"""q4_lut by sensitivity-weighted per-row k-means.

q4_lut stores per row an f32 scale and 16 int8 levels, and per value a 4-bit index (layout in
docs/weight-formats.md). The 16 levels of a row are the centroids of a 1-D k-means over the
row's values in which value j counts with weight E[x_j^2] (the importance of its column): that
minimizes the first-order output error sum_j E[x_j^2] (w_j - w'_j)^2 rather than the plain
weight error. Centroids are snapped to the int8 grid of the row scale, indices are re-assigned to
the snapped levels, and the scale is finally refit by weighted least squares with the indices
fixed.

Rows are processed in chunks; within a chunk every search runs over all rows at once (rows are
shifted apart so their sorted values or boundaries form a single increasing array).
"""

from __future__ import annotations

import numpy as np

LEVELS = 16
ITERATIONS = 30
_CHUNK_VALUES = 1 << 21  # values per chunk: bounds the temporaries to tens of MB
_CONVERGED = 0.02  # centroid moves below this (in int8 level units) no longer change the rounded levels
_ROW_GAP = 1024.0  # rows are shifted apart by this much in joint searches; values lie in [-127, 127]


def _row_shift(rows: int) -> np.ndarray:
    return np.arange(rows, dtype=np.float64)[:, None] * _ROW_GAP  # [R, 1]


def _assign(v: np.ndarray, levels: np.ndarray) -> np.ndarray:
    """Index of the nearest level for every value. v: [R, C]; levels: [R, 16] sorted."""
    rows = v.shape[0]
    mids = 0.5 * (levels[:, 1:] + levels[:, :-1])  # [R, 15]
    shift = _row_shift(rows)
    idx = np.searchsorted((mids + shift).reshape(-1), (v + shift).reshape(-1)).reshape(v.shape)
    return idx - np.arange(rows)[:, None] * (LEVELS - 1)  # [R, C] in 0..15


def _kmeans_chunk(v: np.ndarray, w: np.ndarray) -> np.ndarray:
    """Weighted 1-D k-means per row on sorted values: every cluster is a contiguous run of the
    sorted row, so one Lloyd step is a search for 15 boundaries plus prefix-sum differences.
    Rows stop iterating once their centroids settle (most do within a few steps; a few drift for
    many). v: [R, C] values in [-127, 127]; w: [1, C] weights. Returns centroids [R, 16] sorted."""
    rows, cols = v.shape
    order = np.argsort(v, axis=1)
    sv = np.take_along_axis(v, order, axis=1)  # [R, C]
    sw = np.take_along_axis(np.broadcast_to(w, v.shape), order, axis=1)
    zero = np.zeros((rows, 1))
    cw = np.concatenate([zero, np.cumsum(sw, axis=1)], axis=1)  # [R, C + 1]
    cwv = np.concatenate([zero, np.cumsum(sw * sv, axis=1)], axis=1)
    # start at the weighted (2k + 1) / 32 quantiles
    targets = cw[:, -1:] * (2 * np.arange(LEVELS) + 1) / (2 * LEVELS)  # [R, 16]
    pos = np.minimum((cw[:, 1:, None] < targets[:, None, :]).sum(axis=1), cols - 1)
    centroids = np.take_along_axis(sv, pos, axis=1)
    active = np.arange(rows)
    for _ in range(ITERATIONS):
        n = len(active)
        c = centroids[active]
        shift = _row_shift(n)
        mids = 0.5 * (c[:, 1:] + c[:, :-1])  # [n, 15]
        flat_sorted = (sv[active] + shift).reshape(-1)
        cut = np.searchsorted(flat_sorted, (mids + shift).reshape(-1), side="right").reshape(n, LEVELS - 1)
        cut = np.clip(cut - np.arange(n)[:, None] * cols, 0, cols)
        bounds = np.concatenate([np.zeros((n, 1), dtype=np.int64), cut, np.full((n, 1), cols)], axis=1)
        mass = np.diff(np.take_along_axis(cw[active], bounds, axis=1), axis=1)  # [n, 16]
        total = np.diff(np.take_along_axis(cwv[active], bounds, axis=1), axis=1)
        empty = mass <= 0
        new = np.where(empty, c, total / np.where(empty, 1.0, mass))
        new.sort(axis=1)
        centroids[active] = new
        moving = np.abs(new - c).max(axis=1) > _CONVERGED
        active = active[moving]
        if not len(active):
            break
    return centroids


def quantize_q4_lut(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    """float32 [rows, cols] -> uint8 [rows, 32 + cols / 2] in the q4_lut layout."""
    rows, cols = values.shape
    if cols % 32:
        raise ValueError(f"q4_lut needs rows that are a multiple of 32 values, got {cols}")
    w = np.ones((1, cols), dtype=np.float64) if importance is None else \
        np.asarray(importance, dtype=np.float64).reshape(1, cols)
    out = np.zeros((rows, 32 + cols // 2), dtype=np.uint8)
    step = max(1, _CHUNK_VALUES // cols)
    for start in range(0, rows, step):
        x = np.asarray(values[start:start + step], dtype=np.float64)  # [R, C]
        amax = np.abs(x).max(axis=1)
        scale = np.where(amax > 0, amax / 127.0, 1.0)  # [R]
        v = x / scale[:, None]
        levels = np.clip(np.rint(_kmeans_chunk(v, w)), -127, 127)
        levels.sort(axis=1)
        idx = _assign(v, levels)
        # refit the scale with indices fixed: minimize sum_j w_j (x_j - s * L[idx_j])^2
        chosen = np.take_along_axis(levels, idx, axis=1)  # [R, C]
        num = np.sum(w * x * chosen, axis=1)
        den = np.sum(w * chosen * chosen, axis=1)
        scale = np.where(den > 0, num / np.where(den > 0, den, 1.0), scale).astype(np.float32)
        out[start:start + step] = pack_q4_lut(scale, levels.astype(np.int8), idx)
    return out


def pack_q4_lut(scale: np.ndarray, levels: np.ndarray, idx: np.ndarray) -> np.ndarray:
    """scale [R] f32, levels [R, 16] int8, idx [R, C] in 0..15 -> [R, 32 + C / 2] uint8."""
    rows, cols = idx.shape
    header = np.zeros((rows, 32), dtype=np.uint8)
    header[:, 0:4] = scale.astype("<f4").reshape(rows, 1).view(np.uint8)
    header[:, 4:20] = levels.astype(np.int8).view(np.uint8)
    blocks = idx.astype(np.uint8).reshape(rows, cols // 32, 2, 16)  # [R, B, half, 16]
    packed = blocks[:, :, 0, :] | (blocks[:, :, 1, :] << 4)  # byte j: value j low, value j + 16 high
    return np.concatenate([header, packed.reshape(rows, cols // 2)], axis=1)
