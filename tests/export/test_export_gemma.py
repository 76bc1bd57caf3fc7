"""One real Gemma 3 270M export through the whole pipeline: q4_k, whose 256-value blocks do not
fit Gemma's rows of 640 values, so the report must list the q5_0 fallbacks; the full report has
the sparsity levels; the bundle loads and generates text."""

from __future__ import annotations

import numpy as np
from edgeflash.export import export
from edgeflash.runtime.bundle import load_bundle
from edgeflash.runtime.native_engine import NativeEngine


def test_gemma_q4_k_export(gemma_path, tmp_path):
    result = export(gemma_path, tmp_path / "gemma-q4_k", quant="q4_k", calibration_tokens=256, window_tokens=128,
                    eval_tokens=128, sparsity_levels=[0.5], predictor_rank=16, top_tokens=1024,
                    frequency_chars=50_000, full_report=True, baseline=False, progress=False)
    report = result.report
    fallbacks = {f["name"]: f for f in report["fallbacks"]}
    # rows of 640 (d_model) cannot be q4_k; rows of 1024 (attn_output) can; ffn_down's rows (2048)
    # could, but the FFN is stored once, as the neuron arena, where down is columns of 640
    for name in ("token_embd.weight", "blk.0.attn_q.weight", "blk.0.attn_k.weight", "blk.0.ffn_gate.weight"):
        assert fallbacks[name]["from"] == "q4_k" and fallbacks[name]["to"] == "q5_0"
        assert "640" in fallbacks[name]["reason"]
    assert "blk.0.attn_output.weight" not in fallbacks
    assert "arena" in fallbacks["blk.0.ffn_down.weight"]["reason"]

    bundle = load_bundle(result.path)
    assert bundle.tensors["blk.0.attn_output.weight"].fmt == "q4_k"
    entry, arena = bundle.info["bundle"].arena(0)
    assert {p.fmt for p in entry.parts} == {"q5_0"} and arena.shape[0] == 2048
    assert report["perplexity"]["exported"] < 1.6 * report["perplexity"]["source"]
    assert report["sparsity"][0]["perplexity"] > report["perplexity"]["exported"] * 0.99

    engine = NativeEngine(bundle)
    ids = bundle.tokenizer.encode("The capital of France is")
    logits = engine.forward(ids)
    out = []
    for _ in range(6):
        out.append(int(np.argmax(logits[-1])))
        logits = engine.forward([out[-1]])
    assert bundle.tokenizer.decode(out).strip()
