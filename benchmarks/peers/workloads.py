"""Prompts and evaluation text shared by every peer runner, so all peers see the same input.

Prompts are built once per model with transformers' tokenizer (the GGUF's vocabulary) and cached
as text under bench-out/prompts/; every runner then reads the same text file. The perplexity
windows are cached as token ids, so every peer is scored on exactly the same token sequence.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from hf_models import adds_bos, load_tokenizer
from models import BENCH_OUT, BenchModel

PROMPT_DIR = BENCH_OUT / "prompts"

# The passage starts this many characters into a held-out play's window, past front matter.
PASSAGE_WINDOW_CHARS = 8000

CHAT_QUESTION = (
    "In three short paragraphs, explain why a sailor would reef the sails before a storm, "
    "what can go wrong if the crew waits too long, and how the captain decides when to do it."
)

# Perplexity: evenly spaced held-out windows, each cut to at most this many tokens (BOS included).
PPL_WINDOWS = 8
PPL_MAX_TOKENS = 512


@dataclass(frozen=True)
class Prompt:
    name: str
    text: str
    # BOS is added by each peer's own tokenizer settings; the text itself never contains it.
    reference_ids: list[int]


def _write_prompt(path: Path, text: str, ids: list[int]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")
    path.with_suffix(".ids.json").write_text(json.dumps(ids))


def _read_prompt(name: str, path: Path) -> Prompt:
    ids_path = path.with_suffix(".ids.json")
    ids = json.loads(ids_path.read_text()) if ids_path.exists() else []
    return Prompt(name, path.read_text(encoding="utf-8"), ids)


def passage_prompt(model: BenchModel, n_tokens: int) -> Prompt:
    """A held-out Shakespeare passage cut at a token boundary to `n_tokens` tokens (plus BOS)."""
    if n_tokens < 8:
        raise SystemExit(f"--prompt-tokens {n_tokens}: expected at least 8")
    path = PROMPT_DIR / f"{model.name}-passage-{n_tokens}.txt"
    if not path.exists():
        from edgeflash.export.corpus import heldout_windows

        tokenizer = load_tokenizer(model)
        window = heldout_windows(1, chars_per_window=PASSAGE_WINDOW_CHARS)[0]
        body = tokenizer.encode(window, add_special_tokens=False)
        if len(body) < n_tokens:
            raise SystemExit(f"--prompt-tokens {n_tokens}: the held-out window has only {len(body)} tokens")
        text = tokenizer.decode(body[:n_tokens])
        _write_prompt(path, text, tokenizer.encode(text))
    return _read_prompt(path.stem, path)


def chat_prompt(model: BenchModel) -> Prompt:
    """One user turn rendered with the model's own chat template (plain Q/A text if it has none)."""
    path = PROMPT_DIR / f"{model.name}-chat.txt"
    if not path.exists():
        tokenizer = load_tokenizer(model)
        messages = [{"role": "user", "content": CHAT_QUESTION}]
        try:
            text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        except ValueError:  # no template in the GGUF metadata
            text = f"Question: {CHAT_QUESTION}\nAnswer:"
        # A template may start with the BOS text; peers whose tokenizer adds BOS (Gemma) add it
        # themselves, so drop it there. SmolLM2's BOS string <|im_start|> opens its first turn: keep it.
        if adds_bos(tokenizer) and text.startswith(tokenizer.bos_token):
            text = text[len(tokenizer.bos_token):]
        _write_prompt(path, text, tokenizer.encode(text))
    return _read_prompt(path.stem, path)


def file_prompt(path: Path) -> Prompt:
    if not path.is_file():
        raise SystemExit(f"--prompt-file {path}: no such file")
    return Prompt(path.stem, path.read_text(encoding="utf-8"), [])


def perplexity_windows(model: BenchModel) -> list[list[int]]:
    """Token ids (BOS first when the tokenizer adds one) of the held-out perplexity windows."""
    path = PROMPT_DIR / f"{model.name}-ppl-{PPL_WINDOWS}x{PPL_MAX_TOKENS}.json"
    if not path.exists():
        from edgeflash.export.corpus import heldout_windows

        tokenizer = load_tokenizer(model)
        windows = [tokenizer.encode(w)[:PPL_MAX_TOKENS] for w in heldout_windows(PPL_WINDOWS)]
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(windows))
    return json.loads(path.read_text())
