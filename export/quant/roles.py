"""Tensor roles: the unit quantization rules are written in."""

from __future__ import annotations

import re

ROLES = ("embedding", "head", "attention", "ffn", "norm")

_LAYER = re.compile(r"^blk\.\d+\.(.+)$")


def role_of(tensor_name: str) -> str:
    """The role of a canonical (GGUF-style) tensor name.

    embedding: token_embd.weight; head: output.weight; norm: every RMSNorm weight (and the
    per-frequency RoPE factors); attention: q/k/v/o projections and their biases; ffn:
    gate/up/down projections."""
    if tensor_name == "token_embd.weight":
        return "embedding"
    if tensor_name == "output.weight":
        return "head"
    if tensor_name.endswith("norm.weight") or tensor_name == "rope_freqs.weight":
        return "norm"
    m = _LAYER.match(tensor_name)
    if m:
        rest = m.group(1)
        if rest.startswith("attn_"):
            return "attention"
        if rest.startswith("ffn_"):
            return "ffn"
    raise ValueError(f"tensor {tensor_name!r} has no quantization role (known: {', '.join(ROLES)})")
