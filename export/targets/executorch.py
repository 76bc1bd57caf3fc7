"""ExecuTorch: one `.pte` per chunk, lowered to XNNPACK, with `prefill` and `decode` methods.

Weights go through ExecuTorch's own quantization path: torchao's `IntxUnpackedToInt8Tensor`
holding exactly the int4/int8 codes and scales of the quantize stage (no re-quantization), with
int8 per-token dynamic activation quantization on the linear layers (XNNPACK's qd8 kernels:
8da4w for q4_0, 8da8w for q8_0). Quantized embeddings are fused by ExecuTorch into its
`embedding_4bit` / `embedding_byte` ops, so a lookup reads only the rows it needs.

KV cache: with kv="state" each layer's cache is a mutable buffer shared by both methods
(`share_mutable_buffers`), updated in place; with kv="io" it is passed in and the new entries
come out (chunks loaded one at a time keep no state).

activations="f32" (`--et-activations f32`) is the exact alternative: the linear layers keep
float32 activations against the same codes and scales (weight-only quantization). Each such
layer holds its codes as an int8 constant (one byte per value, int4 codes included) and its
scales as float32; inside the XNNPACK delegate a `dequantize_per_tensor` (scale 1, the codes as
they are), a multiply by the group scales (exact: an 8-bit code times a bf16 scale fits float32)
and a float32 `bmm` compute it, so the result differs from the reference runtime's float32
`x @ W.T` only by float rounding. XNNPACK has no float-activation kernel for group-wise 4-bit
weights, so the matrix is expanded to float32 on every call: slower than 8da4w, and the int4
codes take a byte each (unpacking two-per-byte codes needs the portable `embedding_4bit` kernel,
single-threaded and about 3x slower still).
"""

from __future__ import annotations

import math
import operator
from pathlib import Path

import numpy as np
import torch
from edgeflash.export.targets.chunks import Chunk, chunk_io
from edgeflash.export.targets.graph import ChunkGraph, DenseOps, example_inputs
from edgeflash.export.targets.prepare import PreparedModel
from edgeflash.export.targets.weights import GROUP, TargetWeight
from torch import nn

FORMATS = ("f32", "f16", "bf16", "q8_0", "q4_0")
KV_MODES = ("state", "io")
ACTIVATIONS = ("int8", "f32")  # int8: 8da4w / 8da8w (default); f32: weight-only, exact
DEFAULT_ACTIVATIONS = "int8"
DEFAULT_KV = "state"
STATIC_SHAPES = True  # fixed token counts per method
EXTENSION = ".pte"
_CODES = "q4_0 -> int4 and q8_0 -> int8 codes, one bf16 scale per 32 values"
_REST = "embeddings through embedding_4bit / embedding_byte; f32/f16 dense as float32"
WEIGHT_FORM = (f"{_CODES} (torchao IntxUnpackedToInt8Tensor); linear layers with int8 per-token dynamic "
               f"activations on XNNPACK; {_REST}")
WEIGHT_FORM_F32 = (f"{_CODES}; linear layers weight-only with float32 activations (codes held as int8, one byte "
                   f"per value, float32 scales; dequantized and multiplied in float32 inside XNNPACK); {_REST}")


def weight_form(activations: str = DEFAULT_ACTIVATIONS) -> str:
    return WEIGHT_FORM_F32 if activations == "f32" else WEIGHT_FORM


def methods(prefill_tokens: int) -> dict[str, dict[str, int]]:
    return {"prefill": {"tokens": prefill_tokens}, "decode": {"tokens": 1}}


def adapt(w: TargetWeight) -> TargetWeight:
    return xnnpack_form(w)


def xnnpack_form(w: TargetWeight) -> TargetWeight:
    """The weight as XNNPACK's group-wise kernels hold it: scales positive and rounded to bf16.

    q4_0 blocks whose largest-magnitude value is positive have a negative scale (that value is
    code -8); XNNPACK needs scale > 0, so such a block flips the signs of its codes, and the one
    code +8 this would need becomes +7 (the value moves by one step). All-zero blocks get the
    smallest positive scale (their codes are 0, so their values stay 0)."""
    if w.kind not in ("int4", "int8"):
        return w
    codes, scales = w.codes.copy(), w.scales.copy()  # [rows, cols], [rows, groups]
    rows, cols = codes.shape
    negative = scales < 0  # [rows, groups]
    grouped = codes.reshape(rows, cols // GROUP, GROUP)
    flipped = np.where(negative[:, :, None], -grouped.astype(np.int16), grouped)
    grouped = np.clip(flipped, -8 if w.kind == "int4" else -127, 7 if w.kind == "int4" else 127)
    scales = np.abs(scales)
    tiny = float(torch.finfo(torch.bfloat16).tiny)
    scales = np.where(scales > 0, scales, tiny).astype(np.float32)
    scales = torch.from_numpy(scales).to(torch.bfloat16).to(torch.float32).numpy()
    return TargetWeight(w.name, w.role, w.kind, w.shape, codes=grouped.reshape(rows, cols).astype(np.int8),
                        scales=scales)


def reference_ops(prepared: PreparedModel, activations: str = DEFAULT_ACTIVATIONS):
    """The reference runtime's ops computing as the exported program does on XNNPACK (None =
    the plain float32 reference, which is what activations="f32" computes): linear
    layers with int4/int8 weights through `qd8_linear` (bit-exact with XNNPACK's qd8 kernels on a
    given input), and RMSNorm in the graph's order of operations (sum of squares accumulated in
    sequence, times 1/d, then x * rsqrt * w). The other ops (attention, activations) stay the
    reference's; XNNPACK's approximations of exp, sigmoid, tanh and rsqrt differ from them by a
    few ulps, which is what remains between the two (see tests/targets/test_target_executorch.py)."""
    if activations == "f32":
        return None
    from edgeflash.runtime.reference.ops import NumpyOps

    quantized = {name: w for name, w in prepared.weights.items() if w.kind in ("int4", "int8")}

    class XnnpackOps(NumpyOps):
        def __init__(self) -> None:
            super().__init__()
            self._codes: dict[str, np.ndarray] = {}

        def linear(self, x: np.ndarray, w, bias=None) -> np.ndarray:
            q = quantized.get(w.name)
            if q is None:
                return super().linear(x, w, bias)
            if q.name not in self._codes:  # [groups, GROUP, rows] float32, for one matmul per group
                rows, cols = q.codes.shape
                self._codes[q.name] = np.ascontiguousarray(
                    q.codes.reshape(rows, cols // GROUP, GROUP).transpose(1, 2, 0).astype(np.float32))
            y = qd8_linear(x, self._codes[q.name], q.scales)
            return y + self.weight(bias) if bias is not None else y

        def rms_norm(self, x: np.ndarray, w, eps: float) -> np.ndarray:
            d = x.shape[-1]
            total = np.cumsum(x * x, axis=-1, dtype=np.float32)[..., -1:]  # summed in sequence, as XNNPACK's mean
            r = np.float32(1.0) / np.sqrt(total * np.float32(1.0 / d) + np.float32(eps))
            return x * r * self.weight(w)

        def gated(self, gate: np.ndarray, up: np.ndarray, activation: str) -> np.ndarray:
            if activation == "silu":
                return super().gated(gate, up, activation)
            c = np.float32(np.sqrt(2.0 / np.pi))  # tanh GELU in `_gelu`'s order
            inner = c * (gate + np.float32(0.044715) * (gate * gate * gate))
            return np.float32(0.5) * gate * (np.float32(1) + np.tanh(inner)) * up

    return XnnpackOps()


def int8_per_token(x: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """x [T, d] quantized to int8 per row as XNNPACK's dynamic quantization does (its
    xnn_f32_qd8 convert, float32 arithmetic): the row's range widened to include 0 is mapped onto
    255 steps by mult = 255 / (max - min), with an integer zero point rounded half to even.
    Returns (q - zero_point) [T, d] as float32 integers, and 1 / mult [T, 1]."""
    f32 = np.float32
    x = x.astype(f32)
    lo = np.minimum(x.min(axis=-1, keepdims=True), f32(0))
    hi = np.maximum(x.max(axis=-1, keepdims=True), f32(0))
    mult = np.where(lo == hi, f32(1), f32(255) / np.where(lo == hi, f32(1), hi - lo)).astype(f32)
    dmin, dmax = lo * mult, hi * mult
    zero = np.where((f32(-128) + dmin) + (f32(127) + dmax) > 0, f32(-128) - dmin, f32(127) - dmax)
    zero = np.rint(np.clip(zero, -128, 127))
    q = np.rint(np.clip(x * mult, -128 - zero, 127 - zero))  # q + zero in [-128, 127]
    return q.astype(f32), (f32(1) / mult).astype(f32)


def qd8_linear(x: np.ndarray, codes: np.ndarray, scales: np.ndarray) -> np.ndarray:
    """x [T, cols] @ W.T as XNNPACK's qd8 x blockwise-int4/int8 GEMM: x as `int8_per_token`,
    per group of 32 columns an exact integer dot product with the codes, scaled by the group's
    (bf16) scale and accumulated in float32 group after group; then times the row's 1 / mult.
    codes: [groups, 32, rows] float32; scales: [rows, groups]."""
    q, inv_mult = int8_per_token(x)
    q = q.reshape(x.shape[0], codes.shape[0], GROUP)
    acc = np.zeros((x.shape[0], codes.shape[2]), dtype=np.float32)
    for g in range(codes.shape[0]):
        acc += (q[:, g] @ codes[g]) * scales[:, g]  # integer sums (< 2^24) are exact in float32
    return acc * inv_mult


def _quantized_tensor(w: TargetWeight, dynamic_activations: bool):
    from torchao.quantization.quantize_.workflows.intx.intx_unpacked_to_int8_tensor import (
        IntxUnpackedToInt8Tensor,
        IntxUnpackedToInt8TensorActivationQuantization,
    )

    codes = torch.from_numpy(np.ascontiguousarray(w.codes))  # [rows, cols] int8
    scales = torch.from_numpy(np.ascontiguousarray(w.scales))  # [rows, cols / 32]
    return IntxUnpackedToInt8Tensor(
        qdata=codes, scale=scales, zero_point=torch.zeros(scales.shape, dtype=torch.int8),
        target_dtype=torch.int4 if w.kind == "int4" else torch.int8, block_size=(1, GROUP),
        dtype=torch.float32,
        activation_quantization=(IntxUnpackedToInt8TensorActivationQuantization.INT8_ASYM_PER_TOKEN
                                 if dynamic_activations else None))


class TorchaoOps(DenseOps):
    """int4/int8 weights as torchao quantized tensors, the rest dense."""

    def linear(self, w: TargetWeight, bias: TargetWeight | None) -> nn.Module:
        if w.kind == "dense":
            return super().linear(w, bias)
        rows, cols = w.shape
        layer = nn.Linear(cols, rows, bias=bias is not None)
        layer.weight = nn.Parameter(_quantized_tensor(w, dynamic_activations=True), requires_grad=False)
        if bias is not None:
            layer.bias = nn.Parameter(torch.from_numpy(bias.values().copy()), requires_grad=False)
        return layer

    def embedding(self, w: TargetWeight) -> nn.Module:
        if w.kind == "dense":
            return super().embedding(w)
        rows, cols = w.shape
        layer = nn.Embedding(rows, cols)
        layer.weight = nn.Parameter(_quantized_tensor(w, dynamic_activations=False), requires_grad=False)
        return layer


class WeightOnlyLinear(nn.Module):
    """x @ W.T in float32 with W = codes * scale per group of 32, all inside XNNPACK: the int8
    codes through `dequantize_per_tensor` (scale 1, zero point 0: the codes as floats), times the
    group scales, then `bmm` as W @ x.T (XNNPACK takes a bmm with a computed operand, while its
    linear wants a constant weight; this order transposes the activations, not the matrix)."""

    def __init__(self, w: TargetWeight, bias: TargetWeight | None):
        super().__init__()
        rows, cols = w.shape
        self.rows, self.cols = rows, cols
        self.register_buffer("codes", torch.from_numpy(np.ascontiguousarray(w.codes, dtype=np.int8)))
        scales = np.ascontiguousarray(w.scales, dtype=np.float32).reshape(rows, cols // GROUP, 1)
        self.register_buffer("scales", torch.from_numpy(scales))
        self.bias = None if bias is None else nn.Parameter(torch.from_numpy(bias.values().copy()),
                                                           requires_grad=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = torch.ops.quantized_decomposed.dequantize_per_tensor.default(self.codes, 1.0, 0, -128, 127, torch.int8)
        w = (w.reshape(self.rows, self.cols // GROUP, GROUP) * self.scales).reshape(1, self.rows, self.cols)
        n = x.numel() // self.cols
        # reshapes rather than unsqueeze / [0], which would leave the delegate
        xt = x.reshape(n, self.cols).transpose(0, 1).reshape(1, self.cols, n)
        y = torch.bmm(w, xt).reshape(self.rows, n).transpose(0, 1)  # [N, rows]
        y = y.reshape(*x.shape[:-1], self.rows)
        return y + self.bias if self.bias is not None else y


class WeightOnlyOps(TorchaoOps):
    """activations="f32": int4/int8 linear layers as `WeightOnlyLinear`; embeddings as TorchaoOps."""

    def linear(self, w: TargetWeight, bias: TargetWeight | None) -> nn.Module:
        if w.kind == "dense":
            return super().linear(w, bias)
        import torch.ao.quantization.fx._decomposed  # noqa: F401  registers quantized_decomposed ops

        return WeightOnlyLinear(w, bias)


def write_chunk(prepared: PreparedModel, chunk: Chunk, out_dir: Path, *, kv: str, cache_len: int,
                prefill_tokens: int, activations: str = DEFAULT_ACTIVATIONS) -> dict[str, object]:
    """Lower one chunk to `chunk{i}.pte` in `out_dir`; returns its manifest entry. `activations`:
    "int8" (8da4w / 8da8w) or "f32" (weight-only, float32 activations)."""
    if activations not in ACTIVATIONS:
        raise ValueError(f"activations must be one of {ACTIVATIONS}, not {activations!r}")
    ops = WeightOnlyOps() if activations == "f32" else TorchaoOps()
    graph = ChunkGraph(prepared.source.spec, prepared.weights, chunk.layers, first=chunk.first,
                       last_chunk=chunk.last, cache_len=cache_len, kv=kv, ops=ops)
    path = out_dir / f"chunk{chunk.index}{EXTENSION}"
    info = lower_to_file(graph, path, prefill_tokens)
    inputs, outputs = chunk_io(prepared.source.spec, chunk, kv, cache_len)
    return {"file": path.name, "layers": [chunk.layers.start, chunk.layers.stop], "embedding": chunk.first,
            "head": chunk.last, "inputs": inputs, "outputs": outputs, "bytes": path.stat().st_size, **info}


def lower_to_file(graph: ChunkGraph, path: Path, prefill_tokens: int) -> dict[str, object]:
    """Export `graph` with methods prefill (T = prefill_tokens) and decode (T = 1) to `path`."""
    from executorch.backends.xnnpack.partition.xnnpack_partitioner import (
        XnnpackDynamicallyQuantizedPartitioner,
        XnnpackPartitioner,
    )
    from executorch.exir import EdgeCompileConfig, ExecutorchBackendConfig, to_edge_transform_and_lower
    from executorch.exir.passes import MemoryPlanningPass

    graph = graph.eval()
    with torch.no_grad():
        programs = {name: torch.export.export(graph, example_inputs(graph, tokens), strict=False)
                    .run_decompositions({torch.ops.aten.gelu.default: _gelu})
                    for name, tokens in (("prefill", prefill_tokens), ("decode", 1))}
    edge = to_edge_transform_and_lower(
        programs,
        partitioner={name: [XnnpackDynamicallyQuantizedPartitioner(), XnnpackPartitioner()] for name in programs},
        compile_config=EdgeCompileConfig(_check_ir_validity=False),
    )
    program = edge.to_executorch(ExecutorchBackendConfig(
        extract_delegate_segments=True,
        do_quant_fusion_and_const_prop=True,
        # Both methods read and write the same cache buffers.
        memory_planning_pass=MemoryPlanningPass(alloc_graph_input=False, share_mutable_buffers=True),
        emit_mutable_buffer_names=True,
    ))
    with open(path, "wb") as f:
        program.write_to_file(f)
    return {"ops": _delegation_summary(edge)}


def _gelu(x: torch.Tensor, approximate: str = "none") -> torch.Tensor:
    """aten.gelu spelled out before lowering: XNNPACK's gelu op (and ExecuTorch's lowering to it)
    computes the erf form whatever `approximate` says, while Gemma's activation is the tanh form
    (the two differ by up to 3e-3 after its up projection)."""
    if approximate == "tanh":
        c = math.sqrt(2.0 / math.pi)
        return 0.5 * x * (1.0 + torch.tanh(c * (x + 0.044715 * (x * x * x))))
    return 0.5 * x * (1.0 + torch.erf(x * (1.0 / math.sqrt(2.0))))


def _delegation_summary(edge) -> dict[str, dict[str, int]]:
    """Per method: how many XNNPACK delegate calls there are and which ops stay on ExecuTorch's
    own kernels (cache writes, lookups, masks)."""
    out: dict[str, dict[str, int]] = {}
    for name in edge.methods:
        counts: dict[str, int] = {}
        for node in edge.exported_program(name).graph.nodes:
            if node.op != "call_function" or node.target is operator.getitem:
                continue
            op = getattr(node.target, "__name__", str(node.target))
            key = "xnnpack_delegate" if "executorch_call_delegate" in op else op.split(".")[0]
            counts[key] = counts.get(key, 0) + 1
        out[name] = dict(sorted(counts.items()))
    return out
