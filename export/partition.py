"""The partition stage: which bytes go into which block, and the FFN neuron arenas.

Blocks (docs/bundle-format.md): `embedding`, per layer `layer.{i}.attention`, `layer.{i}.ffn`
(dense, for exact mode), `layer.{i}.neurons` (the arena, for sparse/windowed mode) and
`layer.{i}.predictor`, then `globals` and an untied `head`. Inside a block the small 1-D
tensors (norms, biases) come first, so a reader that only needs them reads the first page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from edgeflash.export.calibrate import Predictor
from edgeflash.export.quant.methods import quantize_matrix
from edgeflash.export.quantize import QuantizedTensor, source_values
from edgeflash.runtime.bundle.layout import (
    NEURON_STRIDE_ALIGNMENT,
    align_up,
    block_name,
    block_of_tensor,
    block_sort_key,
)
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor

# matrices in the order a forward pass uses them
_MATRIX_ORDER = ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.", "ffn_down.",
                 "predictor_a.", "predictor_b.")


@dataclass
class Arena:
    layer: int
    order: np.ndarray  # [d_ff] slot -> neuron id
    stride: int
    d_model: int
    parts: list[tuple[str, str, int, int]]  # (name, format, offset in bundle, nbytes)
    data: np.ndarray  # uint8 [d_ff, stride]


@dataclass
class BlockPlan:
    name: str
    kind: str
    layer: int | None
    tensors: list[tuple[Tensor, str]] = field(default_factory=list)  # (tensor, role) in file order
    arena: Arena | None = None


def build_arena(source: ModelSource, layer: int, order: np.ndarray, fmt: str,
                quantized: dict[str, QuantizedTensor]) -> Arena:
    """Neuron bundles of one layer, hot first: slot j holds neuron order[j] as gate row, up row and
    down column (each a row of d_model values in `fmt`), padded to a cache-line stride.

    Gate and up rows reuse the dense tensors' bytes when those are already in `fmt` (sparse and
    dense mode then compute identical dot products); down columns are quantized from the source."""
    d_model = source.spec.d_model
    pieces = []
    for part in ("gate", "up", "down"):
        name = f"blk.{layer}.ffn_{part}.weight"
        dense = quantized[name].tensor
        if part != "down" and dense.fmt == fmt:
            rows = np.asarray(dense.raw).reshape(dense.rows, -1)[order]
        else:
            values = source_values(source.tensors[name])  # gate/up [d_ff, d_model]; down [d_model, d_ff]
            rows = quantize_matrix(np.ascontiguousarray(values.T if part == "down" else values)[order], fmt, "rtn")
        pieces.append((part, rows))
    bundle = sum(r.shape[1] for _, r in pieces)
    stride = align_up(bundle, NEURON_STRIDE_ALIGNMENT)
    data = np.zeros((len(order), stride), dtype=np.uint8)
    parts, offset = [], 0
    for part, rows in pieces:
        data[:, offset:offset + rows.shape[1]] = rows
        parts.append((part, fmt, offset, rows.shape[1]))
        offset += rows.shape[1]
    return Arena(layer=layer, order=order.astype(np.int32), stride=stride, d_model=d_model, parts=parts, data=data)


def predictor_tensors(p: Predictor) -> list[Tensor]:
    return [Tensor.from_array(f"blk.{p.layer}.predictor_a.weight", p.a, "f16"),
            Tensor.from_array(f"blk.{p.layer}.predictor_b.weight", p.b, "f16")]


def plan_blocks(quantized: dict[str, QuantizedTensor], arenas: dict[int, Arena],
                predictors: list[Predictor]) -> list[BlockPlan]:
    blocks: dict[str, BlockPlan] = {}

    def get(name: str) -> BlockPlan:
        if name not in blocks:
            kind = name.split(".")[-1] if name.startswith("layer.") else name
            layer = int(name.split(".")[1]) if name.startswith("layer.") else None
            blocks[name] = BlockPlan(name=name, kind=kind, layer=layer)
        return blocks[name]

    for name, q in quantized.items():
        get(block_of_tensor(name)).tensors.append((q.tensor, q.plan.role))
    for p in predictors:
        for t in predictor_tensors(p):
            get(block_of_tensor(t.name)).tensors.append((t, "predictor"))
    for layer, arena in arenas.items():
        get(block_name("neurons", layer)).arena = arena
    for block in blocks.values():
        block.tensors.sort(key=lambda item: _tensor_key(item[0]))
    return [blocks[n] for n in sorted(blocks, key=block_sort_key)]


def _tensor_key(t: Tensor) -> tuple[int, int, str]:
    if len(t.shape) == 1:
        return (0, 0, t.name)
    for i, marker in enumerate(_MATRIX_ORDER):
        if marker in t.name:
            return (1, i, t.name)
    return (1, len(_MATRIX_ORDER), t.name)
