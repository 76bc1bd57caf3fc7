"""`requantize`: a model file's wider matrices converted at load (a GGUF's 5- to 8-bit matrices to
q4_0). The native engine on the converted matrices agrees with the numpy reference run on the same
conversion, every matrix wider than the target is converted and nothing else, and the option is
refused where it cannot apply."""

from __future__ import annotations

import dataclasses

import edgeflash as ef
import numpy as np
import pytest
from edgeflash import kernels
from edgeflash.base.errors import UserError
from edgeflash.kernels.formats import get_format
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.reference import ReferenceEngine
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.tensors import Tensor, dequantize_raw


def _wider(source, tensor: Tensor, target: str) -> bool:
    head = tensor.name == "token_embd.weight" and not source.spec.tied_embeddings
    return (len(tensor.shape) == 2 and not head and tensor.cols % 32 == 0
            and get_format(tensor.fmt).bits_per_weight > get_format(target).bits_per_weight)


def _converted(source, target: str):
    """The source with each wider matrix quantized to `target`, written independently of the engine."""
    tensors = dict(source.tensors)
    for name, t in source.tensors.items():
        if _wider(source, t, target):
            raw = kernels.quantize(dequantize_raw(t.raw, t.fmt, t.cols), target)
            tensors[name] = Tensor(name, target, t.shape, raw)
    return dataclasses.replace(source, tensors=tensors)


def _ppl(logits: np.ndarray, ids: list[int]) -> float:
    x = logits[:-1].astype(np.float64)
    m = x.max(-1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


def test_requantized_engine_matches_reference_on_the_same_conversion(smollm_path):
    """SmolLM2's q4_1 matrices and its q8_0 embedding, which is also its head, become q4_0."""
    from edgeflash.export.corpus import heldout_windows

    alias = "smollm2-135m"
    source = open_model(smollm_path)
    native = NativeEngine(source, requantize="q4_0")
    expected = {n: f"{t.fmt}->q4_0" for n, t in source.tensors.items() if _wider(source, t, "q4_0")}
    assert expected, f"{alias}: the file has no matrix wider than q4_0"
    assert native.conversions == expected
    assert native.weight_bytes < source.weight_bytes

    ids = source.tokenizer.encode(heldout_windows(1, chars_per_window=2400, offset_chars=60_000)[0])[:384]
    a = native.forward(ids, all_logits=True)
    b = ReferenceEngine(_converted(source, "q4_0")).forward(ids, all_logits=True)
    agree = float((a.argmax(-1) == b.argmax(-1)).mean())
    pa, pb = _ppl(a, ids), _ppl(b, ids)
    print(f"{alias} requantized to q4_0: top-1 agreement {agree:.4f}, perplexity native {pa:.3f} "
          f"reference {pb:.3f}, original {_ppl(NativeEngine(source).forward(ids, all_logits=True), ids):.3f}")
    assert agree >= 0.99
    assert abs(pa - pb) / pb <= 0.005


def test_requantize_to_a_wider_format_changes_nothing(smollm_path):
    """SmolLM2's file is q4_1 with a q8_0 embedding: to q8_0 nothing is wider, so nothing converts."""
    source = open_model(smollm_path)
    assert NativeEngine(source, requantize="q8_0").conversions == {}


def test_requantize_refused_where_it_cannot_apply(smollm_path):
    with pytest.raises(UserError, match="requantize = 'q3_k': expected one of q4_0, q8_0"):
        ef.load(smollm_path, requantize="q3_k")
    with pytest.raises(UserError, match="export a bundle with `--quant q4_0`"):
        ef.load(smollm_path, requantize="q4_0", memory_budget="200MB")
    with pytest.raises(UserError, match="reference engine"):
        ef.load(smollm_path, requantize="q4_0", engine="reference")
