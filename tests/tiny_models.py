"""Tiny random models of each family, built with transformers and saved as HF directories."""

from __future__ import annotations

import shutil
from pathlib import Path

COMMON = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=3, max_position_embeddings=256)

CASES = {
    "llama-gqa-untied": ("LlamaConfig", "LlamaForCausalLM",
                         dict(num_attention_heads=4, num_key_value_heads=2, tie_word_embeddings=False)),
    "llama-mha-tied-llama3-rope": ("LlamaConfig", "LlamaForCausalLM",
                                   dict(num_attention_heads=4, num_key_value_heads=4, tie_word_embeddings=True,
                                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0,
                                                         "factor": 8.0, "low_freq_factor": 1.0,
                                                         "high_freq_factor": 4.0,
                                                         "original_max_position_embeddings": 16})),
    "qwen2-bias-mqa": ("Qwen2Config", "Qwen2ForCausalLM",
                       dict(num_attention_heads=4, num_key_value_heads=1, tie_word_embeddings=False)),
    "qwen3-qk-norm": ("Qwen3Config", "Qwen3ForCausalLM",
                      dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32)),
    "mistral-sliding-window": ("MistralConfig", "MistralForCausalLM",
                               dict(num_attention_heads=4, num_key_value_heads=2, sliding_window=8,
                                    tie_word_embeddings=False)),
    "gemma3-local-global": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                            dict(num_attention_heads=4, num_key_value_heads=2, head_dim=32, sliding_window=8,
                                 query_pre_attn_scalar=24,
                                 layer_types=["sliding_attention", "sliding_attention", "full_attention"],
                                 rope_parameters={"full_attention": {"rope_type": "default", "rope_theta": 1e6},
                                                  "sliding_attention": {"rope_type": "default",
                                                                        "rope_theta": 1e4}})),
}


def save_tokenizer(smollm_path: Path, out: Path) -> int:
    """The real SmolLM2 tokenizer (any tokenizer works for random models); returns its size."""
    from hf_reference import transformers_tokenizer

    tok = transformers_tokenizer(smollm_path)
    tok.save_pretrained(out)
    return len(tok)


def build_tiny_model(case: str, tokenizer_dir: Path, vocab: int, out: Path, **overrides):
    """Save a random model of `case` with larger-than-init weights (so logits are far from
    uniform) into `out`, next to the tokenizer; returns the transformers model. `overrides`:
    config fields other than COMMON's (num_hidden_layers=6...)."""
    import torch
    import transformers

    config_cls, model_cls, extra = CASES[case]
    config = getattr(transformers, config_cls)(vocab_size=vocab, **{**COMMON, **extra, **overrides})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    gemma = "gemma" in case  # Gemma norms multiply by 1 + w, the others by w
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.copy_(torch.randn_like(p) * 0.05 + (0.0 if gemma else 1.0))
            else:
                p.copy_(torch.randn_like(p) * 0.15)
    model.save_pretrained(out, safe_serialization=True)
    for f in tokenizer_dir.iterdir():
        shutil.copy(f, out / f.name)
    return model
