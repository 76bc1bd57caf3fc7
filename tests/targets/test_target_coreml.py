"""Core ML exports of both real models (their first layers, as for ExecuTorch). Core ML predicts
on macOS only: here the saved packages are validated from their files (spec, functions, inputs,
outputs, states, ops, compressed weight sizes); the prediction test runs where macOS is."""

from __future__ import annotations

import platform

import numpy as np
import pytest
from target_checks import assert_parity, chunk_matrices, int4_bytes, parity

CASES = [("smollm2-135m", 2, 2), ("gemma3-270m", 2, 1)]  # alias, layers, chunks
# Core ML keeps the KV states in float16 (activations compute in float32).
COREML_MAX_ABS_ERROR = 1.0


@pytest.mark.parametrize("alias,layers,chunks", CASES)
def test_coreml_package_validates(target_export, model_source, alias, layers, chunks):
    import coremltools as ct
    from edgeflash.export.targets.coreml import describe_package

    result = target_export(alias, "coreml", chunks, layers)
    m = result.manifest
    assert len(m["chunks"]) == chunks and m["cache"]["mode"] == "state"
    for chunk in m["chunks"]:
        path = result.path / chunk["file"]
        spec = ct.utils.load_spec(str(path))  # the saved package parses
        assert spec.WhichOneof("Type") == "mlProgram"
        assert spec.description.defaultFunctionName == "decode"
        info = describe_package(path)
        n = chunk["layers"][1] - chunk["layers"][0]
        source = model_source(alias, layers)
        matrices = chunk_matrices(source, chunk)
        if chunk["embedding"] and chunk["head"] and "output.weight" not in source.tensors:
            matrices.pop()  # a tied head is the embedding's constant: stored once
        for method, tokens in (("prefill", 16), ("decode", 1)):
            f = info["functions"][method]
            assert f["inputs"] == [i["name"] for i in chunk["inputs"]]
            assert f["outputs"] == [o["name"] for o in chunk["outputs"]]
            assert len(f["states"]) == 2 * n  # k and v of each layer
            described = next(d for d in spec.description.functions if d.name == method)
            assert described.input[0].type.multiArrayType.shape[0] == tokens  # static token axis
            ops = info["ops"][method]
            # every matrix is stored compressed and expanded by Core ML at load time
            assert ops.get("constexpr_blockwise_shift_scale") == len(matrices), ops
            assert ops.get("linear") == 7 * n + chunk["head"], ops
            assert ops.get("read_state") == 2 * n and ops.get("write_state") == 2 * n, ops
        # int4 codes, float16 scales and int8 offsets of every matrix in the chunk (a float16
        # weight file would be 3.5 times as large)
        expected = sum(int4_bytes(n, 3) for n in matrices)
        assert expected < info["weights_bytes"] < 1.1 * expected, (info["weights_bytes"], expected)


@pytest.mark.skipif(platform.system() != "Darwin",
                    reason="Core ML runs predictions on macOS only; on Linux the saved package is validated instead")
@pytest.mark.parametrize("alias,layers,chunks", CASES)
def test_coreml_predictions_match_reference(target_export, target_reference, alias, layers, chunks):
    result = target_export(alias, "coreml", chunks, layers)
    reference, ops, cache = target_reference(alias, "coreml", layers)
    summary = parity(result, reference, ops, cache)
    assert np.isfinite(summary["max_abs_error"])
    assert_parity(summary, COREML_MAX_ABS_ERROR)
