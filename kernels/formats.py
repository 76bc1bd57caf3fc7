"""Weight formats: names, GGML type ids and block geometry, read from the C++ table
(kernels/src/formats.cpp) so that each fact is written once. The byte layouts are in
docs/weight-formats.md.

A weight matrix [rows, cols] is stored row-major as a uint8 array [rows, row_bytes(fmt, cols)]
(y = W @ x, like torch Linear), each row a sequence of blocks of its format along the columns.
GGML layouts are bit-exact with GGUF files; `q4_lut` is edgeflash's own non-uniform 4-bit format.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from edgeflash.base.errors import UnsupportedModelError

from . import _native


@dataclass(frozen=True)
class FormatInfo:
    name: str
    ggml_type: int | None  # GGML type id, None for formats GGUF does not have
    block_elems: int  # elements per block along a row
    block_bytes: int  # bytes per block
    row_header: int  # bytes before the first block of each row (q4_lut's level table)
    quantized: bool  # integer codes (run on Q8 activations) rather than floats
    runs: bool  # the kernels run it; other formats are converted when a model loads
    quantizable: bool  # quantize() can write it (K-quants other than q3_k come from GGUF files as they are)

    def row_bytes(self, cols: int) -> int:
        if cols % self.block_elems:
            raise ValueError(f"format {self.name} needs rows that are a multiple of {self.block_elems} "
                             f"columns, got {cols}")
        return self.row_header + cols // self.block_elems * self.block_bytes

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.block_bytes / self.block_elems


FORMATS: dict[str, FormatInfo] = {
    d["name"]: FormatInfo(d["name"], None if d["ggml_type"] < 0 else d["ggml_type"], d["block_elems"],
                          d["block_bytes"], d["row_header"], d["quantized"], d["runs"], d["quantizable"])
    for d in _native.format_table()
}
FORMAT_BY_GGML_TYPE: dict[int, FormatInfo] = {f.ggml_type: f for f in FORMATS.values() if f.ggml_type is not None}
KERNEL_FORMATS = tuple(name for name, f in FORMATS.items() if f.runs)
QUANTIZABLE = tuple(name for name, f in FORMATS.items() if f.quantizable)
# KV cache formats: f16, q8_0 (a GGML q8_0 row per vector) and kivi2 (KIVI's 2-bit cache, kernels/attention.py).
KV_FORMATS = ("f16", "q8_0", "kivi2")
# What a model's wider matrices may be requantized to at load (`edgeflash.load(requantize=...)`).
REQUANTIZE_FORMATS = ("q4_0", "q8_0", "q3_k")
# A matrix whose rows do not split into the target's blocks (q3_k: 256 values) gets this instead.
REQUANTIZE_FALLBACK = "q4_0"


def format_info(fmt: object) -> FormatInfo:
    """A kernel argument's format (TypeError / ValueError for a bad one)."""
    if not isinstance(fmt, str):
        raise TypeError(f"fmt must be a format name (str), got {type(fmt).__name__}")
    try:
        return FORMATS[fmt]
    except KeyError:
        raise ValueError(f"unknown weight format {fmt!r}, expected one of {', '.join(FORMATS)}") from None


def get_format(name: str) -> FormatInfo:
    """A model file's format (a user error when edgeflash does not know it)."""
    try:
        return FORMATS[name]
    except KeyError:
        raise UnsupportedModelError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None


def check_cols(fmt: str, cols: object, what: str = "cols") -> int:
    info = format_info(fmt)
    if isinstance(cols, bool) or not isinstance(cols, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {type(cols).__name__}")
    if cols <= 0 or cols % info.block_elems:
        raise ValueError(f"format {fmt} needs {what} to be a positive multiple of {info.block_elems}, got {cols}")
    return int(cols)


def row_bytes(fmt: str, cols: int) -> int:
    """Bytes of one row of `cols` elements in `fmt`."""
    return format_info(fmt).row_bytes(check_cols(fmt, cols))


def bundle_bytes(d_model: int, gate_fmt: str, up_fmt: str, down_fmt: str) -> int:
    """Bytes of one neuron bundle (gate row, up row, down column) before any padding."""
    return row_bytes(gate_fmt, d_model) + row_bytes(up_fmt, d_model) + row_bytes(down_fmt, d_model)


def kv_row_bytes(fmt: str, head_dim: int) -> int:
    """Bytes of one cached key or value vector of one head (f16 and q8_0; kivi2 has kv_cache_bytes)."""
    if fmt not in ("f16", "q8_0"):
        raise ValueError(f"KV cache format with a row per vector must be f16 or q8_0, got {fmt!r}")
    if isinstance(head_dim, bool) or not isinstance(head_dim, (int, np.integer)) or head_dim <= 0 or head_dim % 16:
        raise ValueError(f"head_dim must be a positive multiple of 16, got {head_dim}")
    return row_bytes(fmt, int(head_dim))


def kv_capacity(fmt: str, slots: int) -> int:
    """Slots a cache of `fmt` keeps when `slots` are wanted (kivi2 rounds up to whole key blocks)."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"KV cache format must be one of {', '.join(KV_FORMATS)}, got {fmt!r}")
    return int(_native.kv_capacity(fmt, int(slots)))


def kv_cache_bytes(fmt: str, n_kv_heads: int, capacity: int, head_dim: int, wraps: bool = True) -> int:
    """Bytes of a layer's K and V caches together (the count the engine allocates and plans with).
    `wraps`: positions may pass the capacity (a ring buffer); a kivi2 cache that never wraps is smaller."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"KV cache format must be one of {', '.join(KV_FORMATS)}, got {fmt!r}")
    return int(_native.kv_cache_bytes(fmt, int(n_kv_heads), int(capacity), int(head_dim), bool(wraps)))


def kv_key_bytes(fmt: str, n_kv_heads: int, capacity: int, head_dim: int, wraps: bool = True) -> int:
    """Bytes of a layer's K cache (kv_cache_bytes minus those of V)."""
    if fmt not in KV_FORMATS:
        raise ValueError(f"KV cache format must be one of {', '.join(KV_FORMATS)}, got {fmt!r}")
    return int(_native.kv_key_bytes(fmt, int(n_kv_heads), int(capacity), int(head_dim), bool(wraps)))
