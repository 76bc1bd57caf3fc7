"""ONNX: one `.onnx` file per chunk, exported from the torch graph with torch.onnx (dynamo), run
with onnxruntime.

Quantized weights stay packed: linear layers become `com.microsoft::MatMulNBits` (4 or 8 bits,
one scale per 32 values, the default zero point of 8 or 128 = symmetric codes), quantized
embeddings `com.microsoft::GatherBlockQuantized` (only the looked-up rows are dequantized) reading
the codes in MatMulNBits' layout, so a tied embedding and head share one initializer. In the
torch graph both are custom ops whose eager forms dequantize; a translation table maps them to
the contrib ops. The graph's own ops use the standard domain at OPSET.

The token axis is dynamic (1 for decode, up to the cache length for prefill), so one file serves
both methods; the caches are inputs and the new entries outputs (kv="io").
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch
from edgeflash.export.targets.chunks import Chunk, chunk_io
from edgeflash.export.targets.graph import ChunkGraph, DenseOps, example_inputs
from edgeflash.export.targets.prepare import PreparedModel
from edgeflash.export.targets.weights import GROUP, TargetWeight
from torch import nn

FORMATS = ("f32", "f16", "bf16", "q8_0", "q4_0")
KV_MODES = ("io",)
DEFAULT_KV = "io"
STATIC_SHAPES = False  # one graph, dynamic token axis
EXTENSION = ".onnx"
OPSET = 21
WEIGHT_FORM = ("q4_0 -> MatMulNBits/GatherBlockQuantized 4-bit and q8_0 -> 8-bit, one float32 scale per 32 "
               "values, symmetric (default zero points); f32/f16 dense as float32")


def methods(prefill_tokens: int) -> dict[str, dict[str, int]]:
    return {"prefill": {"tokens": prefill_tokens}, "decode": {"tokens": 1}}


def pack(w: TargetWeight) -> np.ndarray:
    """Codes as the contrib ops read them: unsigned (code + 8 or + 128), 4-bit values two per byte,
    the even element in the low nibble. uint8 [rows, cols * bits / 8]."""
    rows, cols = w.codes.shape
    if w.kind == "int8":
        return (w.codes.astype(np.int16) + 128).astype(np.uint8)
    u = (w.codes.astype(np.int16) + 8).astype(np.uint8).reshape(rows, cols // 2, 2)
    return (u[..., 0] | (u[..., 1] << 4)).astype(np.uint8)


def _dequantize(packed: torch.Tensor, scales: torch.Tensor, rows: int, cols: int, bits: int) -> torch.Tensor:
    if bits == 8:
        codes = packed.to(torch.int16) - 128
    else:
        codes = torch.stack([packed & 0x0F, packed >> 4], dim=-1).reshape(rows, cols).to(torch.int16) - 8
    return (codes.reshape(rows, cols // GROUP, GROUP).float() * scales.reshape(rows, cols // GROUP, 1)).reshape(rows, cols)


@torch.library.custom_op("edgeflash_onnx::linear_nbits", mutates_args=())
def linear_nbits(x: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, rows: int, cols: int,
                 bits: int) -> torch.Tensor:
    return x @ _dequantize(packed, scales, rows, cols, bits).T


@linear_nbits.register_fake
def _(x, packed, scales, rows, cols, bits):
    return x.new_empty((*x.shape[:-1], rows))


@torch.library.custom_op("edgeflash_onnx::embedding_nbits", mutates_args=())
def embedding_nbits(tokens: torch.Tensor, packed: torch.Tensor, scales: torch.Tensor, rows: int, cols: int,
                    bits: int) -> torch.Tensor:
    return _dequantize(packed, scales.float(), rows, cols, bits)[tokens]


@embedding_nbits.register_fake
def _(tokens, packed, scales, rows, cols, bits):
    return packed.new_empty((*tokens.shape, cols), dtype=torch.float32)


class NBitsLinear(nn.Module):
    def __init__(self, w: TargetWeight, bias: TargetWeight | None, packed: torch.Tensor):
        super().__init__()
        rows, cols = w.shape
        self.rows, self.cols, self.bits = rows, cols, w.bits
        self.register_buffer("packed", packed)  # uint8 [N, blocks, blob]
        self.register_buffer("scales", torch.from_numpy(w.scales.reshape(-1).copy()))  # [N * blocks]
        self.bias = None if bias is None else nn.Parameter(torch.from_numpy(bias.values().copy()), requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = torch.ops.edgeflash_onnx.linear_nbits(x, self.packed, self.scales, self.rows, self.cols, self.bits)
        return y if self.bias is None else y + self.bias


class NBitsEmbedding(nn.Module):
    def __init__(self, w: TargetWeight, packed: torch.Tensor):
        super().__init__()
        rows, cols = w.shape
        self.rows, self.cols, self.bits = rows, cols, w.bits
        self.register_buffer("packed", packed)  # uint8 [rows, blocks, blob], the head's own layout
        # float16 holds q4_0 / q8_0 scales exactly; GatherBlockQuantized wants them at data's rank
        self.register_buffer("scales", torch.from_numpy(w.scales.astype(np.float16)[:, :, None].copy()))  # [rows, blocks, 1]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return torch.ops.edgeflash_onnx.embedding_nbits(tokens, self.packed, self.scales, self.rows, self.cols,
                                                         self.bits)


class NBitsOps(DenseOps):
    """Packed codes in MatMulNBits' layout [N, blocks, blob] for both ops: a tied embedding's lookup
    (GatherBlockQuantized over the blocks axis) and the head then share one initializer."""

    def __init__(self):
        self.packed: dict[str, torch.Tensor] = {}

    def _packed(self, w: TargetWeight) -> torch.Tensor:
        if w.name not in self.packed:
            rows, cols = w.shape
            self.packed[w.name] = torch.from_numpy(pack(w).reshape(rows, cols // GROUP, -1))
        return self.packed[w.name]

    def linear(self, w: TargetWeight, bias: TargetWeight | None) -> nn.Module:
        return super().linear(w, bias) if w.kind == "dense" else NBitsLinear(w, bias, self._packed(w))

    def embedding(self, w: TargetWeight) -> nn.Module:
        return super().embedding(w) if w.kind == "dense" else NBitsEmbedding(w, self._packed(w))


def _translation_table() -> dict:
    """torch custom op -> ONNX contrib op. onnxscript checks every op against a schema, so the two
    contrib ops are described to onnx first (onnxruntime brings its own definitions)."""
    import onnxscript
    from onnx import defs

    def schema(name: str, inputs: list[tuple[str, str]], types: list[tuple[str, list[str]]], attrs: list[str]):
        if defs.has(name, "com.microsoft"):
            return
        p = defs.OpSchema.FormalParameter
        defs.register_schema(defs.OpSchema(
            name, "com.microsoft", 1, inputs=[p(n, t) for n, t in inputs], outputs=[p("Y", "T1")],
            type_constraints=[(t, allowed, "") for t, allowed in types],
            attributes=[defs.OpSchema.Attribute(a, defs.OpSchema.AttrType.INT, "") for a in attrs]))

    schema("MatMulNBits", [("A", "T1"), ("B", "T2"), ("scales", "T1")],
           [("T1", ["tensor(float)"]), ("T2", ["tensor(uint8)"])], ["K", "N", "bits", "block_size"])
    schema("GatherBlockQuantized", [("data", "T2"), ("indices", "Tind"), ("scales", "T1")],
           [("T1", ["tensor(float)", "tensor(float16)"]), ("T2", ["tensor(uint8)"]), ("Tind", ["tensor(int64)"])],
           ["gather_axis", "quantize_axis", "block_size", "bits"])
    msft = onnxscript.values.Opset("com.microsoft", 1)
    op = onnxscript.opset21

    def linear(x, packed, scales, rows: int, cols: int, bits: int):
        return msft.MatMulNBits(x, packed, scales, K=cols, N=rows, bits=bits, block_size=GROUP)

    def embedding(tokens, packed, scales, rows: int, cols: int, bits: int):
        rows_f16 = msft.GatherBlockQuantized(packed, tokens, scales, gather_axis=0, quantize_axis=2,
                                             block_size=GROUP, bits=bits)  # [T, blocks, 32] float16
        shape = op.Concat(op.Shape(tokens), op.Constant(value_ints=[cols]), axis=0)
        return op.Cast(op.Reshape(rows_f16, shape), to=1)  # [T, cols] float32

    return {torch.ops.edgeflash_onnx.linear_nbits.default: linear,
            torch.ops.edgeflash_onnx.embedding_nbits.default: embedding}


def write_chunk(prepared: PreparedModel, chunk: Chunk, out_dir: Path, *, kv: str, cache_len: int,
                prefill_tokens: int) -> dict[str, object]:
    spec = prepared.source.spec
    graph = ChunkGraph(spec, prepared.weights, chunk.layers, first=chunk.first, last_chunk=chunk.last,
                       cache_len=cache_len, kv=kv, ops=NBitsOps()).eval()
    inputs, outputs = chunk_io(spec, chunk, kv, cache_len)
    path = out_dir / f"chunk{chunk.index}{EXTENSION}"
    export_graph(graph, path, [i["name"] for i in inputs], [o["name"] for o in outputs], cache_len)
    return {"file": path.name, "layers": [chunk.layers.start, chunk.layers.stop], "embedding": chunk.first,
            "head": chunk.last, "inputs": inputs, "outputs": outputs, "bytes": path.stat().st_size,
            "ops": op_counts(path)}


def export_graph(graph: ChunkGraph, path: Path, input_names: list[str], output_names: list[str],
                 cache_len: int) -> None:
    tokens = torch.export.Dim("T", min=2, max=cache_len)
    args = example_inputs(graph, 2)
    dynamic = ({0: tokens}, {0: tokens}, tuple(None for _ in args[2:]))  # forward(x, input_pos, *rest)
    with torch.no_grad():
        exported = torch.export.export(graph, args, dynamic_shapes=dynamic, strict=False)
        program = torch.onnx.export(exported, dynamo=True, opset_version=OPSET, input_names=input_names,
                                    output_names=output_names, custom_translation_table=_translation_table(),
                                    verbose=False)
    program.save(str(path), external_data=False)


def op_counts(path: Path) -> dict[str, int]:
    import onnx

    counts: dict[str, int] = {}
    for node in onnx.load(str(path), load_external_data=False).graph.node:
        key = f"{node.domain}::{node.op_type}" if node.domain else node.op_type
        counts[key] = counts.get(key, 0) + 1
    return dict(sorted(counts.items()))
