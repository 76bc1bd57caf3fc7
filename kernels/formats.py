"""Weight formats: names and row sizes (the byte layouts are in docs/weight-formats.md).

A weight matrix [rows, cols] is stored row-major as a uint8 array [rows, row_bytes(fmt, cols)]
(y = W @ x, like torch Linear). The GGML formats are bit-exact with GGUF tensors.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class FormatInfo:
    name: str
    block_elems: int   # elements per block along a row
    block_bytes: int   # bytes per block
    row_header: int    # bytes before the first block of a row (q4_lut's level table)
    quantized: bool


FORMATS: dict[str, FormatInfo] = {
    f.name: f
    for f in (
        FormatInfo("f32", 1, 4, 0, False),
        FormatInfo("f16", 1, 2, 0, False),
        FormatInfo("q8_0", 32, 34, 0, True),
        FormatInfo("q4_0", 32, 18, 0, True),
        FormatInfo("q4_1", 32, 20, 0, True),
        FormatInfo("q5_0", 32, 22, 0, True),
        FormatInfo("q4_k", 256, 144, 0, True),
        FormatInfo("q6_k", 256, 210, 0, True),
        FormatInfo("q4_lut", 32, 16, 32, True),
    )
}

# Formats whose weights quantize() can produce (K-quants come from GGUF files as they are).
QUANTIZABLE = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_lut")
KV_FORMATS = ("f16", "q8_0")


def format_info(fmt: object) -> FormatInfo:
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name (str), got {type(fmt).__name__}")
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}, expected one of {', '.join(FORMATS)}") from None


def check_cols(fmt: str, cols: object, what: str = "cols") -> int:
    info = format_info(fmt)
    if isinstance(cols, bool) or not isinstance(cols, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(cols).__name__}")
    if cols <= 0 or cols % info.block_elems:
        raise ValueError(f"format {fmt} needs {what} to be a positive multiple of {info.block_elems}, got {cols}")
    return int(cols)


def row_bytes(fmt: str, cols: int) -> int:
    """Bytes of one row of `cols` elements in `fmt`."""
    info = format_info(fmt)
    cols = check_cols(fmt, cols)
    return info.row_header + cols // info.block_elems * info.block_bytes


def bundle_bytes(d_model: int, gate_fmt: str, up_fmt: str, down_fmt: str) -> int:
    """Bytes of one neuron bundle (gate row, up row, down column) before any padding."""
    return row_bytes(gate_fmt, d_model) + row_bytes(up_fmt, d_model) + row_bytes(down_fmt, d_model)


def kv_row_bytes(fmt: str, head_dim: int) -> int:
    """Bytes of one cached key or value vector of one head."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"KV cache format must be one of {', '.join(KV_FORMATS)}, got {fmt!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim <= 0 or head_dim % 16:
        raise ValueError(f"head_dim must be a positive multiple of 16, got {head_dim}")
    return row_bytes(fmt, int(head_dim))
