"""ModelSpec: every hyperparameter of a decoder-only language model, in one place.

Family files build it from GGUF metadata or a Hugging Face config; bundles store it as JSON.
Architecture differences are flags here, not model names, so the reference runtime and the
native engine execute any model of a supported family from its spec alone.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass, field
from typing import Any

from edgeflash.base.errors import UnsupportedModelError

ACTIVATIONS = ("silu", "gelu_tanh")
LAYER_KINDS = ("full", "sliding")


@dataclass
class ModelSpec:
    family: str  # "llama" or "gemma3": which family file runs it
    arch: str  # the source's own architecture name (llama, qwen2, mistral, gemma3, ...)
    n_layers: int
    d_model: int
    n_heads: int
    n_kv_heads: int
    head_dim: int
    d_ff: int
    vocab_size: int
    context_length: int
    norm_eps: float
    rope_theta: float
    activation: str = "silu"
    rope_dim: int = 0  # rotated dims per head; 0 = all of head_dim
    rope_theta_local: float = 0.0  # RoPE base of sliding-window layers; 0 = same as rope_theta
    rope_scaling: dict[str, Any] | None = None  # {"type": "linear", "factor": f} or llama3 parameters
    sliding_window: int = 0  # 0 = no sliding-window layers
    layer_kinds: list[str] = field(default_factory=list)  # per layer "full" | "sliding"; [] = all full
    tied_embeddings: bool = True
    attn_bias: bool = False  # biases on q/k/v projections (Qwen2)
    qk_norm: bool = False  # RMSNorm over each head of q and k before RoPE (Gemma 3)
    sandwich_norm: bool = False  # extra norms after attention and after the FFN (Gemma 3)
    embedding_scale: float = 1.0  # token embeddings are multiplied by this (Gemma: sqrt(d_model))
    attn_scale: float = 0.0  # softmax scale; 0 = 1/sqrt(head_dim)
    final_logit_softcap: float = 0.0  # 0 = none

    def __post_init__(self) -> None:
        if self.activation not in ACTIVATIONS:
            raise UnsupportedModelError(f"activation {self.activation!r} is not supported ({', '.join(ACTIVATIONS)})")
        if not self.layer_kinds:
            self.layer_kinds = ["full"] * self.n_layers
        if len(self.layer_kinds) != self.n_layers or any(k not in LAYER_KINDS for k in self.layer_kinds):
            raise UnsupportedModelError(f"layer_kinds must list 'full'/'sliding' for each of {self.n_layers} layers, "
                                        f"got {self.layer_kinds}")
        if "sliding" in self.layer_kinds and self.sliding_window <= 0:
            raise UnsupportedModelError("sliding layers need sliding_window > 0")
        if self.n_heads % self.n_kv_heads:
            raise UnsupportedModelError(f"n_heads {self.n_heads} is not a multiple of n_kv_heads {self.n_kv_heads}")
        if self.rope_dim == 0:
            self.rope_dim = self.head_dim
        if self.rope_dim % 2 or self.rope_dim > self.head_dim:
            raise UnsupportedModelError(f"rope_dim {self.rope_dim} must be even and at most head_dim {self.head_dim}")
        if self.rope_theta_local == 0.0:
            self.rope_theta_local = self.rope_theta
        if self.attn_scale == 0.0:
            self.attn_scale = 1.0 / math.sqrt(self.head_dim)

    # Derived sizes.
    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    @property
    def gqa_group(self) -> int:
        return self.n_heads // self.n_kv_heads

    def window(self, layer: int) -> int:
        """Attention window of a layer in tokens; 0 = the whole context."""
        return self.sliding_window if self.layer_kinds[layer] == "sliding" else 0

    def rope_base(self, layer: int) -> float:
        return self.rope_theta_local if self.layer_kinds[layer] == "sliding" else self.rope_theta

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> ModelSpec:
        """Build from a dict, ignoring keys this version does not know (newer bundles)."""
        names = {f.name for f in dataclasses.fields(cls)}
        missing = [f.name for f in dataclasses.fields(cls)
                   if f.name not in d and f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING]
        if missing:
            raise UnsupportedModelError(f"model spec is missing {', '.join(missing)}")
        return cls(**{k: v for k, v in d.items() if k in names})
