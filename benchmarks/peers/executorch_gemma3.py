"""Gemma 3 on ExecuTorch 1.5.1's llama Transformer: the model-side pieces its export lacks.

ExecuTorch 1.5.1's `ModelArgs` declares Gemma-style options (`act_fn`, `embedding_scale_factor`,
`post_attention_norm`, `post_ffn_norm`, `local_rope_theta`), but its `llama_transformer.py`,
`feed_forward.py` and `rope.py` never read them: every layer runs SiLU, no embedding scale, no
post-attention/post-FFN norms, and one RoPE base for all layers. `load_state_dict(strict=False)`
then drops the post-norm weights without a word. A Gemma 3 checkpoint exported through the stock
CLI therefore computes a different function, whatever the weight conversion.

What Gemma 3 needs, and where it comes from here:
  * RMSNorm scale `1 + w`            -> ModelArgs.rms_norm_add_unit_offset (implemented upstream)
  * q/k RMSNorm before RoPE          -> use_qk_norm + qk_norm_before_rope (implemented upstream)
  * rotate-half RoPE layout          -> use_hf_rope (implemented upstream)
  * sliding window 512 on 5 of 6     -> model.local_global_attention ring KV cache (upstream)
  * embedding * sqrt(dim)            -> folded into an untied copy of the embedding (weights)
  * GELU (tanh) gated MLP            -> Gemma3FeedForward below
  * post-attention / post-FFN norms  -> Gemma3Block below
  * RoPE base 10k on sliding layers  -> Gemma3Block's own local Rope (1M on global layers)

`apply_gemma3` swaps these modules into the eager model right after ExecuTorch builds it and
before its own source transforms (quantization, custom SDPA, ring KV cache) run, so the rest of
ExecuTorch's export pipeline is unchanged.
"""

from __future__ import annotations

import copy
import json
import sys
from pathlib import Path

import torch
import torch.nn.functional as F
from torch import nn


class Gemma3FeedForward(nn.Module):
    """down(gelu_tanh(gate(x)) * up(x)), reusing ExecuTorch's w1/w2/w3 Linear modules."""

    def __init__(self, w1: nn.Module, w2: nn.Module, w3: nn.Module):
        super().__init__()
        self.w1, self.w2, self.w3 = w1, w2, w3

    def forward(self, x: torch.Tensor) -> torch.Tensor:  # x: [B, T, dim]
        return self.w2(F.gelu(self.w1(x), approximate="tanh") * self.w3(x))


class Gemma3Block(nn.Module):
    """One Gemma 3 decoder layer around ExecuTorch's attention module.

    h   = x + post_attention_norm(attention(attention_norm(x)))
    out = h + post_ffn_norm(feed_forward(ffn_norm(h)))
    Sliding-window layers rotate q/k with their own RoPE table (base 10k).
    """

    def __init__(self, block: nn.Module, post_attention_norm: nn.Module, post_ffn_norm: nn.Module,
                 local_rope: nn.Module | None):
        super().__init__()
        self.attention = block.attention
        self.attention_norm = block.attention_norm
        self.ffn_norm = block.ffn_norm
        self.feed_forward = Gemma3FeedForward(block.feed_forward.w1, block.feed_forward.w2, block.feed_forward.w3)
        self.post_attention_norm = post_attention_norm
        self.post_ffn_norm = post_ffn_norm
        self.local_rope = local_rope

    def forward(self, x, freqs_cos, freqs_sin, attn_options):  # x: [B, T, dim]
        if self.local_rope is not None:
            freqs_cos, freqs_sin = self.local_rope.get_freqs(attn_options.get("input_pos"), x.shape[1])
        attn_out, update = self.attention(self.attention_norm(x), freqs_cos, freqs_sin, **attn_options)
        h = x + self.post_attention_norm(attn_out)
        return h + self.post_ffn_norm(self.feed_forward(self.ffn_norm(h))), update


def apply_gemma3(model: nn.Module, checkpoint_path: str, gemma3: dict) -> nn.Module:
    """Replace model.layers[i] by Gemma3Block; `gemma3` holds local_rope_theta and sliding_layers."""
    from executorch.examples.models.llama.norm import RMSNorm
    from executorch.examples.models.llama.rope import Rope

    args = model.params
    if not args.rms_norm_add_unit_offset:
        raise ValueError("params.json: Gemma 3 needs rms_norm_add_unit_offset=true (norm scale is 1 + w)")
    state = torch.load(checkpoint_path, map_location="cpu", mmap=True)
    local_args = copy.copy(args)
    local_args.rope_freq_base = float(gemma3["local_rope_theta"])
    local_rope = Rope(local_args)
    sliding = set(gemma3["sliding_layers"])

    def norm(key: str) -> nn.Module:
        n = RMSNorm(args.dim, eps=args.norm_eps, add_unit_offset=True)
        n.weight = nn.Parameter(state[key].to(torch.float32), requires_grad=False)
        return n

    for i, block in enumerate(model.layers):
        model.layers[i] = Gemma3Block(
            block,
            norm(f"layers.{i}.post_attention_norm.weight"),
            norm(f"layers.{i}.post_ffn_norm.weight"),
            local_rope if i in sliding else None,
        )
    return model


def read_gemma3_section(params_path: str) -> dict | None:
    """gemma3.json beside params.json (ModelArgs rejects unknown keys, so they cannot go in params)."""
    sidecar = Path(params_path).with_name("gemma3.json")
    return json.loads(sidecar.read_text()) if sidecar.exists() else None


def install_export_hook() -> None:
    """Make ExecuTorch's export_llm build Gemma 3 layers for params files that have a gemma3.json."""
    from executorch.examples.models.llama import export_llama_lib as lib

    original = lib._load_llama_model

    def load_with_gemma3(llm_config):
        manager = original(llm_config)
        section = read_gemma3_section(llm_config.base.params)
        if section is not None:
            apply_gemma3(manager.model, llm_config.base.checkpoint, section)
        return manager

    lib._load_llama_model = load_with_gemma3


def main() -> None:
    """Same command line as `python -m executorch.extension.llm.export.export_llm`, plus the hook."""
    install_export_hook()
    from executorch.extension.llm.export import export_llm

    sys.argv[0] = "export_llm"
    export_llm.main()


if __name__ == "__main__":
    main()
