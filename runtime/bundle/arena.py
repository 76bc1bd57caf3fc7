"""A layer's FFN stored once, as its neuron arena, seen as a tensor.

Slot j of the arena holds neuron `order[j]`: its gate row, up row and down column, each a row of
d_model values, back to back (gate and up in one format at offsets 0 and row_bytes, down from
2 x row_bytes in its own format), padded to `stride`. The native engine runs the dense FFN over it in place (every neuron, no threshold);
sparse mode reads neuron bundles from the same bytes. Readers that want dense matrices (the numpy
reference, re-export) get them from `dense()`: gate and up as zero-copy strided views, down
transposed into float32, in slot order (a permutation of the neurons leaves the FFN unchanged).
"""

from __future__ import annotations

import numpy as np
from edgeflash.kernels.formats import get_format
from edgeflash.runtime.tensors import Tensor, dequantize_raw

ARENA_TENSOR = "ffn_arena"  # per-layer tensor name (blk.N.ffn_arena), also the engine's slot
ARENA_PARTS = ("gate", "up", "down")
DENSE_NAMES = {"ffn_gate.weight": "gate", "ffn_up.weight": "up", "ffn_down.weight": "down"}


def arena_tensor_name(layer: int) -> str:
    return f"blk.{layer}.{ARENA_TENSOR}"


def arena_layer(name: str) -> int:
    """The layer of an arena tensor name (`blk.N.ffn_arena`)."""
    return int(name.split(".")[1])


class ArenaTensor(Tensor):
    """raw: uint8 `[n_neurons, stride]`; shape `(n_neurons, d_model)`; fmt: the gate and up rows'
    format; `down_fmt`: the down columns'."""

    def __init__(self, name: str, fmt: str, n_neurons: int, d_model: int, raw: np.ndarray, order: np.ndarray,
                 down_fmt: str | None = None):
        super().__init__(name, fmt, (n_neurons, d_model), raw)
        self.order = np.asarray(order)  # slot -> neuron id
        self.down_fmt = down_fmt or fmt
        self._dense: dict[str, Tensor] = {}

    @property
    def stride(self) -> int:
        return int(self.raw.shape[1])

    @property
    def part_bytes(self) -> int:
        return get_format(self.fmt).row_bytes(self.cols)

    def part_format(self, which: str) -> str:
        return self.down_fmt if which == "down" else self.fmt

    def part(self, which: str) -> np.ndarray:
        """uint8 `[n_neurons, row_bytes]` strided view of one part (gate, up or down) of every bundle."""
        k = ARENA_PARTS.index(which)
        return self.raw[:, k * self.part_bytes:k * self.part_bytes + get_format(self.part_format(which)).row_bytes(
            self.cols)]

    def part_values(self, which: str) -> np.ndarray:
        """float32 `[n_neurons, d_model]` of one part, in slot order."""
        return dequantize_raw(np.ascontiguousarray(self.part(which)), self.part_format(which), self.cols)

    def dense(self, name: str) -> Tensor:
        """`ffn_gate.weight` / `ffn_up.weight` (strided views, [d_ff, d_model]) or `ffn_down.weight`
        (float32 [d_model, d_ff], built on first use), neurons in slot order; kept, so that caches
        keyed by tensor identity stay valid."""
        if name not in self._dense:
            prefix = self.name[:-len(ARENA_TENSOR)]
            which = DENSE_NAMES[name]
            if which == "down":
                values = np.ascontiguousarray(self.part_values("down").T)  # [d_model, d_ff]
                self._dense[name] = Tensor.from_array(prefix + name, values, "f32")
            else:
                self._dense[name] = Tensor(prefix + name, self.fmt, (self.rows, self.cols), self.part(which))
        return self._dense[name]

    def dequantize(self) -> np.ndarray:
        raise TypeError(f"{self.name} is a neuron arena: read its parts with part_values() or dense()")

    def with_bytes_from(self, buffer: np.ndarray, offset: int) -> ArenaTensor:
        raw = buffer[offset:offset + self.nbytes].reshape(self.raw.shape)
        return ArenaTensor(self.name, self.fmt, self.rows, self.cols, raw, self.order, self.down_fmt)

    def take_rows(self, index: np.ndarray) -> Tensor:
        raise TypeError(f"{self.name} is a neuron arena, not a matrix of rows")


# The down columns' format in an arena whose gate and up rows are 4-bit: a block of a column spans
# 32 output dimensions of one neuron, and a residual-stream outlier dimension then sets the scale
# of 31 others. Measured on 512 held-out tokens (perplexity, source 26.0 / 37.4 for SmolLM2 /
# Gemma 3's float weights as dense q4_0 rows 31.1 / 37.4): 4-bit columns 33.3 / 41.6, q4_1 columns
# 31.3 / 39.0, q5_0 columns 31.0 / 37.8.
ARENA_DOWN_FORMAT = {"q4_0": "q5_0", "q4_1": "q5_0", "q4_lut": "q5_0"}


def arena_down_format(fmt: str) -> str:
    return ARENA_DOWN_FORMAT.get(fmt, fmt)


def is_one_copy(part_names: list[str], part_formats: list[str], part_offsets: list[int], d_model: int) -> bool:
    """Whether arena parts are laid out as the engine reads an arena in place: gate and up in one
    format at offsets 0 and row_bytes, then down (in any arena format) at 2 x row_bytes."""
    if list(part_names) != list(ARENA_PARTS) or part_formats[0] != part_formats[1]:
        return False
    rb = get_format(part_formats[0]).row_bytes(d_model)
    return list(part_offsets) == [0, rb, 2 * rb]
