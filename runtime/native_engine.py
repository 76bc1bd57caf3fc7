"""NativeEngine: the C++ decoder (runtime/native/) behind the Engine contract.

Python builds it once from a ModelSource (weights stay where they are: a memory-mapped GGUF or
bundle is read in place) and then calls one C++ function per forward pass. Formats the kernels
do not run are converted once at load, and the conversion is reported in the stats.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.rope import inv_frequencies
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor

KERNEL_FORMATS = ("f32", "f16", "q8_0", "q4_0", "q4_1", "q5_0", "q4_k", "q6_k", "q4_lut")
DEFAULT_CONTEXT = 4096  # KV cache positions when the caller does not say (the model may allow more)
HEAD_CHUNK = 16384  # head rows per logits pass: its buffers take max_batch x 3 x this many floats

_MATRICES = {"q": "attn_q.weight", "k": "attn_k.weight", "v": "attn_v.weight", "o": "attn_output.weight",
             "gate": "ffn_gate.weight", "up": "ffn_up.weight", "down": "ffn_down.weight",
             "pred_a": "predictor_a.weight", "pred_b": "predictor_b.weight"}  # predictors: sparse mode only
_VECTORS = {"attn_norm": "attn_norm.weight", "ffn_norm": "ffn_norm.weight",
            "post_attn_norm": "post_attention_norm.weight", "post_ffn_norm": "post_ffw_norm.weight",
            "q_norm": "attn_q_norm.weight", "k_norm": "attn_k_norm.weight",
            "q_bias": "attn_q.bias", "k_bias": "attn_k.bias", "v_bias": "attn_v.bias"}


def engine_shape(spec: ModelSpec) -> dict[str, Any]:
    return {"n_layers": spec.n_layers, "d_model": spec.d_model, "n_heads": spec.n_heads,
            "n_kv_heads": spec.n_kv_heads, "head_dim": spec.head_dim, "d_ff": spec.d_ff, "vocab": spec.vocab_size,
            "norm_eps": spec.norm_eps, "embedding_scale": spec.embedding_scale, "attn_scale": spec.attn_scale,
            "final_softcap": spec.final_logit_softcap, "activation": spec.activation, "qk_norm": spec.qk_norm,
            "sandwich_norm": spec.sandwich_norm}


def layer_shapes(spec: ModelSpec) -> list[dict[str, Any]]:
    """Per layer window and RoPE, as the kernel's (theta_base, per-frequency divisor) pair that
    reproduces the spec's inverse frequencies, whatever scaling produced them."""
    out = []
    half = spec.rope_dim // 2
    for layer in range(spec.n_layers):
        base = spec.rope_base(layer)
        plain = 1.0 / base ** (np.arange(half, dtype=np.float64) * 2 / spec.rope_dim)
        factors = plain / inv_frequencies(spec, layer)
        out.append({"window": spec.window(layer), "rot_dim": spec.rope_dim, "theta_base": base,
                    "freq_factors": [float(f) for f in factors]})
    return out


class NativeEngine:
    """The fast engine: every heavy op runs in C++ on the hand-written kernels."""

    name = "native"

    def __init__(self, source: ModelSource, *, threads: int = 2, context_length: int | None = None,
                 max_batch: int = 64, kv_format: str = "f16", activations: str = "q8x2",
                 head_chunk: int = HEAD_CHUNK):
        import edgeflash.kernels as kernels
        from edgeflash.kernels import _native

        spec = source.spec
        self.source, self.spec, self.tokenizer = source, spec, source.tokenizer
        self.context_length = min(context_length or DEFAULT_CONTEXT, spec.context_length)
        self.max_batch = max_batch
        self.head_chunk = head_chunk
        self.activations = activations
        self.kv_format = kv_format
        self.threads = threads
        kernels.set_num_threads(threads)
        self.conversions: dict[str, str] = {}
        try:
            self._engine = _native.Engine(engine_shape(spec), layer_shapes(spec), self.context_length, max_batch,
                                          kv_format, activations, head_chunk)
        except ValueError as e:
            raise UserError(f"{source.path}: {e}") from None
        self.tokens: list[int] = []
        self._last_logits = np.empty((1, spec.vocab_size), dtype=np.float32)  # decode needs one row
        self.weight_bytes = source.weight_bytes
        self._load_weights()

    def _load_weights(self) -> None:
        """Everything resident, read in place (a memory-mapped file is paged in as it is used)."""
        self._set_weights(self.source.tensors)

    def _set_weights(self, t: dict[str, Tensor]) -> None:
        """Hand the engine every tensor present in `t` (a budgeted engine leaves streamed ones out)."""
        if "token_embd.weight" in t:
            self._engine.set_embedding(*self._matrix(t["token_embd.weight"]))
        head = t.get("output.weight") if not self.spec.tied_embeddings else t.get("token_embd.weight")
        if head is not None:
            self._engine.set_head(*self._matrix(head))
        self._engine.set_output_norm(self._vector(t["output_norm.weight"]))
        for layer in range(self.spec.n_layers):
            prefix = f"blk.{layer}."
            for slot, name in _MATRICES.items():
                if prefix + name in t:
                    self._engine.set_matrix(layer, slot, *self._matrix(t[prefix + name]))
            for slot, name in _VECTORS.items():
                if prefix + name in t:
                    self._engine.set_vector(layer, slot, self._vector(t[prefix + name]))

    def _matrix(self, tensor: Tensor) -> tuple[np.ndarray, str, int, int]:
        """(raw bytes, format, rows, cols), converting formats the kernels do not run."""
        raw, fmt = tensor.raw, tensor.fmt
        if fmt not in KERNEL_FORMATS:
            import edgeflash.kernels as kernels

            target = "q8_0" if tensor.cols % 32 == 0 else "f16"
            raw = kernels.quantize(tensor.dequantize().reshape(tensor.rows, tensor.cols), target)
            self.conversions[tensor.name] = f"{fmt}->{target}"
            fmt = target
        return np.ascontiguousarray(raw), fmt, tensor.rows, tensor.cols

    @staticmethod
    def _vector(tensor: Tensor) -> np.ndarray:
        return np.ascontiguousarray(tensor.dequantize().reshape(-1), dtype=np.float32)

    def forward(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        tokens = np.asarray(tokens, dtype=np.int32)
        if len(self.tokens) + len(tokens) > self.context_length:
            raise UserError(f"context length exceeded: {len(self.tokens)} cached + {len(tokens)} new tokens > "
                            f"{self.context_length}")
        if len(tokens) and (tokens.min() < 0 or tokens.max() >= self.spec.vocab_size):
            raise UserError(f"token id out of range 0..{self.spec.vocab_size - 1}")
        outputs = []
        for start in range(0, len(tokens), self.max_batch):
            chunk = tokens[start:start + self.max_batch]
            n = len(chunk)
            base = self._engine.committed
            positions = np.arange(base, base + n, dtype=np.int32)
            last_chunk = start + n >= len(tokens)
            if all_logits:  # teacher forcing: a transient [n, vocab] buffer per chunk
                rows, logits = np.arange(n, dtype=np.int32), np.empty((n, self.spec.vocab_size), np.float32)
            elif last_chunk:
                rows, logits = np.array([n - 1], dtype=np.int32), self._last_logits
            else:
                rows, logits = np.empty(0, dtype=np.int32), self._last_logits[:0]
            self._engine.forward(chunk, positions, None, rows, logits)
            self.tokens.extend(int(t) for t in chunk)
            if len(rows):
                outputs.append(logits if all_logits else logits.copy())
        return np.concatenate(outputs) if outputs else np.empty((0, self.spec.vocab_size), np.float32)

    def forward_tree(self, tokens: Sequence[int], depths: Sequence[int], mask: np.ndarray, *,
                     argmax_only: bool = False) -> np.ndarray:
        """Verify a token tree in one pass: tokens at positions len(self.tokens) + depth, each
        attending to the cache and to its ancestors (`mask[i, j]`: token i sees tree token j).
        Nothing is kept until `commit_tree`. Returns logits [n, vocab], or with `argmax_only` each
        node's most likely next token [n] (no [n, vocab] buffer: what greedy verification needs)."""
        tokens = np.asarray(tokens, dtype=np.int32)
        n = len(tokens)
        if len(self.tokens) + n > self.context_length:  # each node holds a cache slot until commit
            raise UserError(f"context length exceeded: {len(self.tokens)} cached + a tree of {n} tokens "
                            f"> {self.context_length}")
        positions = (np.asarray(depths, dtype=np.int32) + self._engine.committed).astype(np.int32)
        out = np.empty(n, dtype=np.int32) if argmax_only else np.empty((n, self.spec.vocab_size), dtype=np.float32)
        self._engine.forward(tokens, positions, np.ascontiguousarray(mask, dtype=np.uint8),
                             np.arange(n, dtype=np.int32), out)
        self._tree_tokens = tokens
        return out

    def commit_tree(self, path: Sequence[int]) -> None:
        """Keep the keys/values of the tree nodes on `path` (indices, root first)."""
        path = np.asarray(path, dtype=np.int32)
        self._engine.commit(path)
        self.tokens.extend(int(self._tree_tokens[i]) for i in path)

    def truncate(self, n_tokens: int) -> None:
        kept = self._engine.truncate(n_tokens)
        del self.tokens[kept:]

    def reset(self) -> None:
        self.truncate(0)

    def stats(self) -> dict[str, Any]:
        mem = self._engine.memory()
        out = {"engine": self.name, "threads": self.threads, "activations": self.activations,
               "weight_bytes": self.weight_bytes, "kv_cache_bytes": mem["kv_cache"], "kv_cache_format": self.kv_format,
               "activation_bytes": mem["activations"] + self._last_logits.nbytes}
        if self.conversions:
            out["converted_tensors"] = len(self.conversions)
        return out

    def close(self) -> None:
        self.reset()
