"""Tensor-parallel tests: tiny random models split over ranks started by mpirun (Open MPI from
Debian, `make system-deps`; mpi4py from PyPI, `make install`), each rank a separate process."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory, smollm_path):
    """Random HF models of three families with head counts that split over 2 and 4 ranks."""
    sys.path.insert(0, str(HERE.parent))
    from tiny_models import build_tiny_model, save_tokenizer

    root = tmp_path_factory.mktemp("tp-models")
    tok = root / "tokenizer"
    tok.mkdir()
    vocab = save_tokenizer(smollm_path, tok)
    out = {}
    for case in ("llama-gqa-untied", "gemma3-local-global", "llama-mha-tied-llama3-rope"):
        out[case] = root / case
        out[case].mkdir()
        build_tiny_model(case, tok, vocab, out[case])
    return out
