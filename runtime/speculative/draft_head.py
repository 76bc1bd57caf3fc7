"""The vocabulary a draft model's head computes: a shortlist, not all of it.

A draft model's full head is a large share of what a draft token costs (Qwen2.5-Coder-0.5B: 145 of
392 MB read per token, for 151,936 rows); the target only accepts tokens it would emit itself, and
most of those come from a small part of the vocabulary. The shortlist is
- the target's most frequent tokens where its bundle counted them at export, then the tokenizer's
  own order: BPE and SentencePiece vocabularies list tokens roughly from the most to the least
  frequent (merge order, score order), so a GGUF target needs no text and no counting (measured on
  Qwen2.5-Coder-1.5B's MT-Bench answers: the 0.5B's top-1 agrees with the target on 73.9% of
  tokens with the first 16,384 tokens plus the context's, 72.7% with the 16,384 most frequent in
  1 MB of Shakespeare and 1 MB of Python; 76.7% and 76.6% at 32,768; 78.8% with the full head),
- the end-of-turn tokens,
- and every token of the context (prompt and answer so far), added as it appears: names,
  identifiers and words of the passage the answer quotes.
Rows come from the draft model's head tensor; room for `extra` context tokens is reserved up front
so the buffer never moves (the engine reads it in place) and the memory is known before loading.
A context holds at most as many distinct tokens as the context length, so that is all the room a
draft model needs (context_rows); when earlier contexts' tokens fill it, they are forgotten and the
current context's taken in again.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np

DEFAULT_DRAFT_SHORTLIST = 32768
DEFAULT_CONTEXT_ROWS = 4096  # context tokens outside the shortlist the head can take in, at most


def context_rows(context_length: int) -> int:
    """Room for context tokens a draft model's head needs with a target of this context length."""
    return min(DEFAULT_CONTEXT_ROWS, context_length)


class DraftHead:
    """Rows of a head tensor for a growing set of token ids, in a buffer allocated once."""

    def __init__(self, head: Any, read_rows: Callable[[np.ndarray], np.ndarray], base_ids: np.ndarray,
                 extra: int = DEFAULT_CONTEXT_ROWS):
        """head: the Tensor (for format and row size); read_rows(ids) -> [len(ids), row_bytes] bytes."""
        self.fmt, self.vocab = head.fmt, head.rows
        base_ids = np.unique(np.asarray(base_ids, dtype=np.int32))
        capacity = len(base_ids) + extra
        self.row_bytes = head.nbytes // head.rows
        self.ids = np.zeros(capacity, dtype=np.int32)
        self.rows = np.zeros((capacity, self.row_bytes), dtype=np.uint8)
        self._read = read_rows
        self._member = np.zeros(head.rows, dtype=bool)
        self.count = 0
        self._append(base_ids)
        self.base = self.count  # rows past this one are context tokens

    @property
    def capacity(self) -> int:
        return len(self.ids)

    @property
    def nbytes(self) -> int:
        return self.rows.nbytes + self.ids.nbytes + self._member.nbytes

    def _append(self, ids: np.ndarray) -> None:
        ids = ids[: self.capacity - self.count]
        if not len(ids):
            return
        self.rows[self.count:self.count + len(ids)] = self._read(ids)
        self.ids[self.count:self.count + len(ids)] = ids
        self._member[ids] = True
        self.count += len(ids)

    def _fresh(self, tokens: Iterable[int]) -> np.ndarray:
        fresh = np.unique(np.fromiter((t for t in tokens if 0 <= t < self.vocab), dtype=np.int32))
        return fresh[~self._member[fresh]]

    def has_room(self, tokens: Iterable[int]) -> bool:
        """Whether every token of `tokens` not yet covered fits."""
        return len(self._fresh(tokens)) <= self.capacity - self.count

    def forget_context(self) -> None:
        """Drop every context token taken in so far (the shortlist stays)."""
        self._member[self.ids[self.base:self.count]] = False
        self.count = self.base

    def add(self, tokens: Iterable[int]) -> bool:
        """Take in the tokens not yet covered (while there is room); True if any was added."""
        fresh = self._fresh(tokens)
        before = self.count
        self._append(fresh)
        return self.count > before

    def install(self, native: Any) -> None:
        """Point the engine's head at the current rows (the same buffer every time)."""
        native.set_head_shortlist(self.rows[:self.count], self.fmt, self.ids[:self.count])

    def best_two(self, logits: np.ndarray) -> tuple[int, float, int, float]:
        """(token, probability) of the two most likely shortlist tokens under the draft's logits."""
        scores = logits[self.ids[:self.count]]
        top = np.argpartition(-scores, 1)[:2]
        if scores[top[1]] > scores[top[0]]:
            top = top[::-1]
        peak = scores[top[0]]
        total = np.exp(scores - peak).sum()
        p1, p2 = 1.0 / total, float(np.exp(scores[top[1]] - peak) / total)
        return int(self.ids[top[0]]), float(p1), int(self.ids[top[1]]), p2


def shortlist_ids(source: Any, size: int) -> np.ndarray:
    """The `size` tokens a shortlist head starts from, for the target `source`: its most frequent
    tokens where it has counted them (a bundle's calibration counts), then the tokenizer's own
    order; and its end-of-turn tokens. The self-drafter and a draft model both use this list."""
    vocab = source.spec.vocab_size
    counted = ((source.info.get("manifest") or {}).get("calibration") or {}).get("token_frequencies", {})
    frequent = np.asarray([t for t in counted.get("ids", [])[:size] if 0 <= t < vocab], dtype=np.int32)
    ordered = np.arange(min(size, vocab), dtype=np.int32)
    ordered = ordered[~np.isin(ordered, frequent)][:max(0, size - len(frequent))]
    ends = np.asarray(sorted(t for t in getattr(source.tokenizer, "eos_ids", ()) if 0 <= t < vocab), dtype=np.int32)
    return np.unique(np.concatenate([frequent, ordered, ends]))


def head_bytes(head: Any, size: int, extra: int = DEFAULT_CONTEXT_ROWS) -> int:
    """Memory of a DraftHead over `size` shortlist tokens (before it exists)."""
    rows = min(size, head.rows) + extra + 8  # end-of-turn tokens
    return rows * (head.nbytes // head.rows) + rows * 4 + head.rows
