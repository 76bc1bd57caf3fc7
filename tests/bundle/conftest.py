"""A tiny random Llama exported to a bundle once per session (through the torch-module source)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FAST = {"calibration_tokens": 128, "window_tokens": 64, "eval_tokens": 64, "predictor_rank": 8, "top_tokens": 64,
        "frequency_chars": 20_000, "progress": False}


@pytest.fixture(scope="session")
def tiny_tokenizer_dir(tmp_path_factory, smollm_path):
    from tiny_models import save_tokenizer

    out = tmp_path_factory.mktemp("tiny-tokenizer")
    return out, save_tokenizer(smollm_path, out)


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, tiny_tokenizer_dir):
    from tiny_models import build_tiny_model

    tok_dir, vocab = tiny_tokenizer_dir
    model = build_tiny_model("llama-gqa-untied", tok_dir, vocab, tmp_path_factory.mktemp("tiny-llama"))
    return model, tok_dir


@pytest.fixture(scope="session")
def tiny_bundle_dir(tmp_path_factory, tiny_model) -> Path:
    """A q4_0 bundle with every block kind a llama has (arenas, predictors, untied head)."""
    from edgeflash.export import export

    model, tok_dir = tiny_model
    out = tmp_path_factory.mktemp("bundles") / "tiny-q4_0"
    export(model, out, quant="q4_0", config=model.config, tokenizer=tok_dir, **FAST)
    return out


@pytest.fixture
def bundle_copy(tiny_bundle_dir, tmp_path) -> Path:
    """A private copy a test may corrupt."""
    dst = tmp_path / "copy"
    shutil.copytree(tiny_bundle_dir, dst)
    return dst
