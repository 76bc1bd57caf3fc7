"""Forward passes over windows of text for calibration and evaluation.

The same family functions the reference engine runs (embed, block, final_norm), over one window
at a time with a fresh cache, stopping before the head: calibration needs the head's input but
not its 262k-wide output, and evaluation computes log-probabilities chunk by chunk so a window's
full logits never have to exist at once.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from edgeflash.runtime.families import family
from edgeflash.runtime.families.common import LayerWeights
from edgeflash.runtime.rope import inv_frequencies
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor


class _WindowContext:
    """ForwardContext for one window processed in a single call (positions 0..T-1)."""

    def __init__(self, inv_freq: list[np.ndarray], n_tokens: int):
        self._inv_freq = inv_freq
        self.positions = np.arange(n_tokens)
        self.mask = None

    def inv_freq(self, layer: int) -> np.ndarray:
        return self._inv_freq[layer]

    def store_kv(self, layer: int, k: np.ndarray, v: np.ndarray):
        # k, v: [T, Hkv, D] -> the cache layout [Hkv, T, D]; nothing is cached beyond this call
        return k.transpose(1, 0, 2), v.transpose(1, 0, 2), self.positions


def head_tensor(source: ModelSource) -> Tensor:
    return source.tensors.get("output.weight") or source.tensors["token_embd.weight"]


def final_hidden(source: ModelSource, ops: Any, tokens: list[int] | np.ndarray) -> np.ndarray:
    """Final-norm hidden states `[T, d_model]` of one window (the head's input)."""
    spec = source.spec
    fam = family(spec.family)
    tokens = np.asarray(tokens, dtype=np.int64)
    ctx = _WindowContext([inv_frequencies(spec, i) for i in range(spec.n_layers)], len(tokens))
    x = fam.embed(ops, spec, source.tensors, tokens)  # [T, d]
    for layer in range(spec.n_layers):
        x = fam.block(ops, spec, layer, LayerWeights(source.tensors, layer), x, ctx)
    return fam.final_norm(ops, spec, source.tensors, x)


def logits(source: ModelSource, ops: Any, hidden: np.ndarray) -> np.ndarray:
    """Head output `[T, vocab]` for final hidden states, with the spec's soft-capping."""
    out = ops.linear(hidden, head_tensor(source))
    cap = source.spec.final_logit_softcap
    return np.tanh(out / cap) * cap if cap else out


def token_nll(source: ModelSource, ops: Any, tokens: list[int], chunk: int = 128) -> np.ndarray:
    """Negative log-likelihood (nats) of tokens[1:] given their prefixes, float64 `[T - 1]`."""
    hidden = final_hidden(source, ops, tokens[:-1])  # [T-1, d]
    targets = np.asarray(tokens[1:], dtype=np.int64)
    out = np.empty(len(targets), dtype=np.float64)
    for start in range(0, len(targets), chunk):
        z = logits(source, ops, hidden[start:start + chunk])  # [c, vocab] float32
        lse = torch.logsumexp(torch.from_numpy(np.ascontiguousarray(z)), dim=1).numpy().astype(np.float64)
        out[start:start + chunk] = lse - z[np.arange(len(z)), targets[start:start + chunk]]
    return out
