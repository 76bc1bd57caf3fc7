"""ONNX exports of both real models, run with onnxruntime and compared with the reference
runtime on the same quantized weights.

Error bound: MatMulNBits dequantizes the same int4 codes and scales and multiplies in float32,
so only the summation order differs from the reference; logits agree to ~1e-3 of their range.
"""

from __future__ import annotations

import pytest
from target_checks import assert_parity, chunk_matrices, int4_bytes, parity

ONNX_MAX_ABS_ERROR = 0.05


@pytest.mark.parametrize("alias,chunks", [("smollm2-135m", 2), ("gemma3-270m", 1)])
def test_onnx_matches_reference(target_export, target_reference, model_source, alias, chunks):
    import onnx

    result = target_export(alias, "onnx", chunks)
    m = result.manifest
    spec = m["model"]["spec"]
    assert m["cache"]["mode"] == "io" and len(m["chunks"]) == chunks
    for chunk in m["chunks"]:
        model = onnx.load(str(result.path / chunk["file"]), load_external_data=False)
        assert max(o.version for o in model.opset_import if o.domain in ("", "ai.onnx")) >= 21
        assert [i.name for i in model.graph.input] == [i["name"] for i in chunk["inputs"]]
        assert [o.name for o in model.graph.output] == [o["name"] for o in chunk["outputs"]]
        layers = chunk["layers"][1] - chunk["layers"][0]
        # q, k, v, o, gate, up, down per layer, plus the head, all as packed 4-bit matmuls
        assert chunk["ops"].get("com.microsoft::MatMulNBits") == 7 * layers + chunk["head"], chunk["ops"]
        assert chunk["ops"].get("com.microsoft::GatherBlockQuantized", 0) == int(chunk["embedding"])
        assert "MatMul" not in chunk["ops"] or chunk["ops"]["MatMul"] <= 4 * layers  # attention only
        # int4 codes and float32 scales of each matrix; the lookup reads the embedding's codes with
        # float16 scales of its own, and a tied head in the same file shares those codes
        source = model_source(alias)
        layer_matrices = chunk_matrices(source, {**chunk, "embedding": False, "head": False})
        expected = sum(int4_bytes(n, 4) for n in layer_matrices)
        embedding = source.tensors["token_embd.weight"].shape[0] * source.tensors["token_embd.weight"].shape[1]
        tied = "output.weight" not in source.tensors
        if chunk["embedding"]:
            expected += int4_bytes(embedding, 2)
        if chunk["head"]:
            expected += embedding // 32 * 4 if tied and chunk["embedding"] else int4_bytes(embedding, 4)
        assert expected < chunk["bytes"] < 1.05 * expected, (chunk["bytes"], expected)
    assert spec["n_layers"] == m["chunks"][-1]["layers"][1]

    reference, ops, cache = target_reference(alias, "onnx")
    summary = parity(result, reference, ops, cache)
    print(alias, chunks, {k: v for k, v in summary.items() if k != "per_prompt"})
    assert_parity(summary, ONNX_MAX_ABS_ERROR)
