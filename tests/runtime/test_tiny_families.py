"""Every family shape, on tiny random models built with transformers and loaded from their
saved safetensors directory: logits for all positions and a cached greedy decode must match."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch", reason="transformers is the oracle; install edgeflash[test]")
transformers = pytest.importorskip("transformers")

from edgeflash.export.sources.hf import load_hf_dir  # noqa: E402
from edgeflash.runtime.reference import ReferenceEngine  # noqa: E402

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


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, smollm_path):
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(smollm_path.parent, gguf_file=smollm_path.name)
    out = tmp_path_factory.mktemp("tokenizer")
    tok.save_pretrained(out)
    return out, len(tok)


def _build(case: str, tokenizer_dir, tmp_path):
    import shutil

    config_cls, model_cls, extra = CASES[case]
    tok_dir, vocab = tokenizer_dir
    config = getattr(transformers, config_cls)(vocab_size=vocab, **COMMON, **extra)
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():  # larger random weights than the init so logits are far from uniform
        for name, p in model.named_parameters():
            p.copy_(torch.randn_like(p) * (0.05 if "norm" in name else 0.15) + (1.0 if "norm" in name and
                                                                                  "gemma" not in case else 0.0))
    model.save_pretrained(tmp_path, safe_serialization=True)
    for f in tok_dir.iterdir():
        shutil.copy(f, tmp_path / f.name)
    return model


@pytest.mark.parametrize("case", list(CASES))
def test_logits_and_cached_decode_match_transformers(case, tokenizer_dir, tmp_path):
    model = _build(case, tokenizer_dir, tmp_path)
    source = load_hf_dir(tmp_path)
    rng = np.random.default_rng(1)
    prompt = rng.integers(0, source.spec.vocab_size, size=20).tolist()  # 20 > sliding window of 8

    engine = ReferenceEngine(source)
    ours = engine.forward(prompt, all_logits=True)
    with torch.no_grad():
        theirs = model(torch.tensor([prompt])).logits[0].numpy()
    scale = np.abs(theirs).max()
    assert np.abs(ours - theirs).max() <= 1e-4 * max(scale, 1.0), case

    # Greedy decode through our KV cache vs. transformers recomputing each prefix from scratch.
    ids = list(prompt)
    logits = ours[-1]
    for _ in range(12):
        nxt = int(np.argmax(logits))
        with torch.no_grad():
            ref_next = int(model(torch.tensor([ids])).logits[0, -1].argmax())
        assert nxt == ref_next, f"{case}: diverged at generated token {len(ids) - len(prompt)}"
        ids.append(nxt)
        logits = engine.forward([nxt])[-1]
