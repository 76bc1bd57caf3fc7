"""transformers' fp32 model and tokenizer for a GGUF file: the numerical reference of the tests."""

from __future__ import annotations

import os
from contextlib import contextmanager
from pathlib import Path

_HF_CACHE: dict = {}
_TOKENIZERS: dict = {}


@contextmanager
def _one_gguf_reader_per_file():
    """transformers reads a GGUF file's metadata anew for the config, the tokenizer and the
    weights, each time with a new gguf.GGUFReader, which parses every field in Python (about
    10 s for Gemma 3's vocabulary). Inside this block the readers it asks for are made once per
    file and shared: transformers only reads them."""
    import gguf

    make = gguf.GGUFReader
    readers: dict = {}

    def reader(path, mode="r"):
        key = (os.fspath(path), mode)
        if key not in readers:
            readers[key] = make(path, mode)
        return readers[key]

    gguf.GGUFReader = reader
    try:
        yield
    finally:
        gguf.GGUFReader = make


def transformers_tokenizer(path: Path):
    """transformers' tokenizer for a GGUF file, built once for the session: building it reads the
    file's whole vocabulary in Python (seconds per model), and the test modules only encode,
    decode, render templates and save with it, none changes it."""
    key = str(path)
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

        with _one_gguf_reader_per_file():
            _TOKENIZERS[key] = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    return _TOKENIZERS[key]


def transformers_reference(path: Path):
    """(tokenizer, fp32 model) from transformers for a GGUF file; cached for the session
    because building the fp32 model from GGUF takes most of a minute."""
    key = str(path)
    if key not in _HF_CACHE:
        import torch
        from transformers import AutoModelForCausalLM

        torch.set_num_threads(2)
        with _one_gguf_reader_per_file():
            tok = transformers_tokenizer(path)
            model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        model.eval()
        _HF_CACHE[key] = (tok, model)
    return _HF_CACHE[key]
