"""The partition stage: which bytes go into which block, decided before any weight is quantized.

Every tensor's stored size follows from its plan (format and shape), so the whole layout of
weights.bin is known up front and the streaming export writes each block at its place as soon
as its layer is done, in any order (a tied embedding, whose importance comes from the head's
input, is written last).

Blocks (docs/bundle-format.md): `embedding`, per layer `layer.{i}.attention`, `layer.{i}.ffn`
(its norms and the FFN's one copy, the neuron arena), `layer.{i}.predictor`, then `globals` and an
untied `head`. With `keep` the dense FFN stays the source's bytes and the arena (q8_0) goes to a
`layer.{i}.neurons` block; `--no-neuron-arena` stores only the dense FFN. Inside a block the small
1-D tensors come first, so a reader that only needs them reads the first page.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
from edgeflash.export.quant.config import ARENA_FORMATS, ARENA_KEEP, QuantConfig
from edgeflash.kernels.formats import get_format
from edgeflash.runtime.bundle.arena import ARENA_PARTS, DENSE_NAMES, ArenaTensor, arena_down_format
from edgeflash.runtime.bundle.layout import (
    NEURON_STRIDE_ALIGNMENT,
    align_up,
    block_name,
    block_of_tensor,
    block_sort_key,
)
from edgeflash.runtime.source import ModelSource

# matrices in the order a forward pass uses them
_MATRIX_ORDER = ("attn_q.", "attn_k.", "attn_v.", "attn_output.", "ffn_gate.", "ffn_up.", "ffn_down.",
                 "predictor_a.", "predictor_b.")
FFN_LAYOUTS = ("arena", "dense+neurons", "dense")
# Source formats an arena keeps as they are (neuron_format "keep"): the ones the arena kernels run
# from gathered or strided rows of d_model values (a K-quant row only exists where d_model is a
# multiple of 256, so a source holding one can keep it). Other formats become KEPT_ARENA_FALLBACK.
ARENA_KEEPS = (*ARENA_FORMATS, "q4_k", "q6_k")
KEPT_ARENA_FALLBACK = "q8_0"


@dataclass(frozen=True)
class TensorSlot:
    name: str
    fmt: str
    shape: tuple[int, ...]
    role: str

    @property
    def nbytes(self) -> int:
        rows = int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1
        return rows * get_format(self.fmt).row_bytes(self.shape[-1])


@dataclass(frozen=True)
class ArenaSlot:
    layer: int
    n_neurons: int
    d_model: int
    fmt: str  # gate and up rows
    down_fmt: str  # down columns

    def part_format(self, part: str) -> str:
        return self.down_fmt if part == "down" else self.fmt

    @property
    def part_bytes(self) -> int:
        return get_format(self.fmt).row_bytes(self.d_model)

    @property
    def stride(self) -> int:
        return align_up(2 * self.part_bytes + get_format(self.down_fmt).row_bytes(self.d_model),
                        NEURON_STRIDE_ALIGNMENT)

    @property
    def nbytes(self) -> int:
        return self.n_neurons * self.stride

    @property
    def parts(self) -> list[tuple[str, str, int, int]]:
        """(name, format, offset in a bundle, bytes) of gate, up and down."""
        return [(p, self.part_format(p), k * self.part_bytes, get_format(self.part_format(p)).row_bytes(self.d_model))
                for k, p in enumerate(ARENA_PARTS)]


@dataclass
class BlockSpec:
    name: str
    kind: str
    layer: int | None
    tensors: list[TensorSlot] = field(default_factory=list)  # in file order
    arena: ArenaSlot | None = None


def ffn_layout(config: QuantConfig, spec_d_ff: int, d_model: int, neuron_arena: bool) -> str:
    """`arena` (the FFN stored once, as its arena), `dense+neurons` (`keep`: the source's dense bytes,
    plus a q8_0 arena for sparse mode) or `dense` (no arena: --no-neuron-arena)."""
    if not neuron_arena:
        return "dense"
    plan = config.plan("blk.0.ffn_up.weight", (spec_d_ff, d_model))
    return "dense+neurons" if plan.format == "keep" and config.neuron_format != ARENA_KEEP else "arena"


def source_format(source: ModelSource, name: str) -> str:
    """The stored format of a canonical tensor; a bundle source's FFN matrices are its arenas' parts."""
    t = source.tensors.get(name)
    if t is not None:
        return t.fmt
    arena = source.tensors[name.rsplit(".", 2)[0] + ".ffn_arena"]
    assert isinstance(arena, ArenaTensor)
    return arena.part_format(DENSE_NAMES[name.split(".", 2)[2]])


def arena_formats(config: QuantConfig, source: ModelSource, layer: int, layout: str) -> tuple[str, str]:
    """(gate and up, down) formats of a layer's arena. With neuron_format "keep" gate and up are the
    source's rows as they are (when both share a format the arena kernels run) and down, whose
    columns no source stores, is q8_0: 8 bits per value, about 0.3% of a block's range."""
    fmt = config.arena_format()
    if fmt == ARENA_KEEP:
        gate, up = (source_format(source, f"blk.{layer}.ffn_{p}.weight") for p in ("gate", "up"))
        fmt = gate if gate == up and gate in ARENA_KEEPS else KEPT_ARENA_FALLBACK
        return fmt, KEPT_ARENA_FALLBACK
    return fmt, arena_down_format(fmt, layer, source.spec.n_layers) if layout == "arena" else fmt


def source_shapes(source: ModelSource) -> dict[str, tuple[int, ...]]:
    """Every canonical tensor of the source with its logical shape; a bundle source's arenas stand
    for their layers' dense gate, up and down matrices."""
    shapes: dict[str, tuple[int, ...]] = {}
    for name, t in source.tensors.items():
        if isinstance(t, ArenaTensor):
            prefix = name[:-len("ffn_arena")]
            for dense in DENSE_NAMES:
                shapes[prefix + dense] = t.dense(dense).shape if dense == "ffn_down.weight" else t.shape
        else:
            shapes[name] = t.shape
    return shapes


def plan_layout(source: ModelSource, config: QuantConfig, layout: str, predictor_rank: int) -> list[BlockSpec]:
    """The bundle's blocks and what each holds, from shapes and plans alone."""
    spec = source.spec
    blocks: dict[str, BlockSpec] = {}

    def get(name: str) -> BlockSpec:
        if name not in blocks:
            kind = name.split(".")[-1] if name.startswith("layer.") else name
            layer = int(name.split(".")[1]) if name.startswith("layer.") else None
            blocks[name] = BlockSpec(name=name, kind=kind, layer=layer)
        return blocks[name]

    for name, shape in source_shapes(source).items():
        if layout == "arena" and name.split(".", 2)[-1] in DENSE_NAMES and name.startswith("blk."):
            continue  # stored as the arena
        plan = config.plan(name, shape)
        fmt = source.tensors[name].fmt if plan.format == "keep" else plan.format
        get(block_of_tensor(name)).tensors.append(TensorSlot(name, fmt, tuple(shape), plan.role))
    rank = min(predictor_rank, spec.d_model)
    for layer in range(spec.n_layers):
        if layout != "dense":
            kind = "ffn" if layout == "arena" else "neurons"
            fmt, down = arena_formats(config, source, layer, layout)
            get(block_name(kind, layer)).arena = ArenaSlot(layer, spec.d_ff, spec.d_model, fmt, down)
        if rank > 0 and layout != "dense":
            for tensor, shape in (("predictor_a.weight", (rank, spec.d_model)), ("predictor_b.weight", (spec.d_ff, rank))):
                name = f"blk.{layer}.{tensor}"
                get(block_of_tensor(name)).tensors.append(TensorSlot(name, "f16", shape, "predictor"))
    for block in blocks.values():
        block.tensors.sort(key=_tensor_key)
    return [blocks[n] for n in sorted(blocks, key=block_sort_key)]


def arena_rows(gate: np.ndarray, up: np.ndarray, down_t: np.ndarray, order: np.ndarray, slot: ArenaSlot) -> np.ndarray:
    """uint8 `[n_neurons, stride]`: slot j = neuron order[j] as its gate row, up row and down column
    (`down_t` = the down matrix transposed, each a row of d_model values), packed in `slot.fmt`."""
    data = np.zeros((slot.n_neurons, slot.stride), dtype=np.uint8)
    for (_, _, offset, nbytes), rows in zip(slot.parts, (gate, up, down_t)):
        data[:, offset:offset + nbytes] = rows[order]
    return data


def _tensor_key(t: TensorSlot) -> tuple[int, int, str]:
    if len(t.shape) == 1:
        return (0, 0, t.name)
    for i, marker in enumerate(_MATRIX_ORDER):
        if marker in t.name:
            return (1, i, t.name)
    return (1, len(_MATRIX_ORDER), t.name)
