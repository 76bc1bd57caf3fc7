"""A separate draft model: a smaller model with the target's tokenizer (Qwen2.5-Coder-0.5B for
the 1.5B) drafts token by token. What makes it cheap enough to pay on a CPU:
- its head computes a shortlist (draft_head.py) instead of the whole vocabulary,
- its activations meet the weights as plain Q8 (`q8`): a draft is only a guess, and the 0.5B's
  top-1 agrees with the 1.5B as often that way (78.8% of MT-Bench answer tokens, 78.7% with q8x2),
- and it drafts only while the next token is worth its forward (controller.py): its probabilities
  are calibrated against what the target accepts.

`auto` looks for a draft model among the model aliases already on this machine: one that shares
the target's tokenizer and has at most half its weight bytes (nothing is downloaded for it).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UserError
from edgeflash.base.models import ALIASES, describe_alias, resolve_model
from edgeflash.runtime.native_engine import NativeEngine, ResidentWeights
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.speculative.draft_head import DEFAULT_DRAFT_SHORTLIST, DraftHead, shortlist_ids
from edgeflash.runtime.speculative.drafters import ModelDrafter

DRAFT_ACTIVATIONS = "q8"
DRAFT_MAX_BATCH = 64  # a draft model catches up on the prompt in chunks of this many tokens
MAX_DRAFT_SHARE = 0.5  # `auto` takes a draft model of at most this share of the target's weight bytes
PROBE_TEXT = "The quick brown fox, def main(): return 42 # üñï 東京"


def head_tensor_name(source: ModelSource) -> str:
    return "token_embd.weight" if source.spec.tied_embeddings else "output.weight"


def same_tokenizer(a: ModelSource, b: ModelSource) -> bool:
    return a.spec.vocab_size == b.spec.vocab_size and \
        a.tokenizer.encode(PROBE_TEXT) == b.tokenizer.encode(PROBE_TEXT) and \
        set(a.tokenizer.eos_ids) == set(b.tokenizer.eos_ids)


def open_draft_model(path: str | Path, target: ModelSource) -> ModelSource:
    source = open_model(resolve_model(str(path)))
    if not same_tokenizer(source, target):
        raise UserError(f"{path}: a draft model must use the target's tokenizer")
    return source


def find_draft_model(target: ModelSource) -> Path | None:
    """A model alias on this machine that can draft for `target`: the same tokenizer and at most
    MAX_DRAFT_SHARE of its weight bytes (the largest such). None if there is none."""
    found: list[tuple[int, Path]] = []
    target_path = Path(target.path).resolve()
    for alias in ALIASES:
        try:
            path = describe_alias(alias)["path"]
        except UserError:
            continue
        if path is None or Path(path).resolve() == target_path:
            continue
        size = Path(path).stat().st_size
        if size > MAX_DRAFT_SHARE * target.weight_bytes or any(p == Path(path) for _, p in found):
            continue
        try:
            candidate = open_model(path)
        except (ModelFormatError, UserError, OSError):  # a file that does not open is no drafter
            continue
        if same_tokenizer(candidate, target):
            found.append((size, Path(path)))
    return max(found)[1] if found else None


class DraftModelWeights:
    """The draft model's weights: layers, norms and embedding as its file holds them (read in
    place), and its head over the shortlist."""

    def __init__(self, source: ModelSource, head: DraftHead):
        self.source, self.head = source, head

    def install(self, engine: NativeEngine) -> None:
        ResidentWeights({n: t for n, t in self.source.tensors.items() if n != "output.weight"}).install(engine)
        self.head.install(engine._engine)

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        return {"head_shortlist_rows": self.head.count}


def model_drafter(path: str | Path, target: NativeEngine, shortlist: int | None = None) -> ModelDrafter:
    source = open_draft_model(path, target.source)
    head_tensor = source.tensors[head_tensor_name(source)]
    head = DraftHead(head_tensor, lambda ids: np.ascontiguousarray(head_tensor.take_rows(ids).raw),
                     shortlist_ids(target.tokenizer, source.spec.vocab_size, shortlist or DEFAULT_DRAFT_SHORTLIST))
    engine = NativeEngine(source, weights=DraftModelWeights(source, head), threads=target.threads,
                          context_length=target.context_length, max_batch=DRAFT_MAX_BATCH,
                          activations=DRAFT_ACTIVATIONS, kv_format=target.kv_format)
    engine.name = "draft-model"
    return ModelDrafter(engine, head, "draft")
