"""Llama family: Llama 2/3, Mistral, Qwen2 (q/k/v bias), Qwen3 (q/k norm), SmolLM.

Pre-norm blocks: x += attn(rms_norm(x)); x += down(silu(gate) * up)(rms_norm(x)).
"""

from __future__ import annotations

import re
from typing import Any

import numpy as np
from edgeflash.runtime.families.common import (
    ForwardContext,
    LayerWeights,
    Ops,
    attention_sublayer,
    config_get,
    ffn_sublayer,
    hf_rope_parameters,
    meta_get,
    rope_scaling_from_gguf,
    rope_scaling_from_hf,
)
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor

GGUF_ARCHS = ("llama", "mistral", "qwen2", "qwen3")
HF_MODEL_TYPES = ("llama", "mistral", "qwen2", "qwen3")

# llama.cpp stores q/k rows of these architectures permuted for its interleaved RoPE; the
# canonical layout (and every kernel) uses rotate-half RoPE, so loading undoes the permutation.
_INTERLEAVED_ROPE_ARCHS = ("llama", "mistral")


def spec_from_gguf(meta: dict[str, Any], tensor_names: set[str], where: str = "model") -> ModelSpec:
    arch = meta["general.architecture"]
    p = arch + "."
    d_model = meta_get(meta, p + "embedding_length", where)
    n_heads = meta_get(meta, p + "attention.head_count", where)
    head_dim = meta_get(meta, p + "attention.key_length", where, d_model // n_heads)
    n_layers = meta_get(meta, p + "block_count", where)
    window = meta_get(meta, p + "attention.sliding_window", where, 0)
    vocab = meta_get(meta, p + "vocab_size", where, 0) or len(meta.get("tokenizer.ggml.tokens") or [])
    scaling = rope_scaling_from_gguf(meta, p, where)
    return ModelSpec(
        family="llama", arch=arch, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
        n_kv_heads=meta_get(meta, p + "attention.head_count_kv", where, n_heads), head_dim=head_dim,
        d_ff=meta_get(meta, p + "feed_forward_length", where), vocab_size=vocab,
        context_length=meta_get(meta, p + "context_length", where, 4096),
        norm_eps=float(meta_get(meta, p + "attention.layer_norm_rms_epsilon", where)),
        rope_theta=float(meta_get(meta, p + "rope.freq_base", where, 10000.0)),
        rope_dim=meta_get(meta, p + "rope.dimension_count", where, head_dim),
        rope_scaling=scaling, sliding_window=window,
        layer_kinds=["sliding" if window else "full"] * n_layers,
        tied_embeddings="output.weight" not in tensor_names,
        attn_bias="blk.0.attn_q.bias" in tensor_names,
        qk_norm="blk.0.attn_q_norm.weight" in tensor_names,
        activation="silu",
    )


def spec_from_hf(config: dict[str, Any], where: str = "config.json") -> ModelSpec:
    d_model = config_get(config, "hidden_size", where)
    n_heads = config_get(config, "num_attention_heads", where)
    head_dim = config.get("head_dim") or d_model // n_heads
    n_layers = config_get(config, "num_hidden_layers", where)
    model_type = config_get(config, "model_type", where)
    window = config.get("sliding_window") or 0
    if model_type in ("qwen2", "qwen3") and not config.get("use_sliding_window", False):
        window = 0  # Qwen configs list a window they do not use unless use_sliding_window is set
    kinds = ["full"] * n_layers
    if window:
        layer_types = config.get("layer_types")
        kinds = (["sliding" if t == "sliding_attention" else "full" for t in layer_types]
                 if layer_types else ["sliding"] * n_layers)
    rope = hf_rope_parameters(config)
    return ModelSpec(
        family="llama", arch=model_type, n_layers=n_layers, d_model=d_model, n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads, head_dim=head_dim,
        d_ff=config_get(config, "intermediate_size", where), vocab_size=config_get(config, "vocab_size", where),
        context_length=config.get("max_position_embeddings") or 4096,
        norm_eps=float(config_get(config, "rms_norm_eps", where)),
        rope_theta=float(rope.get("rope_theta", 10000.0)),
        rope_dim=int(head_dim * float(config.get("partial_rotary_factor") or 1.0)),
        rope_scaling=rope_scaling_from_hf(rope, where),
        sliding_window=window if "sliding" in kinds else 0, layer_kinds=kinds,
        tied_embeddings=bool(config.get("tie_word_embeddings", False)),
        attn_bias=model_type == "qwen2" or bool(config.get("attention_bias", False)),
        qk_norm=model_type == "qwen3",
        activation=_activation(config.get("hidden_act", "silu"), where),
    )


def _activation(name: str, where: str) -> str:
    from edgeflash.base.errors import UnsupportedModelError

    if name in ("silu", "swish"):
        return "silu"
    raise UnsupportedModelError(f"{where}: hidden_act {name!r} is not supported for the llama family (silu)")


_HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.q_proj.bias": "attn_q.bias",
    "self_attn.k_proj.weight": "attn_k.weight", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
_HF_GLOBAL = {"model.embed_tokens.weight": "token_embd.weight", "model.norm.weight": "output_norm.weight",
              "lm_head.weight": "output.weight"}
_LAYER_RE = re.compile(r"^model\.layers\.(\d+)\.(.+)$")


def hf_tensor_name(name: str) -> str | None:
    if name in _HF_GLOBAL:
        return _HF_GLOBAL[name]
    m = _LAYER_RE.match(name)
    if m and m.group(2) in _HF_LAYER:
        return f"blk.{m.group(1)}.{_HF_LAYER[m.group(2)]}"
    return None  # e.g. rotary inv_freq buffers


def fix_hf_tensor(name: str, array: np.ndarray) -> np.ndarray:
    return array


def fix_gguf_tensor(tensor: Tensor, spec: ModelSpec, arch: str) -> Tensor:
    if arch not in _INTERLEAVED_ROPE_ARCHS:
        return tensor
    if tensor.name.endswith("attn_q.weight") or tensor.name.endswith("attn_q.bias"):
        return _unpermute(tensor, spec.n_heads)
    if tensor.name.endswith("attn_k.weight") or tensor.name.endswith("attn_k.bias"):
        return _unpermute(tensor, spec.n_kv_heads)
    return tensor


def _unpermute(tensor: Tensor, n_heads: int) -> Tensor:
    # Within each head llama.cpp interleaves the two rotate-half halves (row i of the first half,
    # then row i of the second); argsort of that order puts the halves back.
    n = tensor.shape[0]
    interleaved = np.arange(n).reshape(n_heads, 2, n // n_heads // 2).swapaxes(1, 2).reshape(n)
    order = np.argsort(interleaved)
    if len(tensor.shape) == 1:  # a bias: permute values
        values = tensor.dequantize()[order]
        return Tensor.from_array(tensor.name, values, "f32")
    return Tensor(tensor.name, tensor.fmt, tensor.shape, tensor.take_rows(order).raw)


def embed(ops: Ops, spec: ModelSpec, tensors: dict[str, Tensor], tokens: np.ndarray) -> np.ndarray:
    return ops.embed(tokens, tensors["token_embd.weight"], spec.embedding_scale)  # [T, d]


def block(ops: Ops, spec: ModelSpec, layer: int, w: LayerWeights, x: np.ndarray, ctx: ForwardContext) -> np.ndarray:
    x = x + attention_sublayer(ops, spec, layer, w, ops.rms_norm(x, w["attn_norm.weight"], spec.norm_eps), ctx)
    return x + ffn_sublayer(ops, spec, w, ops.rms_norm(x, w["ffn_norm.weight"], spec.norm_eps))


def final_norm(ops: Ops, spec: ModelSpec, tensors: dict[str, Tensor], x: np.ndarray) -> np.ndarray:
    return ops.rms_norm(x, tensors["output_norm.weight"], spec.norm_eps)
