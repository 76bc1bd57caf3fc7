"""GEMV / small-batch GEMM on quantized weights, dequantization and weight quantization."""

from __future__ import annotations

import numpy as np

from . import _native
from ._arrays import array, index_array, out_array
from .formats import FORMATS, QUANTIZABLE, format_info, row_bytes

PANEL_FORMATS = tuple(name for name in FORMATS if _native.has_panels(name))


def weight_matrix(w: object, fmt: str, cols: int | None = None) -> tuple[np.ndarray, int, int]:
    """Checks a weight matrix and returns (array, rows, cols).

    Accepted: uint8 [rows, row_bytes(fmt, cols)] in any format, float32 [rows, cols] for f32 and
    float16 [rows, cols] for f16. Without `cols`, it is derived from the row size.
    """
    info = format_info(fmt)
    if isinstance(w, np.ndarray) and (fmt, w.dtype) in (("f32", np.float32), ("f16", np.float16)):
        w = array("w", w, w.dtype.type, 2)
        rows, c = w.shape
        if cols is not None and c != cols:
            raise ValueError(f"w has {c} columns, expected {cols}")
        return w, rows, c
    w = array("w", w, np.uint8, 2)
    rows, rb = w.shape
    if cols is None:
        body = rb - info.row_header
        if body <= 0 or body % info.block_bytes:
            raise ValueError(f"w has {rb} bytes per row, which is not a whole number of {fmt} blocks")
        cols = body // info.block_bytes * info.block_elems
    need = row_bytes(fmt, cols)
    if rb != need:
        raise ValueError(f"w has {rb} bytes per row, but {cols} columns of {fmt} take {need}")
    if rows == 0:
        raise ValueError("w has no rows")
    return w, rows, cols


def _activations(x: object, cols: int) -> tuple[np.ndarray, int]:
    x = array("x", x, np.float32, (1, 2))
    if x.shape[-1] != cols:
        raise ValueError(f"x has {x.shape[-1]} columns but the weights have {cols}")
    n = 1 if x.ndim == 1 else x.shape[0]
    if n == 0:
        raise ValueError("x has no rows")
    return x, n


def matmul(w: object, fmt: str, x: object, out: np.ndarray | None = None, *, precise: bool = False) -> np.ndarray:
    """y = x @ W.T for W [rows, cols] in `fmt`; x [n, cols] (or [cols]) float32 -> [n, rows] (or [rows]).

    Quantized weights use Q8 activations (quantized on the fly per block of 32, like ggml);
    precise=True dequantizes the weights instead and keeps the activations in f32.
    """
    x0 = array("x", x, np.float32, (1, 2))
    w, rows, cols = weight_matrix(w, fmt, x0.shape[-1])
    x, n = _activations(x0, cols)
    shape = (rows,) if x.ndim == 1 else (n, rows)
    out = out_array("out", out, shape, inputs=(("x", x), ("w", w)))
    _native.matmul(w, fmt, rows, cols, 0, x, n, out, bool(precise))
    return out


def pack_panels(w: object, fmt: str, cols: int | None = None) -> np.ndarray:
    """The panel layout of a quantized matrix (docs/weight-formats.md): uint8 [panel_bytes], the 16-row
    groups interleaved so a SIMD GEMV reads them in one stream. Run it with `matmul_panels`."""
    w, rows, cols = weight_matrix(w, fmt, cols)
    if not _native.has_panels(fmt):
        raise ValueError(f"format {fmt} has no panel layout (it has: {', '.join(PANEL_FORMATS)})")
    out = np.empty(_native.panel_bytes(fmt, rows, cols), dtype=np.uint8)
    _native.pack_panels(w, fmt, rows, cols, out)
    return out


def matmul_panels(packed: object, fmt: str, rows: int, cols: int, x: object, out: np.ndarray | None = None, *,
                  precise: bool = False) -> np.ndarray:
    """`matmul` of a [rows, cols] matrix in the panel layout (from `pack_panels`)."""
    if not _native.has_panels(fmt):
        raise ValueError(f"format {fmt} has no panel layout (it has: {', '.join(PANEL_FORMATS)})")
    packed = array("packed", packed, np.uint8, 1)
    need = _native.panel_bytes(fmt, rows, cols)
    if packed.size != need:
        raise ValueError(f"packed has {packed.size} bytes, {rows} x {cols} of {fmt} in panels take {need}")
    x, n = _activations(array("x", x, np.float32, (1, 2)), cols)
    shape = (rows,) if x.ndim == 1 else (n, rows)
    out = out_array("out", out, shape, inputs=(("x", x), ("packed", packed)))
    _native.matmul(packed, fmt, rows, cols, 0, x, n, out, bool(precise), True)
    return out


def matmul_rows(w: object, fmt: str, rows: object, x: object, out: np.ndarray | None = None, *,
                precise: bool = False) -> np.ndarray:
    """Only the listed rows of W: y[t, i] = W[rows[i]] . x[t]   -> [n, len(rows)] (e.g. a head shortlist)."""
    x0 = array("x", x, np.float32, (1, 2))
    w, n_rows, cols = weight_matrix(w, fmt, x0.shape[-1])
    ids = index_array("rows", rows, n_rows)
    if ids.size == 0:
        raise ValueError("rows is empty")
    x, n = _activations(x0, cols)
    shape = (ids.size,) if x.ndim == 1 else (n, ids.size)
    out = out_array("out", out, shape, inputs=(("x", x), ("w", w)))
    _native.matmul_rows(w, fmt, n_rows, cols, 0, ids, x, n, out, bool(precise))
    return out


def matmul_columns(w: object, fmt: str, h: object, out: np.ndarray | None = None, *, acts: str = "f32") -> np.ndarray:
    """A matrix stored by columns (row r of W is column r of the product, e.g. a neuron's down column):
    y[t] = sum_r h[t, r] * W[r]   -> [n, cols] (or [cols] for a 1-D h).

    acts="f32" multiplies the decoded columns by h in float; "q8" / "q8x2" (q8_0 columns) quantize
    h times each column's block scales to int8 per block of outputs and group of 32 rows (q8x2: the
    residual once more) and run the integer products (kernels.h, ColumnActs)."""
    if acts not in ("f32", "q8", "q8x2"):
        raise ValueError(f"acts = {acts!r}: expected f32, q8 or q8x2")
    h0 = array("h", h, np.float32, (1, 2))
    w, rows, cols = weight_matrix(w, fmt)
    h = np.ascontiguousarray(h0.reshape(-1, h0.shape[-1]))
    if h.shape[1] != rows:
        raise ValueError(f"h has {h.shape[1]} values per token, the matrix has {rows} rows")
    n = h.shape[0]
    shape = (cols,) if h0.ndim == 1 else (n, cols)
    out = out_array("out", out, shape, inputs=(("h", h), ("w", w)))
    _native.matmul_columns(w, fmt, rows, cols, 0, h, n, out, acts)
    return out


def dequantize(w: object, fmt: str, cols: int, rows: object = None) -> np.ndarray:
    """f32 [rows, cols] from a weight matrix in `fmt` (optionally only the listed rows, in order)."""
    w, n_rows, cols = weight_matrix(w, fmt, cols)
    ids = None if rows is None else index_array("rows", rows, n_rows)
    if ids is not None and ids.size == 0:
        raise ValueError("rows is empty")
    out = np.empty((n_rows if ids is None else ids.size, cols), dtype=np.float32)
    _native.dequantize(w, fmt, n_rows, cols, 0, ids, out)
    return out


def quantize(w: object, fmt: str) -> np.ndarray:
    """uint8 [rows, row_bytes] of a float32 matrix [rows, cols] (a 1-D row gives a 1-D result).

    q8_0, q4_0, q4_1 and q5_0 round exactly like ggml (bit-identical with llama.cpp's files);
    q4_lut fits 16 levels per row by 1-D k-means; q3_k (rows a multiple of 256) fits a
    least-squares scale per 16 values under 6-bit scales; f16/f32 are plain conversions.
    """
    format_info(fmt)
    if fmt not in QUANTIZABLE:
        raise ValueError(f"quantize produces {', '.join(QUANTIZABLE)}; {fmt} weights come from GGUF files as they are")
    w = array("w", w, np.float32, (1, 2))
    rows, cols = (1, w.shape[0]) if w.ndim == 1 else w.shape
    if rows == 0:
        raise ValueError("w has no rows")
    if not np.isfinite(w).all():
        raise ValueError("w contains NaN or infinity")
    rb = row_bytes(fmt, cols)
    out = np.empty((rows, rb), dtype=np.uint8)
    _native.quantize(w, rows, cols, fmt, out)
    return out[0] if w.ndim == 1 else out


def quantize_q4_lut(w: object, importance: object = None) -> np.ndarray:
    """q4_lut rows (uint8 [rows, row_bytes]) of a float32 matrix [rows, cols], fit with per-column
    importance (>= 0, e.g. E[x_j^2] of calibration activations: the error of column j counts with
    it); None weighs the columns alike, as `quantize(w, "q4_lut")` does."""
    w = array("w", w, np.float32, (2,))
    rows, cols = w.shape
    if rows == 0:
        raise ValueError("w has no rows")
    if cols % 32:
        raise ValueError(f"q4_lut needs rows that are a multiple of 32 values, got {cols}")
    if not np.isfinite(w).all():
        raise ValueError("w contains NaN or infinity")
    imp = None
    if importance is not None:
        imp = array("importance", importance, np.float32, (1,))
        if imp.shape != (cols,):
            raise ValueError(f"importance has {imp.size} values, w has {cols} columns")
        if not np.isfinite(imp).all() or (imp < 0).any():
            raise ValueError("importance must be finite and >= 0")
    out = np.empty((rows, row_bytes("q4_lut", cols)), dtype=np.uint8)
    _native.quantize_q4_lut(w, rows, cols, imp, out)
    return out
