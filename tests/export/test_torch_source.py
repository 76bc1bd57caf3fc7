"""ef.export from a torch nn.Module with its HF-style config: names mapped through the family,
and the bundle computes what the module computes."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="exporting a torch module needs torch (edgeflash[export])")
transformers = pytest.importorskip("transformers")

import edgeflash as ef
from edgeflash.base.errors import UserError
from edgeflash.runtime.bundle import load_bundle
from edgeflash.runtime.reference import ReferenceEngine

FAST = {"calibration_tokens": 64, "window_tokens": 64, "eval_tokens": 64, "predictor_rank": 0, "top_tokens": 64,
        "frequency_chars": 10_000, "progress": False}


@pytest.fixture(scope="module")
def tokenizer(smollm_path):
    from edgeflash.export.sources.torch_module import resolve_tokenizer

    return resolve_tokenizer(smollm_path)


@pytest.mark.parametrize("case", ["llama-gqa-untied", "gemma3-local-global"])
def test_module_export_matches_the_module(tmp_path, smollm_path, tokenizer, case):
    from tiny_models import build_tiny_model

    (tmp_path / "none").mkdir()
    model = build_tiny_model(case, tmp_path / "none", tokenizer.vocab_size, tmp_path / "hf")
    config = model.config if case.startswith("llama") else model.config.to_dict()  # an object or a dict
    # the tokenizer as a GGUF file path here, as a Tokenizer object below
    result = ef.export(model, tmp_path / case, quant="keep", config=config, tokenizer=smollm_path, **FAST)
    bundle = load_bundle(result.path)
    assert bundle.kind == "bundle" and result.manifest["source"]["kind"] == "torch"
    ids = tokenizer.encode("Full fathom five thy father lies; of his bones are coral made")[:20]  # longer than the window
    ours = ReferenceEngine(bundle).forward(ids, all_logits=True)
    with torch.no_grad():
        theirs = model(torch.tensor([ids])).logits[0].numpy()
    assert np.abs(ours - theirs).max() <= 1e-4 * max(np.abs(theirs).max(), 1.0)

    q8 = ef.export(model, tmp_path / f"{case}-q8", quant="q8_0", config=config, tokenizer=tokenizer, **FAST)
    assert abs(q8.report["perplexity"]["delta_pct"]) < 1.0


def test_module_without_tokenizer_is_a_user_error(tmp_path):
    from tiny_models import build_tiny_model

    (tmp_path / "none").mkdir()
    model = build_tiny_model("llama-gqa-untied", tmp_path / "none", 256, tmp_path / "hf")
    with pytest.raises(UserError, match="needs tokenizer="):
        ef.export(model, tmp_path / "x", quant="keep", **FAST)
    with pytest.raises(UserError, match="cannot export a dict"):
        ef.export({"weights": 1}, tmp_path / "x")
