"""ReferenceEngine: the whole model in numpy float32, with a KV cache. Clarity beats speed."""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.families import family
from edgeflash.runtime.families.common import LayerWeights
from edgeflash.runtime.reference.ops import NumpyOps
from edgeflash.runtime.rope import inv_frequencies
from edgeflash.runtime.source import ModelSource


class _KVCache:
    """Per layer keys and values `[Hkv, S, D]` of every cached token. `store_dtype` float16
    rounds them as an f16 cache would (to compare with engines that store f16)."""

    def __init__(self, n_layers: int, store_dtype: type = np.float32):
        self.keys: list[np.ndarray | None] = [None] * n_layers
        self.values: list[np.ndarray | None] = [None] * n_layers
        self.store_dtype = store_dtype

    def append(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        if self.store_dtype is not np.float32:
            k = k.astype(self.store_dtype).astype(np.float32)
            v = v.astype(self.store_dtype).astype(np.float32)
        k, v = k.transpose(1, 0, 2), v.transpose(1, 0, 2)  # [T, Hkv, D] -> [Hkv, T, D]
        old_k, old_v = self.keys[layer], self.values[layer]
        self.keys[layer] = k if old_k is None else np.concatenate([old_k, k], axis=1)
        self.values[layer] = v if old_v is None else np.concatenate([old_v, v], axis=1)
        return self.keys[layer], self.values[layer]

    def truncate(self, n: int) -> None:
        self.keys = [None if k is None else k[:, :n] for k in self.keys]
        self.values = [None if v is None else v[:, :n] for v in self.values]


class _Context:
    def __init__(self, engine: ReferenceEngine, positions: np.ndarray, mask: np.ndarray | None):
        self.engine, self.positions, self.mask = engine, positions, mask

    def inv_freq(self, layer: int) -> np.ndarray:
        return self.engine.inv_freq[layer]

    def store_kv(self, layer: int, k: np.ndarray, v: np.ndarray):
        keys, values = self.engine.cache.append(layer, k, v)
        return keys, values, np.arange(keys.shape[1])


class ReferenceEngine:
    """Runs any supported family from its spec with numpy ops (swappable op by op for kernels)."""

    name = "reference"

    def __init__(self, source: ModelSource, ops: Any = None, context_length: int | None = None,
                 kv_dtype: str = "f32"):
        self.source = source
        self.spec = source.spec
        self.tokenizer = source.tokenizer
        self.family = family(self.spec.family)
        self.ops = ops or NumpyOps()
        self.context_length = min(context_length or self.spec.context_length, self.spec.context_length)
        self.inv_freq = [inv_frequencies(self.spec, i) for i in range(self.spec.n_layers)]
        self.layers = [LayerWeights(source.tensors, i) for i in range(self.spec.n_layers)]
        self.head = source.tensors.get("output.weight") or source.tensors["token_embd.weight"]
        if kv_dtype not in ("f32", "f16"):
            raise UserError(f"kv_dtype = {kv_dtype!r}: expected f32 or f16")
        self.cache = _KVCache(self.spec.n_layers, np.float16 if kv_dtype == "f16" else np.float32)
        self.tokens: list[int] = []

    def forward(self, tokens: Sequence[int], *, all_logits: bool = False, mask: np.ndarray | None = None) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int64)
        start = len(self.tokens)
        if start + len(tokens) > self.context_length:
            raise UserError(f"context length exceeded: {start} cached + {len(tokens)} new tokens > "
                            f"{self.context_length}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.spec.vocab_size):
            raise UserError(f"token id out of range 0..{self.spec.vocab_size - 1}")
        positions = np.arange(start, start + len(tokens))
        full_mask = None
        if mask is not None:  # [T, T] among the new tokens; every cached token stays visible
            full_mask = np.concatenate([np.ones((len(tokens), start), dtype=bool), mask], axis=1)
        ctx = _Context(self, positions, full_mask)
        x = self.family.embed(self.ops, self.spec, self.source.tensors, tokens)  # [T, d]
        for layer, w in enumerate(self.layers):
            x = self.family.block(self.ops, self.spec, layer, w, x, ctx)
        self.tokens.extend(int(t) for t in tokens)
        x = self.family.final_norm(self.ops, self.spec, self.source.tensors, x if all_logits else x[-1:])
        return self.logits(x)

    def logits(self, x: np.ndarray) -> np.ndarray:
        logits = self.ops.linear(x, self.head)  # [T, vocab]
        cap = self.spec.final_logit_softcap
        return np.tanh(logits / cap) * cap if cap else logits

    def truncate(self, n_tokens: int) -> None:
        self.cache.truncate(n_tokens)
        del self.tokens[n_tokens:]

    def reset(self) -> None:
        self.truncate(0)

    def stats(self) -> dict[str, Any]:
        return {"engine": self.name}

    def close(self) -> None:
        self.reset()
