"""`requantize`: a model file's wider matrices converted at load (a GGUF's 5- to 8-bit matrices to
q4_0, or to q3_k where the rows split into 256-value blocks and q4_0 elsewhere). The native engine
on the converted matrices agrees with the numpy reference run on the same conversion, every matrix
wider than the target is converted and nothing else, and the option is refused where it cannot
apply."""

from __future__ import annotations

import dataclasses

import edgeflash as ef
import numpy as np
import pytest
from edgeflash import kernels
from edgeflash.base.errors import UserError
from edgeflash.kernels.formats import REQUANTIZE_FALLBACK, get_format
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.reference import ReferenceEngine
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.tensors import Tensor, dequantize_raw


def _target(source, tensor: Tensor, requantize: str) -> str | None:
    """What `requantize` makes of this tensor: the format, its q4_0 fallback for rows that are not
    whole blocks of it, or None when the tensor is not wider."""
    head = tensor.name == "token_embd.weight" and not source.spec.tied_embeddings
    target = requantize if tensor.cols % get_format(requantize).block_elems == 0 else REQUANTIZE_FALLBACK
    wider = (len(tensor.shape) == 2 and not head and tensor.cols % 32 == 0
             and get_format(tensor.fmt).bits_per_weight > get_format(target).bits_per_weight)
    return target if wider else None


def _converted(source, requantize: str):
    """The source with each wider matrix quantized to its target, written independently of the engine."""
    tensors = dict(source.tensors)
    for name, t in source.tensors.items():
        if target := _target(source, t, requantize):
            raw = kernels.quantize(dequantize_raw(t.raw, t.fmt, t.cols), target)
            tensors[name] = Tensor(name, target, t.shape, raw)
    return dataclasses.replace(source, tensors=tensors)


def _ppl(logits: np.ndarray, ids: list[int]) -> float:
    x = logits[:-1].astype(np.float64)
    m = x.max(-1, keepdims=True)
    logp = x - m - np.log(np.exp(x - m).sum(-1, keepdims=True))
    return float(np.exp(-logp[np.arange(len(ids) - 1), ids[1:]].mean()))


@pytest.mark.parametrize("requantize", ["q4_0", "q3_k"])
def test_requantized_engine_matches_reference_on_the_same_conversion(smollm_path, requantize):
    """SmolLM2's q4_1 matrices and its q8_0 embedding, which is also its head, become q4_0; with
    q3_k its FFN down matrices (1536 columns) become q3_k and the rest (576 columns) fall back to q4_0."""
    from edgeflash.export.corpus import heldout_windows

    alias = "smollm2-135m"
    source = open_model(smollm_path)
    native = NativeEngine(source, requantize=requantize)
    targets = {n: target for n, t in source.tensors.items() if (target := _target(source, t, requantize))}
    assert targets, f"{alias}: the file has no matrix wider than {requantize}"
    expected = {n: f"{source.tensors[n].fmt}->{target}" + ("" if target == requantize else
                f" ({source.tensors[n].cols} columns: q3_k needs a multiple of 256)") for n, target in targets.items()}
    assert native.conversions == expected
    assert native.weight_bytes < source.weight_bytes
    if requantize == "q3_k":  # both paths are taken, and the stats say which matrices fell back
        assert {"q3_k", "q4_0"} == set(targets.values())
        kinds = native.stats()["converted_formats"]
        assert kinds["q4_1->q4_0 (576 columns: q3_k needs a multiple of 256)"] > 0
        assert kinds["q4_1->q3_k"] == sum(1 for n in targets if n.endswith("ffn_down.weight")) > 0

    ids = source.tokenizer.encode(heldout_windows(1, chars_per_window=2400, offset_chars=60_000)[0])[:384]
    a = native.forward(ids, all_logits=True)
    b = ReferenceEngine(_converted(source, requantize)).forward(ids, all_logits=True)
    agree = float((a.argmax(-1) == b.argmax(-1)).mean())
    pa, pb = _ppl(a, ids), _ppl(b, ids)
    print(f"{alias} requantized to {requantize}: top-1 agreement {agree:.4f}, perplexity native {pa:.3f} "
          f"reference {pb:.3f}, original {_ppl(NativeEngine(source).forward(ids, all_logits=True), ids):.3f}")
    assert agree >= 0.99
    assert abs(pa - pb) / pb <= 0.005


def test_requantize_to_a_wider_format_changes_nothing(smollm_path):
    """SmolLM2's file is q4_1 with a q8_0 embedding: to q8_0 nothing is wider, so nothing converts."""
    source = open_model(smollm_path)
    assert NativeEngine(source, requantize="q8_0").conversions == {}


def test_requantize_refused_where_it_cannot_apply(smollm_path):
    with pytest.raises(UserError, match="requantize = 'q2_k': expected one of q4_0, q8_0, q3_k"):
        ef.load(smollm_path, requantize="q2_k")
    with pytest.raises(UserError, match="export a bundle with `--quant q4_0`"):
        ef.load(smollm_path, requantize="q4_0", memory_budget="200MB")
    with pytest.raises(UserError, match="reference engine"):
        ef.load(smollm_path, requantize="q4_0", engine="reference")
