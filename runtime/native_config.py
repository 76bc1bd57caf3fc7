"""What the native engine is built from (its shape, per-layer shapes and options, as the C++ structs
of runtime/native/engine.h) and the memory that takes. The memory comes from the engine's own
function (`plan_memory`), so a budget can be split, or a drafter's reserve counted, before any
engine exists."""

from __future__ import annotations

import numpy as np
from edgeflash.kernels import _native
from edgeflash.runtime.rope import inv_frequencies
from edgeflash.runtime.spec import ModelSpec

DEFAULT_CONTEXT = 4096  # KV cache positions when the caller does not say (the model may allow more)
HEAD_CHUNK = 16384  # head rows per logits pass: its buffers take max_batch x 3 x this many floats
# Tokens per forward call (prefill chunk, verification tree). 128 rather than 64: a 512-token
# prefill of Qwen2.5-Coder-1.5B ran 6% faster (fewer passes over the weights and the KV cache).
MAX_BATCH = 128


def engine_shape(spec: ModelSpec) -> _native.ModelShape:
    s = _native.ModelShape()
    s.n_layers, s.d_model, s.n_heads, s.n_kv_heads = spec.n_layers, spec.d_model, spec.n_heads, spec.n_kv_heads
    s.head_dim, s.d_ff, s.vocab = spec.head_dim, spec.d_ff, spec.vocab_size
    s.norm_eps, s.embedding_scale, s.attn_scale = spec.norm_eps, spec.embedding_scale, spec.attn_scale
    s.final_softcap, s.activation = spec.final_logit_softcap, spec.activation
    s.qk_norm, s.sandwich_norm = spec.qk_norm, spec.sandwich_norm
    return s


def layer_shapes(spec: ModelSpec) -> list[_native.LayerShape]:
    """Per layer window and RoPE, as the kernel's (theta_base, per-frequency divisor) pair that
    reproduces the spec's inverse frequencies, whatever scaling produced them."""
    out = []
    half = spec.rope_dim // 2
    for layer in range(spec.n_layers):
        base = spec.rope_base(layer)
        plain = 1.0 / base ** (np.arange(half, dtype=np.float64) * 2 / spec.rope_dim)
        ls = _native.LayerShape()
        ls.window, ls.rot_dim, ls.theta_base = spec.window(layer), spec.rope_dim, base
        ls.freq_factors = [float(f) for f in plain / inv_frequencies(spec, layer)]
        out.append(ls)
    return out


def engine_options(spec: ModelSpec, *, context_length: int | None = None, max_batch: int = MAX_BATCH,
                   kv_format: str = "f16", activations: str = "q8x2", head_chunk: int = HEAD_CHUNK
                   ) -> _native.EngineOptions:
    o = _native.EngineOptions()
    o.context = min(context_length or DEFAULT_CONTEXT, spec.context_length)
    o.max_batch, o.kv_format, o.activations, o.head_chunk = max_batch, kv_format, activations, head_chunk
    return o


def engine_memory(spec: ModelSpec, options: _native.EngineOptions) -> _native.EngineMemory:
    """Bytes of the KV cache and the work buffers the engine will allocate (`.kv_cache`, `.activations`)."""
    return _native.plan_memory(engine_shape(spec), layer_shapes(spec), options)


def kv_cache_bytes(spec: ModelSpec, context: int, max_batch: int = MAX_BATCH, kv_format: str = "f16") -> int:
    options = engine_options(spec, context_length=context, max_batch=max_batch, kv_format=kv_format)
    return engine_memory(spec, options).kv_cache


def default_context(spec: ModelSpec, budget: int, share: float = 0.25, cap: int = DEFAULT_CONTEXT, floor: int = 256,
                    kv_format: str = "f16") -> int:
    """The longest context (a power of two, at most `cap` and the model's) whose KV cache takes at
    most `share` of the budget; `floor` if none does (the planner then says what is missing)."""
    context = min(cap, spec.context_length)
    while context > floor and kv_cache_bytes(spec, context, kv_format=kv_format) > share * budget:
        context //= 2
    return max(min(floor, spec.context_length), context)
