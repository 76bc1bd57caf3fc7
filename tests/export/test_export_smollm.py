"""SmolLM2-135M through every stage: `keep` is bit-exact, q8_0 is within 1% perplexity, calibrated
q4_0 beats round-to-nearest, and q4_k (with its q5_0 fallbacks) and a mixed q8_0/q4_lut scheme
make bundles that load, give the numpy reference's logits on the native engine and generate.
Perplexities are measured on the native engine. (Every scheme on both models:
benchmarks/export/matrix.py.)"""

from __future__ import annotations

import numpy as np
import pytest
from edgeflash.export import export
from edgeflash.export.evaluate import perplexity
from edgeflash.export.quant import get_scheme
from edgeflash.export.quantize import quantize_model, quantized_source
from edgeflash.runtime.bundle import load_bundle
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.reference import ReferenceEngine

PROMPT = "Now is the winter of our discontent"
SMALL = {"calibration_tokens": 256, "window_tokens": 128, "eval_tokens": 0, "predictor_rank": 8, "top_tokens": 256,
         "frequency_chars": 20_000, "progress": False}


def _greedy(engine, prompt_ids, n=8):
    engine.reset()
    logits = engine.forward(prompt_ids)
    out = []
    for _ in range(n):
        out.append(int(np.argmax(logits[-1])))
        logits = engine.forward([out[-1]])
    return out


def test_keep_bundle_has_the_gguf_logits_exactly(smol, tmp_path):
    result = export(smol, tmp_path / "keep", quant="keep", calibration_tokens=128, window_tokens=128, eval_tokens=0,
                    predictor_rank=0, top_tokens=256, frequency_chars=20_000, progress=False)
    bundle = load_bundle(result.path)
    for name, t in smol.tensors.items():  # byte for byte, same formats
        assert bundle.tensors[name].fmt == t.fmt
        np.testing.assert_array_equal(bundle.tensors[name].raw, t.raw)
    ids = smol.tokenizer.encode(PROMPT)
    ours = ReferenceEngine(bundle).forward(ids, all_logits=True)
    theirs = ReferenceEngine(smol).forward(ids, all_logits=True)
    assert np.array_equal(ours, theirs)
    assert all(t["sqnr_db"] is None for t in result.report["tensors"])
    assert result.manifest["quant"]["scheme"] == "keep"
    # the arena is in q8_0 for keep (the source's own formats vary per tensor)
    assert {p["format"] for b in result.manifest["blocks"] if b["arena"] for p in b["arena"]["parts"]} == {"q8_0"}


def test_q8_0_is_within_one_percent(smol, smol_calibration, heldout_windows, smol_source_perplexity):
    q = quantize_model(smol, get_scheme("q8_0"), smol_calibration.importance, progress=False)
    p = perplexity(quantized_source(smol, q), heldout_windows)
    delta = p.perplexity / smol_source_perplexity.perplexity - 1.0
    assert abs(delta) < 0.01, f"q8_0 perplexity {p.perplexity:.3f} vs source {smol_source_perplexity.perplexity:.3f}"
    assert min(t.sqnr_db for t in q.values() if t.sqnr_db is not None and len(t.tensor.shape) > 1) > 30.0


def test_calibrated_q4_0_beats_round_to_nearest(smol, smol_calibration, heldout_windows, smol_source_perplexity):
    config = get_scheme("q4_0")
    calibrated = quantize_model(smol, config, smol_calibration.importance, progress=False)
    rtn = quantize_model(smol, config.rtn_baseline(), None, progress=False)
    assert sum(t.tensor.nbytes for t in calibrated.values()) == sum(t.tensor.nbytes for t in rtn.values())
    p_cal = perplexity(quantized_source(smol, calibrated), heldout_windows).perplexity
    p_rtn = perplexity(quantized_source(smol, rtn), heldout_windows).perplexity
    ref = smol_source_perplexity.perplexity
    assert p_cal < 0.97 * p_rtn, f"calibrated {p_cal:.2f} vs round-to-nearest {p_rtn:.2f}"
    assert p_cal < 1.25 * ref, f"calibrated q4_0 {p_cal:.2f} vs source {ref:.2f}: outside the stated 25% bound"


@pytest.mark.parametrize("scheme", ["q4_k", "q4_lut-mixed"])
def test_scheme_bundle_loads_and_generates(smol, tmp_path, scheme):
    result = export(smol, tmp_path / scheme, quant=scheme, **SMALL)
    bundle = load_bundle(result.path)
    ids = smol.tokenizer.encode(PROMPT)
    native = NativeEngine(bundle).forward(ids, all_logits=True)
    reference = ReferenceEngine(bundle, kv_dtype="f16").forward(ids, all_logits=True)  # the arena as dense matrices
    # Q8 activations against float32 (measured 2.2% of the logit range: SmolLM2's outlier dimensions)
    assert np.abs(native - reference).max() <= 0.05 * np.abs(reference).max()
    assert (native.argmax(axis=1) == reference.argmax(axis=1)).mean() >= 0.8
    text = smol.tokenizer.decode(_greedy(NativeEngine(bundle), ids))
    assert len(text.strip()) > 0
    formats = {t.fmt for n, t in bundle.tensors.items() if len(t.shape) > 1 and "predictor" not in n}
    entry, _ = bundle.info["bundle"].arena(0)
    fallbacks = {f["name"]: f for f in result.report["fallbacks"]}
    if scheme == "q4_k":
        # d_model 576 is not a multiple of 256: those rows fall back to q5_0, and the FFN's arena (rows
        # of d_model values) is q5_0 too; ffn_down's rows (1536) could be q4_k, its arena columns cannot
        assert formats == {"q5_0"} and {p.fmt for p in entry.parts} == {"q5_0"}
        assert fallbacks["blk.0.attn_q.weight"]["reason"].startswith("rows of 576 values")
        assert fallbacks["blk.0.ffn_down.weight"]["to"] == "q5_0" and "arena" in fallbacks["blk.0.ffn_down.weight"]["reason"]
        assert all(f["from"] == "q4_k" and f["to"] == "q5_0" for f in fallbacks.values())
    else:  # embedding, head and attention at 8 bits, the FFN's gate and up rows at 4, its down columns at
        # 8 bits in the first eighth of the 30 layers and at 5 in every third of the middle ones (3, 6, ...)
        ffn_format = scheme.split("-")[0]
        assert bundle.tensors["blk.0.attn_q.weight"].fmt == "q8_0"
        assert bundle.tensors["token_embd.weight"].fmt == "q8_0"
        assert [p.fmt for p in entry.parts] == [ffn_format, ffn_format, "q8_0"]
        middle, _ = bundle.info["bundle"].arena(3)
        assert [p.fmt for p in middle.parts] == [ffn_format, ffn_format, "q5_0"]
        assert "blk.0.ffn_down.weight" not in fallbacks


def test_q3_k_dense_bundle_keeps_q3_k_where_rows_take_it(smol, tmp_path):
    """--quant q3_k without a neuron arena: ffn_down's rows (1536 values) are q3_k, every matrix with
    rows of d_model (576) values falls back to q4_0 and the report says why; the bundle runs."""
    result = export(smol, tmp_path / "q3_k", quant="q3_k", neuron_arena=False, **SMALL)
    bundle = load_bundle(result.path)
    formats = {n: t.fmt for n, t in bundle.tensors.items() if len(t.shape) > 1 and "predictor" not in n}
    assert {f for n, f in formats.items() if n.endswith("ffn_down.weight")} == {"q3_k"}
    assert {f for n, f in formats.items() if not n.endswith("ffn_down.weight")} == {"q4_0"}
    fallbacks = {f["name"]: f for f in result.report["fallbacks"]}
    assert fallbacks["blk.0.attn_q.weight"]["reason"].startswith("rows of 576 values")
    assert all(f["from"] == "q3_k" and f["to"] == "q4_0" for f in fallbacks.values())
    ids = smol.tokenizer.encode(PROMPT)
    native = NativeEngine(bundle).forward(ids, all_logits=True)
    reference = ReferenceEngine(bundle, kv_dtype="f16").forward(ids, all_logits=True)
    assert np.abs(native - reference).max() <= 0.05 * np.abs(reference).max()
    assert (native.argmax(axis=1) == reference.argmax(axis=1)).mean() >= 0.8
