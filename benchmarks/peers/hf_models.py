"""transformers' fp32 copy of a benchmark model, dequantized from the GGUF.

Dequantizing the GGUF takes one to two minutes, so the result is saved once as safetensors under
bench-out/hf/<model>/ and later runs load that (the same weights, bit for bit).
"""

from __future__ import annotations

from pathlib import Path

from models import BENCH_OUT, BenchModel


def hf_dir(model: BenchModel) -> Path:
    return BENCH_OUT / "hf" / model.name


def load_hf(model: BenchModel):
    """(model, tokenizer), fp32, eval mode."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    if model.name == "random-7b":
        raise SystemExit("random-7b: transformers' fp32 copy would need about 30 GB; run llama.cpp or edgeflash on it")
    cache = hf_dir(model)
    if not (cache / "config.json").exists():
        gguf = model.gguf_path()
        m = AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name, dtype=torch.float32)
        tok = AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
        _save_plain_fp32(m, tok, cache)
    m = AutoModelForCausalLM.from_pretrained(cache, dtype=torch.float32)
    tok = AutoTokenizer.from_pretrained(cache)
    return m.eval(), tok


def load_tokenizer(model: BenchModel):
    """The tokenizer alone, from the cached copy when there is one (reading the GGUF's is slower)."""
    from transformers import AutoTokenizer

    from models import load_hf_tokenizer

    cache = hf_dir(model)
    return AutoTokenizer.from_pretrained(cache) if (cache / "tokenizer.json").exists() else load_hf_tokenizer(model)


def adds_bos(tokenizer) -> bool:
    """Whether the model's own tokenizer starts every sequence with BOS (Gemma: yes, SmolLM2: no)."""
    ids = tokenizer.encode("x")
    return tokenizer.bos_token_id is not None and bool(ids) and ids[0] == tokenizer.bos_token_id


def _save_plain_fp32(m, tok, cache: Path) -> None:
    """save_pretrained refuses a GGUF-loaded model, so write the state dict and config directly."""
    from safetensors.torch import save_file

    state = {k: v.contiguous() for k, v in m.state_dict().items()}
    if m.config.tie_word_embeddings:
        state.pop("lm_head.weight", None)  # re-tied to the embedding on load
    config = m.config
    if hasattr(config, "quantization_config"):
        del config.quantization_config  # the copy is plain fp32, not a GGUF view
    cache.mkdir(parents=True, exist_ok=True)
    save_file(state, str(cache / "model.safetensors"), metadata={"format": "pt"})
    config.save_pretrained(cache)
    tok.save_pretrained(cache)


def eos_ids(model: BenchModel, tokenizer) -> list[int]:
    """Tokens that end a generation: the tokenizer's EOS plus Gemma's end-of-turn marker."""
    ids = {tokenizer.eos_token_id}
    if model.name.startswith("gemma3"):
        ids.add(tokenizer.convert_tokens_to_ids("<end_of_turn>"))
    return sorted(i for i in ids if i is not None)
