"""Pieces both families share: metadata access, layer views and the two sublayers."""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor


class Ops(Protocol):
    """What a forward pass needs; the numpy reference implements it, kernels can replace ops one by one."""

    def embed(self, tokens: np.ndarray, table: Tensor, scale: float) -> np.ndarray: ...
    def linear(self, x: np.ndarray, w: Tensor, bias: Tensor | None = None) -> np.ndarray: ...
    def rms_norm(self, x: np.ndarray, w: Tensor, eps: float) -> np.ndarray: ...
    def rope(self, x: np.ndarray, positions: np.ndarray, inv_freq: np.ndarray) -> np.ndarray: ...
    def gated(self, gate: np.ndarray, up: np.ndarray, activation: str) -> np.ndarray: ...
    def attention(self, q: np.ndarray, k: np.ndarray, v: np.ndarray, q_pos: np.ndarray, k_pos: np.ndarray,
                  window: int, scale: float, mask: np.ndarray | None) -> np.ndarray: ...


class ForwardContext(Protocol):
    """Per-call state the blocks need: positions of the new tokens and the KV cache."""

    positions: np.ndarray  # [T] int64
    mask: np.ndarray | None  # [T, S] extra visibility (token trees), None = causal only

    def inv_freq(self, layer: int) -> np.ndarray: ...
    def store_kv(self, layer: int, k: np.ndarray, v: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...


class LayerWeights:
    """`w["attn_q.weight"]` for one block, backed by the canonical `blk.{i}.` names."""

    def __init__(self, tensors: dict[str, Tensor], layer: int):
        self._tensors, self._prefix = tensors, f"blk.{layer}."

    def __getitem__(self, name: str) -> Tensor:
        t = self.get(name)
        if t is None:
            raise ModelFormatError(f"tensor {self._prefix + name} is missing")
        return t

    def get(self, name: str) -> Tensor | None:
        t = self._tensors.get(self._prefix + name)
        if t is None and name in ("ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"):
            arena = self._tensors.get(self._prefix + "ffn_arena")  # a bundle's one copy of the FFN
            return arena.dense(name) if arena is not None else None
        return t


def attention_sublayer(ops: Ops, spec: ModelSpec, layer: int, w: LayerWeights, h: np.ndarray,
                       ctx: ForwardContext) -> np.ndarray:
    """Self-attention over the cache plus the new tokens. h: [T, d_model] -> [T, d_model]."""
    T = h.shape[0]
    q = ops.linear(h, w["attn_q.weight"], w.get("attn_q.bias")).reshape(T, spec.n_heads, spec.head_dim)
    k = ops.linear(h, w["attn_k.weight"], w.get("attn_k.bias")).reshape(T, spec.n_kv_heads, spec.head_dim)
    v = ops.linear(h, w["attn_v.weight"], w.get("attn_v.bias")).reshape(T, spec.n_kv_heads, spec.head_dim)
    if spec.qk_norm:
        q = ops.rms_norm(q, w["attn_q_norm.weight"], spec.norm_eps)
        k = ops.rms_norm(k, w["attn_k_norm.weight"], spec.norm_eps)
    inv_freq = ctx.inv_freq(layer)
    q = ops.rope(q, ctx.positions, inv_freq)
    k = ops.rope(k, ctx.positions, inv_freq)
    keys, values, key_pos = ctx.store_kv(layer, k, v)  # [Hkv, S, D], [Hkv, S, D], [S]
    out = ops.attention(q, keys, values, ctx.positions, key_pos, spec.window(layer), spec.attn_scale, ctx.mask)
    return ops.linear(out.reshape(T, spec.q_dim), w["attn_output.weight"])


def ffn_sublayer(ops: Ops, spec: ModelSpec, w: LayerWeights, h: np.ndarray) -> np.ndarray:
    """Gated feed-forward: down(act(gate h) * up h). h: [T, d_model] -> [T, d_model]."""
    gate = ops.linear(h, w["ffn_gate.weight"])  # [T, d_ff]
    up = ops.linear(h, w["ffn_up.weight"])  # [T, d_ff]
    return ops.linear(ops.gated(gate, up, spec.activation), w["ffn_down.weight"])


def meta_get(meta: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    """A GGUF metadata value; a missing required key is a format error naming it."""
    if key in meta:
        value = meta[key]
        if isinstance(value, list):
            raise UnsupportedModelError(f"{where}: metadata {key} varies per layer ({value[:4]}...), "
                                        "which is not supported")
        return value
    if default is ...:
        raise ModelFormatError(f"{where}: metadata key {key} is missing")
    return default


def config_get(config: dict[str, Any], key: str, where: str, default: Any = ...) -> Any:
    if config.get(key) is not None:
        return config[key]
    if default is ...:
        raise ModelFormatError(f"{where}: config.json has no {key!r}")
    return default


def hf_rope_parameters(config: dict[str, Any], kind: str = "full_attention") -> dict[str, Any]:
    """RoPE settings from a HF config in either the `rope_parameters` (transformers 5) or the
    older `rope_theta` + `rope_scaling` spelling. `kind` selects a per-layer-type entry."""
    params = config.get("rope_parameters")
    if isinstance(params, dict) and kind in params and isinstance(params[kind], dict):
        params = params[kind]
    if isinstance(params, dict) and "rope_theta" in params:
        return dict(params)
    out = dict(config.get("rope_scaling") or {})
    if "rope_theta" in config:
        out["rope_theta"] = config["rope_theta"]
    return out


def rope_scaling_from_hf(params: dict[str, Any], where: str) -> dict[str, Any] | None:
    kind = params.get("rope_type", params.get("type", "default"))
    if kind in (None, "default"):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(params["factor"])}
    if kind == "llama3":
        return {"type": "llama3", **{k: float(params[k]) for k in (
            "factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings")}}
    raise UnsupportedModelError(f"{where}: RoPE scaling {kind!r} is not supported (linear, llama3)")


def rope_scaling_from_gguf(meta: dict[str, Any], prefix: str, where: str) -> dict[str, Any] | None:
    kind = meta.get(prefix + "rope.scaling.type")
    if kind in (None, "none"):
        return None
    if kind == "linear":
        return {"type": "linear", "factor": float(meta[prefix + "rope.scaling.factor"])}
    raise UnsupportedModelError(f"{where}: RoPE scaling {kind!r} is not supported (linear)")
