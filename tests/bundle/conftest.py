"""A tiny random Llama exported to a bundle once per session (through the torch-module source)."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

FAST = {"calibration_tokens": 128, "window_tokens": 64, "eval_tokens": 64, "predictor_rank": 8, "top_tokens": 64,
        "frequency_chars": 20_000, "progress": False}


@pytest.fixture(scope="session")
def tiny_model(tmp_path_factory, smollm_path):
    """(random 3-layer Llama with SmolLM2's vocabulary, SmolLM2's tokenizer read from its GGUF)."""
    from edgeflash.export.sources.torch_module import resolve_tokenizer
    from tiny_models import build_tiny_model

    tok = resolve_tokenizer(smollm_path)
    no_files = tmp_path_factory.mktemp("no-tokenizer-files")  # the bundle gets `tok`, not HF files
    model = build_tiny_model("llama-gqa-untied", no_files, tok.vocab_size, tmp_path_factory.mktemp("tiny-llama"))
    return model, tok


@pytest.fixture(scope="session")
def tiny_bundle_dir(tmp_path_factory, tiny_model) -> Path:
    """A q4_0 bundle with every block kind a llama has (arenas, predictors, untied head)."""
    from edgeflash.export import export

    model, tok = tiny_model
    out = tmp_path_factory.mktemp("bundles") / "tiny-q4_0"
    export(model, out, quant="q4_0", config=model.config, tokenizer=tok, **FAST)
    return out


@pytest.fixture
def bundle_copy(tiny_bundle_dir, tmp_path) -> Path:
    """A private copy a test may corrupt."""
    dst = tmp_path / "copy"
    shutil.copytree(tiny_bundle_dir, dst)
    return dst
