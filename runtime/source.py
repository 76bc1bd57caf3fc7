"""A model as loaded from any source: its spec, tokenizer and raw tensors by canonical name."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflash.base.errors import ModelFormatError
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor


@dataclass
class ModelSource:
    path: Path
    kind: str  # "gguf" | "hf" | "bundle" | "torch"
    spec: ModelSpec
    tokenizer: Any  # edgeflash.runtime.tokenizer.Tokenizer
    tensors: dict[str, Tensor]
    info: dict[str, Any] = field(default_factory=dict)  # name, sizes, bundle manifest...

    @property
    def name(self) -> str:
        return str(self.info.get("name") or self.path.name)

    @property
    def weight_bytes(self) -> int:
        return sum(t.nbytes for t in self.tensors.values())

    def require(self, names: list[str]) -> None:
        missing = [n for n in names if n not in self.tensors]
        if missing:
            raise ModelFormatError(f"{self.path}: tensors missing: {', '.join(missing[:5])}"
                                   + (f" and {len(missing) - 5} more" if len(missing) > 5 else ""))


def expected_tensor_names(spec: ModelSpec) -> list[str]:
    """Every tensor a model of this spec must have (optional ones like biases excluded)."""
    names = ["token_embd.weight", "output_norm.weight"]
    if not spec.tied_embeddings:
        names.append("output.weight")
    per_layer = ["attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                 "ffn_norm.weight", "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"]
    if spec.qk_norm:
        per_layer += ["attn_q_norm.weight", "attn_k_norm.weight"]
    if spec.sandwich_norm:
        per_layer += ["post_attention_norm.weight", "post_ffw_norm.weight"]
    if spec.attn_bias:
        per_layer += ["attn_q.bias", "attn_k.bias", "attn_v.bias"]
    return names + [f"blk.{i}.{n}" for i in range(spec.n_layers) for n in per_layer]
