"""Q4_K in numpy, bit-compatible with ggml (so `gguf.quants.dequantize` and our kernels read it).

A super-block holds 256 values as 8 sub-blocks of 32: value = d * sc[j] * q - dmin * mn[j], with
q in 0..15, 6-bit sc[j] and mn[j], and fp16 d, dmin per super-block. Layout (144 bytes): d, dmin,
12 bytes of packed 6-bit scales/mins, then 4 chunks of 32 bytes, chunk c holding sub-block 2c in
the low nibbles and sub-block 2c + 1 in the high nibbles.

Each sub-block gets its own (weighted) affine fit with the minimum pinned <= 0; the 8 scales and
8 minimums are then quantized to 6 bits against the super-block maxima, and the levels are
recomputed with the scales that are actually stored.
"""

from __future__ import annotations

import numpy as np
from edgeflash.export.quant.weighted import affine_search, by_row_chunks


def _super_blocks(x: np.ndarray, w: np.ndarray) -> np.ndarray:
    """x, w: [n_super * 8, 32] sub-blocks -> [n_super, 144] packed."""
    n_super = x.shape[0] // 8
    scale, minimum = affine_search(x, w, 16, clamp_min_to_zero=True)  # value = scale * q + minimum
    scale = scale.reshape(n_super, 8)
    offset = (-minimum).reshape(n_super, 8)  # >= 0, subtracted
    d = (scale.max(axis=1) / 63.0).astype(np.float16).astype(np.float32)  # [n_super]
    dmin = (offset.max(axis=1) / 63.0).astype(np.float16).astype(np.float32)
    sc = np.clip(np.rint(scale / np.where(d > 0, d, 1.0)[:, None]), 0, 63).astype(np.int32)  # [n_super, 8]
    mn = np.clip(np.rint(offset / np.where(dmin > 0, dmin, 1.0)[:, None]), 0, 63).astype(np.int32)
    eff_scale = (d[:, None] * sc).reshape(-1)  # [n_super * 8] the scales as stored
    eff_off = (dmin[:, None] * mn).reshape(-1)
    inv = np.where(eff_scale > 0, 1.0 / np.where(eff_scale > 0, eff_scale, 1.0), 0.0)
    q = np.clip(np.rint((x + eff_off[:, None]) * inv[:, None]), 0, 15).astype(np.uint8)
    return pack_q4_k(d, dmin, sc, mn, q.reshape(n_super, 8, 32))


def quantize_q4_k(values: np.ndarray, importance: np.ndarray | None) -> np.ndarray:
    cols = values.shape[1]
    if cols % 256:
        raise ValueError(f"q4_k needs rows that are a multiple of 256 values, got {cols}")
    return by_row_chunks(values, importance, 256, _super_blocks)


def pack_q4_k(d: np.ndarray, dmin: np.ndarray, sc: np.ndarray, mn: np.ndarray, q: np.ndarray) -> np.ndarray:
    """d, dmin [n]; sc, mn [n, 8] in 0..63; q [n, 8, 32] in 0..15 -> [n, 144] uint8."""
    n = d.shape[0]
    sc = sc.astype(np.uint8)
    mn = mn.astype(np.uint8)
    scales = np.empty((n, 12), dtype=np.uint8)
    # sub-blocks 0-3: 6 bits in bytes 0-3 (scale) and 4-7 (min); sub-blocks 4-7: low 4 bits in
    # bytes 8-11 (scale low nibble, min high nibble), top 2 bits in bits 6-7 of bytes 0-3 / 4-7.
    scales[:, 0:4] = sc[:, 0:4] | ((sc[:, 4:8] >> 4) << 6)
    scales[:, 4:8] = mn[:, 0:4] | ((mn[:, 4:8] >> 4) << 6)
    scales[:, 8:12] = (sc[:, 4:8] & 0x0F) | ((mn[:, 4:8] & 0x0F) << 4)
    qs = (q[:, 0::2, :] & 0x0F) | ((q[:, 1::2, :] & 0x0F) << 4)  # [n, 4, 32]
    head = np.stack([d, dmin], axis=1).astype(np.float16).view(np.uint8)  # [n, 4]
    return np.concatenate([head, scales, qs.reshape(n, 128)], axis=1)
