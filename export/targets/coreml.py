"""Core ML: one `.mlpackage` (ML program, iOS 18 / macOS 15) per chunk, with functions `prefill`
and `decode` sharing their weights and the KV-cache states.

Weights keep the quantize stage's numbers through Core ML's own compression ops:
- q4_0 / q8_0: torchao weight-only tensors in the torch graph, which coremltools turns into
  `constexpr_blockwise_shift_scale` (int4 / int8 codes, one scale per 32 values);
- q4_lut is not taken: its per-block scales make a row's values more than one 16-entry palette.

Activations compute in float32: the residual stream of both reference models exceeds float16
(Gemma 3 270M reaches |x| ~ 1e5 and SmolLM2's RMSNorm sums of squares ~ 5e8 on Shakespeare),
so a float16 program would overflow. Core ML keeps states in float16, so the cache is rounded
to float16. The KV update is a one-hot product (coremltools has no working indexed assignment
into a state). Prediction runs on macOS only; on Linux the package is built and validated.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

import numpy as np
import torch
from edgeflash.export.targets.chunks import Chunk, chunk_io
from edgeflash.export.targets.executorch import TorchaoOps, _quantized_tensor
from edgeflash.export.targets.graph import ChunkGraph, DenseLinear, example_inputs
from edgeflash.export.targets.prepare import PreparedModel
from edgeflash.export.targets.weights import TargetWeight

FORMATS = ("f32", "f16", "bf16", "q8_0", "q4_0")
KV_MODES = ("state", "io")
DEFAULT_KV = "state"
STATIC_SHAPES = True
EXTENSION = ".mlpackage"
WEIGHT_FORM = ("q4_0 / q8_0 -> constexpr_blockwise_shift_scale (int4 / int8, one float16 scale per 32 values); "
               "float32 compute, float16 states")


def methods(prefill_tokens: int) -> dict[str, dict[str, int]]:
    return {"prefill": {"tokens": prefill_tokens}, "decode": {"tokens": 1}}


def adapt(w: TargetWeight) -> TargetWeight:
    """Scales as Core ML stores them (float16)."""
    if w.kind == "dense":
        return w
    return TargetWeight(w.name, w.role, w.kind, w.shape, codes=w.codes,
                        scales=w.scales.astype(np.float16).astype(np.float32))


class CoreMLOps(TorchaoOps):
    """int4/int8 as weight-only torchao tensors (no activation quantization on Core ML)."""

    def linear(self, w: TargetWeight, bias: TargetWeight | None):
        if w.kind == "dense":
            return DenseLinear(w, bias)
        rows, cols = w.shape
        layer = torch.nn.Linear(cols, rows, bias=bias is not None)
        layer.weight = torch.nn.Parameter(_quantized_tensor(w, dynamic_activations=False), requires_grad=False)
        if bias is not None:
            layer.bias = torch.nn.Parameter(torch.from_numpy(bias.values().copy()), requires_grad=False)
        return layer


def write_chunk(prepared: PreparedModel, chunk: Chunk, out_dir: Path, *, kv: str, cache_len: int,
                prefill_tokens: int) -> dict[str, object]:
    import coremltools as ct

    spec = prepared.source.spec
    graph = ChunkGraph(spec, prepared.weights, chunk.layers, first=chunk.first, last_chunk=chunk.last,
                       cache_len=cache_len, kv=kv, ops=CoreMLOps(), cache_write="one_hot").eval()
    inputs, outputs = chunk_io(spec, chunk, kv, cache_len)
    path = out_dir / f"chunk{chunk.index}{EXTENSION}"
    with tempfile.TemporaryDirectory(dir=out_dir) as tmp:
        descriptor = ct.utils.MultiFunctionDescriptor()
        for name, tokens in (("prefill", prefill_tokens), ("decode", 1)):
            model = _convert(graph, tokens, [i["name"] for i in inputs], [o["name"] for o in outputs])
            single = Path(tmp) / f"{name}.mlpackage"
            model.save(str(single))
            descriptor.add_function(str(single), src_function_name="main", target_function_name=name)
        descriptor.default_function_name = "decode"
        ct.utils.save_multifunction(descriptor, str(path))
    info = describe_package(path)
    return {"file": path.name, "layers": [chunk.layers.start, chunk.layers.stop], "embedding": chunk.first,
            "head": chunk.last, "inputs": inputs, "outputs": outputs, "bytes": info["bytes"],
            "weights_bytes": info["weights_bytes"], "ops": info["ops"], "states": info["states"]}


def _convert(graph: ChunkGraph, tokens: int, input_names: list[str], output_names: list[str]):
    import coremltools as ct

    with torch.no_grad():
        exported = torch.export.export(graph, example_inputs(graph, tokens), strict=False).run_decompositions({})
    model = ct.convert(exported, minimum_deployment_target=ct.target.iOS18,
                       compute_precision=ct.precision.FLOAT32, skip_model_load=True)
    spec = model.get_spec()
    # The converter names inputs after the forward's parameters (x, input_pos, rest_0...).
    for old, new in zip([i.name for i in spec.description.input], input_names):
        ct.utils.rename_feature(spec, old, new, rename_outputs=False)
    for old, new in zip([o.name for o in spec.description.output], output_names):
        ct.utils.rename_feature(spec, old, new, rename_inputs=False)
    return ct.models.MLModel(spec, weights_dir=model.weights_dir, skip_model_load=True)


def describe_package(path: Path) -> dict[str, object]:
    """What a saved package holds, read from its files: functions with their inputs, outputs,
    states and op counts, and the size of the weight file."""
    import coremltools as ct

    spec = ct.utils.load_spec(str(path))
    functions = {}
    for f in spec.description.functions:
        functions[f.name] = {"inputs": [i.name for i in f.input], "outputs": [o.name for o in f.output],
                             "states": [s.name for s in f.state]}
    ops: dict[str, dict[str, int]] = {}
    for name, function in spec.mlProgram.functions.items():
        counts: dict[str, int] = {}
        for block in function.block_specializations.values():
            for op in block.operations:
                counts[op.type] = counts.get(op.type, 0) + 1
        ops[name] = dict(sorted(counts.items()))
    weights = path / "Data" / "com.apple.CoreML" / "weights"
    total = sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
    states = next(iter(functions.values()))["states"] if functions else []
    return {"functions": functions, "ops": ops, "states": states, "bytes": total,
            "weights_bytes": sum(p.stat().st_size for p in weights.rglob("*") if p.is_file()) if weights.exists() else 0}
