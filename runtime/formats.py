"""Weight formats: names, GGML type ids and block geometry.

A matrix is stored row-major as `[rows, row_bytes]` uint8, each row a sequence of blocks of its
format along the columns. GGML layouts are bit-exact with GGUF files; `q4_lut` is edgeflash's own
non-uniform 4-bit format (docs/weight-formats.md).
"""

from __future__ import annotations

from dataclasses import dataclass

from edgeflash.base.errors import UnsupportedModelError


@dataclass(frozen=True)
class Format:
    name: str
    ggml_type: int | None  # GGML type id, None for formats GGUF does not have
    block_elems: int  # columns per block
    block_bytes: int  # bytes per block
    row_header_bytes: int = 0  # bytes before the first block of each row

    def row_bytes(self, cols: int) -> int:
        if cols % self.block_elems:
            raise ValueError(f"format {self.name} needs rows that are a multiple of {self.block_elems} "
                             f"columns, got {cols}")
        return self.row_header_bytes + cols // self.block_elems * self.block_bytes

    @property
    def bits_per_weight(self) -> float:
        return 8 * self.block_bytes / self.block_elems


FORMATS: dict[str, Format] = {f.name: f for f in [
    Format("f32", 0, 1, 4),
    Format("f16", 1, 1, 2),
    Format("bf16", 30, 1, 2),
    Format("q4_0", 2, 32, 18),
    Format("q4_1", 3, 32, 20),
    Format("q5_0", 6, 32, 22),
    Format("q5_1", 7, 32, 24),
    Format("q8_0", 8, 32, 34),
    Format("q2_k", 10, 256, 84),
    Format("q3_k", 11, 256, 110),
    Format("q4_k", 12, 256, 144),
    Format("q5_k", 13, 256, 176),
    Format("q6_k", 14, 256, 210),
    Format("q4_lut", None, 32, 16, row_header_bytes=32),
]}

FORMAT_BY_GGML_TYPE: dict[int, Format] = {f.ggml_type: f for f in FORMATS.values() if f.ggml_type is not None}


def get_format(name: str) -> Format:
    try:
        return FORMATS[name]
    except KeyError:
        raise UnsupportedModelError(f"unknown weight format {name!r}; known: {', '.join(FORMATS)}") from None
