"""One entry point from float weights to packed bytes: `quantize_matrix(values, fmt, method, importance)`.

`rtn` uses the native kernels' quantizers where they exist (for the 32-block formats ggml's rounding,
bit-identical with llama.cpp; for q3_k a least-squares fit); q4_k, which the kernels only read, and
every `weighted` method run in numpy here.
"""

from __future__ import annotations

import numpy as np
from edgeflash.export.quant.q4_k import quantize_q4_k
from edgeflash.export.quant.q4_lut import quantize_q4_lut
from edgeflash.export.quant.weighted import (
    quantize_weighted_q4_0,
    quantize_weighted_q4_1,
    quantize_weighted_q5_0,
    quantize_weighted_q8_0,
)

_NATIVE_RTN = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q3_k")
_WEIGHTED = {
    "q4_0": quantize_weighted_q4_0, "q4_1": quantize_weighted_q4_1, "q5_0": quantize_weighted_q5_0,
    "q8_0": quantize_weighted_q8_0, "q4_k": quantize_q4_k, "q4_lut": quantize_q4_lut,
}


def quantize_matrix(values: np.ndarray, fmt: str, method: str = "rtn",
                    importance: np.ndarray | None = None) -> np.ndarray:
    """float32 `[rows, cols]` -> uint8 `[rows, row_bytes(fmt, cols)]`.

    `importance` (`[cols]`, >= 0) weights each column's error for method "weighted"; None weighs
    all columns equally (the search still beats plain rounding on the unweighted error)."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    if values.ndim != 2:
        raise ValueError(f"quantize_matrix expects a 2-D matrix, got shape {values.shape}")
    if not np.isfinite(values).all():
        raise ValueError("weights contain NaN or infinity")
    if method == "rtn":
        if fmt in _NATIVE_RTN:
            from edgeflash import kernels

            return kernels.quantize(values, fmt)
        if fmt == "q4_k":
            return quantize_q4_k(values, None)
        if fmt == "q4_lut":
            return quantize_q4_lut(values, None)
    elif method == "weighted" and fmt in _WEIGHTED:
        if importance is not None:
            importance = prepare_importance(importance, values.shape[1])
        return _WEIGHTED[fmt](values, importance)
    raise ValueError(f"no quantizer for format {fmt!r} with method {method!r}")


def prepare_importance(importance: np.ndarray, cols: int) -> np.ndarray:
    """Per-column E[x^2] normalized to mean 1 with a floor, so no column is ignored entirely
    (calibration text never exercises some directions, yet other text will)."""
    imp = np.asarray(importance, dtype=np.float64).reshape(-1)
    if imp.shape != (cols,):
        raise ValueError(f"importance has {imp.size} values, the matrix has {cols} columns")
    if not np.isfinite(imp).all() or (imp < 0).any():
        raise ValueError("importance must be finite and >= 0")
    mean = imp.mean()
    if mean <= 0:
        return np.ones(cols, dtype=np.float32)
    return (imp / mean + 0.01).astype(np.float32)


def dequantize_matrix(raw: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    """float32 [rows, cols] from packed rows (native where the kernels know the format)."""
    from edgeflash import kernels
    from edgeflash.runtime.tensors import dequantize_raw

    raw = np.ascontiguousarray(raw)
    if fmt in kernels.KERNEL_FORMATS:
        if fmt == "f32":
            return raw.view(np.float32).reshape(raw.shape[0], cols).copy()
        return kernels.dequantize(raw.reshape(-1, raw.shape[-1]), fmt, cols)
    return dequantize_raw(raw, fmt, cols)
