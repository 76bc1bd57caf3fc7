"""A weight tensor as stored: format, logical shape and raw bytes."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from edgeflash.kernels.formats import FormatInfo, get_format


@dataclass
class Tensor:
    """Raw weights. `raw` is uint8 `[rows, row_bytes]` (a 1-D tensor is one row); it may be a
    read-only view into a memory-mapped file."""

    name: str
    fmt: str
    shape: tuple[int, ...]  # logical shape, numpy order: a matrix is [rows, cols]
    raw: np.ndarray

    @property
    def format(self) -> FormatInfo:
        return get_format(self.fmt)

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1

    @property
    def cols(self) -> int:
        return self.shape[-1]

    @property
    def nbytes(self) -> int:
        return int(self.raw.nbytes)

    def dequantize(self) -> np.ndarray:
        """float32 values in the logical shape."""
        return dequantize_raw(self.raw, self.fmt, self.cols).reshape(self.shape)

    def with_bytes_from(self, buffer: np.ndarray, offset: int) -> Tensor:
        """The same tensor, its bytes taken from `buffer[offset:]` (a resident copy read from flash)."""
        return Tensor(self.name, self.fmt, self.shape, buffer[offset:offset + self.nbytes].reshape(self.raw.shape))

    def take_rows(self, index: np.ndarray) -> Tensor:
        """A new tensor made of the given rows (any format: rows are independent)."""
        raw = self.raw.reshape(self.rows, -1)[index]
        return Tensor(self.name, self.fmt, (len(index), *self.shape[1:]) if len(self.shape) > 1 else self.shape, raw)

    @staticmethod
    def from_array(name: str, array: np.ndarray, fmt: str = "f32") -> Tensor:
        """Wrap a float array as an f32/f16 tensor (quantized formats go through a quantizer)."""
        if fmt not in ("f32", "f16"):
            raise ValueError(f"from_array stores f32 or f16, not {fmt!r}")
        data = np.ascontiguousarray(array, dtype=np.float32 if fmt == "f32" else np.float16)
        rows = int(np.prod(data.shape[:-1])) if data.ndim > 1 else 1
        return Tensor(name, fmt, tuple(data.shape), data.reshape(rows, -1).view(np.uint8))


def dequantize_raw(raw: np.ndarray, fmt: str, cols: int) -> np.ndarray:
    """`[rows, row_bytes]` uint8 in `fmt` -> float32 `[rows, cols]`."""
    raw = np.ascontiguousarray(raw).reshape(-1, get_format(fmt).row_bytes(cols))
    if fmt == "f32":
        return raw.view(np.float32).copy()
    if fmt == "f16":
        return raw.view(np.float16).astype(np.float32)
    if fmt == "bf16":
        return (raw.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if fmt == "q4_lut":
        return _dequantize_q4_lut(raw, cols)
    import gguf

    qtype = gguf.GGMLQuantizationType(get_format(fmt).ggml_type)
    return gguf.quants.dequantize(raw, qtype).astype(np.float32, copy=False).reshape(raw.shape[0], cols)


def _dequantize_q4_lut(raw: np.ndarray, cols: int) -> np.ndarray:
    # Row header: f32 scale s, 16 int8 levels; then 17-byte blocks: a code k (the block's scale is
    # s * k^2, computed in float32 as the kernels do) and 16 bytes of 32 nibbles (byte j: element j
    # in the low nibble, element j + 16 in the high nibble).
    rows, nb = raw.shape[0], cols // 32
    scale = raw[:, 0:4].copy().view("<f4")  # [rows, 1]
    levels = raw[:, 4:20].view(np.int8).astype(np.float32)  # [rows, 16]
    blocks = raw[:, 20:].reshape(rows, nb, 17)
    k = blocks[:, :, 0].astype(np.float32)
    d = scale * (k * k)  # [rows, nb]
    q = blocks[:, :, 1:]
    idx = np.concatenate([q & 0x0F, q >> 4], axis=2).reshape(rows, cols)  # [rows, cols]
    values = np.take_along_axis(levels, idx.astype(np.intp), axis=1).reshape(rows, nb, 32)
    return (values * d[:, :, None]).reshape(rows, cols)

