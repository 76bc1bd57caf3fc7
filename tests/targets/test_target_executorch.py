"""ExecuTorch exports of both real models (their first layers: lowering to XNNPACK costs seconds
per layer and method, see conftest.py), run with executorch.runtime and compared with the
reference runtime on the same quantized weights.

XNNPACK's 4-bit linear kernels quantize each input row to int8 on the fly (8da4w); the reference
computes them as XNNPACK does (`executorch.reference_ops`: its int8 parameters and its per-group
accumulation, bit-exact on a given input for nearly every output; RMSNorm summed in XNNPACK's
order; GELU in the tanh form the export now spells out). What is left are XNNPACK's own
approximations of exp (softmax) and rsqrt, a few ulps from numpy's; they matter only where one
of them moves an activation across an int8 rounding boundary, which then moves the logits by
one quantization step of that row. Measured (3 prompts, 16 teacher-forced positions + prefill,
32 greedy tokens): SmolLM2 max logit error 1e-5, 3/3 same greedy continuations; Gemma 3 1.9
(one such crossing in attention; its outlier channels, ~1e5, make a step large), 3/3 same greedy.
"""

from __future__ import annotations

import pytest
from target_checks import assert_parity, chunk_matrices, int4_bytes, parity

# alias, layers, chunks, kv, logit bound, min top-1 agreement, same greedy continuation required
CASES = [("smollm2-135m", 2, 1, "state", 0.01, 1.0, True), ("gemma3-270m", 2, 2, "io", 3.0, 0.85, True)]


@pytest.mark.parametrize("alias,layers,chunks,kv,bound,top1,greedy", CASES)
def test_executorch_matches_reference(target_export, target_reference, model_source, alias, layers, chunks, kv,
                                      bound, top1, greedy):
    result = target_export(alias, "executorch", chunks, layers, kv=kv)
    m = result.manifest
    assert [c["file"] for c in m["chunks"]] == [f"chunk{i}.pte" for i in range(chunks)]
    n_layers = m["model"]["spec"]["n_layers"]
    assert m["chunks"][0]["layers"][0] == 0 and m["chunks"][-1]["layers"][1] == n_layers
    assert m["cache"]["mode"] == kv
    for chunk in m["chunks"]:
        assert (result.path / chunk["file"]).stat().st_size == chunk["bytes"]
        for method in ("prefill", "decode"):
            ops = chunk["ops"][method]
            # every linear runs in XNNPACK: no float or quantized matmul left on the portable kernels
            assert ops.get("xnnpack_delegate", 0) >= 1, ops
            assert not any(k.startswith(("aten.linear", "aten.mm", "aten.addmm", "aten.bmm")) for k in ops), ops
    for chunk in m["chunks"]:
        # the weights stay packed: int4 codes and bf16 scales of each matrix (the embedding's lookup
        # and XNNPACK's head each hold their own copy of a tied matrix)
        expected = sum(int4_bytes(n, 2) for n in chunk_matrices(model_source(alias, layers), chunk))
        assert 0.95 * expected < chunk["bytes"] < 1.15 * expected, (chunk["bytes"], expected)

    reference, ops, cache = target_reference(alias, "executorch", layers)
    summary = parity(result, reference, ops, cache)
    print(alias, chunks, {k: v for k, v in summary.items() if k != "per_prompt"})
    assert_parity(summary, bound, top1, greedy)


# et_activations="f32": float32 activations against the same codes and scales (weight-only), so
# the plain float32 reference is what the export computes, up to float rounding.
# alias, layers, chunks, kv, logit bound
EXACT_CASES = [("smollm2-135m", 2, 2, "io", 1e-3), ("gemma3-270m", 2, 1, "state", 1e-3)]
_EXACT_REFERENCE_CACHE: dict[str, dict] = {}  # plain-float32 reference results, apart from the emulating ones


@pytest.mark.parametrize("alias,layers,chunks,kv,bound", EXACT_CASES)
def test_executorch_f32_activations_match_reference(target_export, target_reference, model_source, alias, layers,
                                                    chunks, kv, bound):
    result = target_export(alias, "executorch", chunks, layers, kv=kv, et_activations="f32")
    m = result.manifest
    assert m["target_weights"]["activations"] == "f32" and "float32 activations" in m["target_weights"]["form"]
    assert m["cache"]["mode"] == kv and len(m["chunks"]) == chunks
    for chunk in m["chunks"]:
        for method in ("prefill", "decode"):
            ops = chunk["ops"][method]
            # dequantization and matmul of every linear inside XNNPACK, none on the portable kernels
            assert ops.get("xnnpack_delegate", 0) >= 1, ops
            assert not any(k.startswith(("aten.linear", "aten.mm", "aten.addmm", "aten.bmm", "dequantize"))
                           for k in ops), ops
        # weights stay quantized: the linears' codes a byte each plus float32 scales, the embedding
        # lookup's int4 codes packed two per byte with bf16 scales
        source = model_source(alias, layers)
        sizes = chunk_matrices(source, chunk)
        embedding = sizes[-1 - chunk["head"]] if chunk["embedding"] else 0
        linears = sum(sizes) - embedding
        expected = linears + linears // 32 * 4 + int4_bytes(embedding, 2)
        assert 0.95 * expected < chunk["bytes"] < 1.15 * expected, (chunk["bytes"], expected)

    reference, _, _ = target_reference(alias, "executorch", layers)  # the same weights; no int8 emulation
    summary = parity(result, reference, None, _EXACT_REFERENCE_CACHE.setdefault(alias, {}))
    print(alias, chunks, kv, {k: v for k, v in summary.items() if k != "per_prompt"})
    assert_parity(summary, bound, 1.0, greedy=True)
    assert summary["same_continuation"] == summary["prompts"], summary
