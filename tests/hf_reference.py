"""transformers' fp32 model and tokenizer for a GGUF file: the numerical reference of the tests."""

from __future__ import annotations

from pathlib import Path

_HF_CACHE: dict = {}
_TOKENIZERS: dict = {}


def transformers_tokenizer(path: Path):
    """transformers' tokenizer for a GGUF file, built once for the session: building it reads the
    file's whole vocabulary in Python (seconds per model), and the test modules only encode,
    decode, render templates and save with it, none changes it."""
    key = str(path)
    if key not in _TOKENIZERS:
        from transformers import AutoTokenizer

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
        tok = transformers_tokenizer(path)
        model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32)
        model.eval()
        _HF_CACHE[key] = (tok, model)
    return _HF_CACHE[key]
