"""ExecuTorch exports of both real models (their first layers: lowering to XNNPACK costs seconds
per layer and method, see conftest.py), run with executorch.runtime and compared with the
reference runtime on the same quantized weights.

XNNPACK's 4-bit linear kernels quantize each input row to int8 on the fly (8da4w); the reference
is given the same rounding (`executorch.reference_ops`). The emulation is not bit-exact (XNNPACK
picks its own int8 parameters), and a single rounding step apart on one of Gemma 3's outlier
channels (activations up to ~1e5) moves its logits by whole units, so the bounds are per model:
SmolLM2 within 2 and the same greedy continuation on most prompts; Gemma 3 within 6 and the same
top-1 on most positions (its greedy continuations part after a few tokens; docs/backends.md).
"""

from __future__ import annotations

import pytest
from target_checks import assert_parity, chunk_matrices, int4_bytes, parity

# alias, layers, chunks, kv, logit bound, min top-1 agreement, same greedy continuation required
CASES = [("smollm2-135m", 2, 1, "state", 2.0, 0.9, True), ("gemma3-270m", 2, 2, "io", 6.0, 0.7, False)]


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
