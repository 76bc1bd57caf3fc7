"""Gemma 3 family (text): embeddings scaled by sqrt(d_model), RMSNorm on q and k per head,
four norms per block (sandwich), GeGLU with tanh-GELU, sliding-window layers with their own
RoPE base alternating with global layers, tied head.

Norm weights are canonical as the multiplier (GGUF stores `1 + w`; HF checkpoints store `w`).
"""

from __future__ import annotations

import math
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

GGUF_ARCHS = ("gemma3",)
HF_MODEL_TYPES = ("gemma3_text", "gemma3")

# GGUF has no field for these two; llama.cpp fixes them for gemma3 the same way.
_GGUF_SLIDING_PATTERN = 6  # every 6th layer is global
_GGUF_LOCAL_ROPE_BASE = 10000.0


def spec_from_gguf(meta: dict[str, Any], tensor_names: set[str], where: str = "model") -> ModelSpec:
    p = "gemma3."
    d_model = meta_get(meta, p + "embedding_length", where)
    n_heads = meta_get(meta, p + "attention.head_count", where)
    n_layers = meta_get(meta, p + "block_count", where)
    head_dim = meta_get(meta, p + "attention.key_length", where, 256)
    window = meta_get(meta, p + "attention.sliding_window", where, 0)
    kinds = ["full" if (i + 1) % _GGUF_SLIDING_PATTERN == 0 or not window else "sliding" for i in range(n_layers)]
    # Gemma 3 27B scales queries by d_model / n_heads instead of head_dim; llama.cpp keys this off
    # the 62-layer geometry because the file does not carry query_pre_attn_scalar.
    query_scalar = d_model // n_heads if n_layers == 62 else head_dim
    scaling = rope_scaling_from_gguf(meta, p, where)
    if scaling:
        scaling["layers"] = "full"
    vocab = len(meta.get("tokenizer.ggml.tokens") or []) or meta_get(meta, p + "vocab_size", where)
    return ModelSpec(
        family="gemma3", arch="gemma3", n_layers=n_layers, d_model=d_model, n_heads=n_heads,
        n_kv_heads=meta_get(meta, p + "attention.head_count_kv", where, n_heads), head_dim=head_dim,
        d_ff=meta_get(meta, p + "feed_forward_length", where), vocab_size=vocab,
        context_length=meta_get(meta, p + "context_length", where, 32768),
        norm_eps=float(meta_get(meta, p + "attention.layer_norm_rms_epsilon", where, 1e-6)),
        rope_theta=float(meta_get(meta, p + "rope.freq_base", where, 1_000_000.0)),
        rope_theta_local=_GGUF_LOCAL_ROPE_BASE, rope_scaling=scaling,
        sliding_window=window, layer_kinds=kinds,
        tied_embeddings="output.weight" not in tensor_names,
        qk_norm=True, sandwich_norm=True, activation="gelu_tanh",
        embedding_scale=math.sqrt(d_model), attn_scale=query_scalar ** -0.5,
    )


def spec_from_hf(config: dict[str, Any], where: str = "config.json") -> ModelSpec:
    if config.get("model_type") == "gemma3" and isinstance(config.get("text_config"), dict):
        config = config["text_config"]  # multimodal checkpoint: run its language model
    d_model = config_get(config, "hidden_size", where)
    n_heads = config_get(config, "num_attention_heads", where)
    n_layers = config_get(config, "num_hidden_layers", where)
    head_dim = config.get("head_dim") or 256
    window = config.get("sliding_window") or 0
    if config.get("layer_types"):
        kinds = ["sliding" if t == "sliding_attention" else "full" for t in config["layer_types"]]
    else:
        pattern = config.get("sliding_window_pattern") or config.get("_sliding_window_pattern") or 6
        kinds = ["full" if (i + 1) % pattern == 0 else "sliding" for i in range(n_layers)]
    if not window:
        kinds = ["full"] * n_layers
    full = hf_rope_parameters(config, "full_attention")
    local = hf_rope_parameters(config, "sliding_attention")
    local_base = local.get("rope_theta") if "rope_parameters" in config else config.get("rope_local_base_freq")
    scaling = rope_scaling_from_hf(full, where)
    if scaling:
        scaling["layers"] = "full"
    act = config.get("hidden_activation") or config.get("hidden_act") or "gelu_pytorch_tanh"
    if act not in ("gelu_pytorch_tanh", "gelu_tanh"):
        from edgeflash.base.errors import UnsupportedModelError

        raise UnsupportedModelError(f"{where}: hidden_activation {act!r} is not supported for gemma3 (gelu_pytorch_tanh)")
    return ModelSpec(
        family="gemma3", arch="gemma3", n_layers=n_layers, d_model=d_model, n_heads=n_heads,
        n_kv_heads=config.get("num_key_value_heads") or n_heads, head_dim=head_dim,
        d_ff=config_get(config, "intermediate_size", where), vocab_size=config_get(config, "vocab_size", where),
        context_length=config.get("max_position_embeddings") or 32768,
        norm_eps=float(config.get("rms_norm_eps") or 1e-6),
        rope_theta=float(full.get("rope_theta", 1_000_000.0)),
        rope_theta_local=float(local_base or 10000.0), rope_scaling=scaling,
        sliding_window=window if "sliding" in kinds else 0, layer_kinds=kinds,
        tied_embeddings=bool(config.get("tie_word_embeddings", True)),
        attn_bias=bool(config.get("attention_bias", False)),
        qk_norm=True, sandwich_norm=True, activation="gelu_tanh",
        embedding_scale=math.sqrt(d_model),
        attn_scale=float(config.get("query_pre_attn_scalar") or head_dim) ** -0.5,
        final_logit_softcap=float(config.get("final_logit_softcapping") or 0.0),
    )


_HF_LAYER = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "post_attention_norm.weight",
    "pre_feedforward_layernorm.weight": "ffn_norm.weight",
    "post_feedforward_layernorm.weight": "post_ffw_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight", "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight", "self_attn.o_proj.weight": "attn_output.weight",
    "self_attn.q_proj.bias": "attn_q.bias", "self_attn.k_proj.bias": "attn_k.bias",
    "self_attn.v_proj.bias": "attn_v.bias",
    "self_attn.q_norm.weight": "attn_q_norm.weight", "self_attn.k_norm.weight": "attn_k_norm.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight", "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}
# Text-only checkpoints use `model.`; multimodal ones nest the language model.
_PREFIXES = ("model.language_model.", "language_model.model.", "model.")
_LAYER_RE = re.compile(r"^layers\.(\d+)\.(.+)$")


def hf_tensor_name(name: str) -> str | None:
    if name in ("lm_head.weight", "language_model.lm_head.weight"):
        return "output.weight"
    for prefix in _PREFIXES:
        if name.startswith(prefix):
            rest = name[len(prefix):]
            break
    else:
        return None
    if rest == "embed_tokens.weight":
        return "token_embd.weight"
    if rest == "norm.weight":
        return "output_norm.weight"
    m = _LAYER_RE.match(rest)
    if m and m.group(2) in _HF_LAYER:
        return f"blk.{m.group(1)}.{_HF_LAYER[m.group(2)]}"
    return None  # vision tower, projector, buffers


def fix_hf_tensor(name: str, array: np.ndarray) -> np.ndarray:
    # HF Gemma norms compute x * (1 + w); the canonical weight is the multiplier itself.
    return array + 1.0 if name.endswith("norm.weight") else array


def fix_gguf_tensor(tensor: Tensor, spec: ModelSpec, arch: str) -> Tensor:
    return tensor


def embed(ops: Ops, spec: ModelSpec, tensors: dict[str, Tensor], tokens: np.ndarray) -> np.ndarray:
    return ops.embed(tokens, tensors["token_embd.weight"], spec.embedding_scale)  # [T, d]


def block(ops: Ops, spec: ModelSpec, layer: int, w: LayerWeights, x: np.ndarray, ctx: ForwardContext) -> np.ndarray:
    attn = attention_sublayer(ops, spec, layer, w, ops.rms_norm(x, w["attn_norm.weight"], spec.norm_eps), ctx)
    x = x + ops.rms_norm(attn, w["post_attention_norm.weight"], spec.norm_eps)
    ffn = ffn_sublayer(ops, spec, w, ops.rms_norm(x, w["ffn_norm.weight"], spec.norm_eps))
    return x + ops.rms_norm(ffn, w["post_ffw_norm.weight"], spec.norm_eps)


def final_norm(ops: Ops, spec: ModelSpec, tensors: dict[str, Tensor], x: np.ndarray) -> np.ndarray:
    return ops.rms_norm(x, tensors["output_norm.weight"], spec.norm_eps)
