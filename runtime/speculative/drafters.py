"""Drafters: cheap guesses of what the target will say next, as a token tree.

- LookupDrafter: no weights. The context's own n-grams: where the last few tokens occurred
  before, what followed (several earlier occurrences become several branches).
- EngineDrafter: a smaller engine run greedily for a few tokens - either a separate draft model
  with the same tokenizer, or the target's own first layers with a reduced-vocabulary head
  (self-drafting: no extra weights, only its KV cache and the head rows).
"""

from __future__ import annotations

from typing import Any, Protocol

import numpy as np
from edgeflash.runtime.speculative.tree import DraftTree


class Drafter(Protocol):
    name: str

    def propose(self, history: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        """A tree whose root is history[-1] (the token just decided)."""
        ...

    def memory_bytes(self) -> int: ...


class LookupDrafter:
    """Prompt lookup: match the longest recent n-gram (max_ngram down to min_ngram) earlier in the
    context and propose what followed; the most recent occurrences first, one branch each."""

    name = "lookup"

    def __init__(self, max_ngram: int = 4, min_ngram: int = 2, branches: int = 3):
        self.max_ngram, self.min_ngram, self.branches = max_ngram, min_ngram, branches
        self._index: dict[tuple[int, ...], list[int]] = {}  # n-gram -> positions right after it
        self._indexed = 0
        self._seen: list[int] = []

    def _update(self, history: list[int]) -> None:
        if self._seen != history[:len(self._seen)]:  # a different context: start over
            self._index.clear()
            self._indexed = 0
        self._seen = list(history)
        # Index every n-gram that ends before the last token (the suffix we look up).
        for end in range(max(self._indexed, self.min_ngram), len(history)):
            for n in range(self.min_ngram, self.max_ngram + 1):
                if end - n >= 0:
                    self._index.setdefault(tuple(history[end - n:end]), []).append(end)
        self._indexed = len(history)

    def propose(self, history: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        tree = DraftTree.root(history[-1])
        if len(history) < self.min_ngram + 1:
            return tree
        self._update(history)
        used = 0
        for n in range(self.max_ngram, self.min_ngram - 1, -1):
            key = tuple(history[-n:])
            for start in reversed(self._index.get(key, [])):
                if start >= len(history):
                    continue
                continuation = history[start:start + max_depth]
                if continuation:
                    before = tree.size
                    tree.add_chain(0, continuation, max_nodes)
                    used += tree.size > before
                if used >= self.branches or tree.size >= max_nodes:
                    return tree
            if tree.size > 1:
                return tree  # longer matches are better evidence than shorter ones
        return tree

    def memory_bytes(self) -> int:
        return lookup_index_bytes(len(self._index), len(self._seen))


# Python's cost of one index entry (tuple key, position list, an int, the dict slot: about 206 bytes
# measured with tracemalloc on a 512-token context) and of one remembered context token.
INDEX_ENTRY_BYTES = 256
SEEN_TOKEN_BYTES = 40


def lookup_index_bytes(entries: int, tokens: int) -> int:
    return INDEX_ENTRY_BYTES * entries + SEEN_TOKEN_BYTES * tokens


class EngineDrafter:
    """Greedy chains from a draft engine whose KV cache follows the committed context."""

    def __init__(self, engine: Any, name: str):
        self.engine, self.name = engine, name

    def propose(self, history: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        tree = DraftTree.root(history[-1])
        e = self.engine
        common = 0
        for a, b in zip(e.tokens, history):
            if a != b:
                break
            common += 1
        e.truncate(min(common, len(history) - 1))
        kept = len(e.tokens)
        steps = min(max_depth, max_nodes - 1, e.context_length - len(history) - 1)
        if steps <= 0:
            return tree
        logits = e.forward(history[kept:])[-1]
        chain = []
        for i in range(steps):
            t = int(np.argmax(logits))
            chain.append(t)
            if i + 1 < steps:
                logits = e.forward([t])[-1]
        tree.add_chain(0, chain, max_nodes)
        return tree

    def memory_bytes(self) -> int:
        stats = self.engine.stats()
        return sum(int(stats.get(k, 0)) for k in ("kv_cache_bytes", "activation_bytes", "head_shortlist_bytes"))


class CombinedDrafter:
    """`auto`: the lookup drafter when the context repeats itself, else the engine drafter while
    its drafts are accepted often enough to pay for drafting them (checked again now and then)."""

    name = "auto"
    MIN_ACCEPTED = 1.0  # drafted tokens accepted per pass below which the fallback costs more than it saves
    TRIAL_PASSES = 4  # fallback passes measured before it is judged
    RETRY_EVERY = 48  # proposals between trials of a benched fallback

    def __init__(self, lookup: LookupDrafter, fallback: EngineDrafter | None):
        self.lookup, self.fallback = lookup, fallback
        self.last = "lookup"
        self._accepted: float | None = None  # fallback's accepted tokens per pass (running average)
        self._trials = 0
        self._benched_at: int | None = None
        self._proposals = 0

    def propose(self, history: list[int], max_nodes: int, max_depth: int) -> DraftTree:
        self._proposals += 1
        tree = self.lookup.propose(history, max_nodes, max_depth)
        self.last = "lookup"
        if tree.size > 1 or self.fallback is None or not self._fallback_pays():
            return tree  # a tree of one node: the decoder takes a plain step
        self.last = self.fallback.name
        return self.fallback.propose(history, max_nodes, max_depth)

    def feedback(self, name: str, accepted: int) -> None:
        """The decoder's report of one verified pass."""
        if name != getattr(self.fallback, "name", None):
            return
        self._trials += 1
        self._accepted = accepted if self._accepted is None else 0.7 * self._accepted + 0.3 * accepted
        if self._trials >= self.TRIAL_PASSES and self._accepted < self.MIN_ACCEPTED:
            self._benched_at = self._proposals

    def _fallback_pays(self) -> bool:
        if self._benched_at is None:
            return True
        if self._proposals - self._benched_at >= self.RETRY_EVERY:  # the text may have changed: try again
            self._benched_at, self._trials, self._accepted = None, 0, None
            return True
        return False

    def memory_bytes(self) -> int:
        return self.lookup.memory_bytes() + (self.fallback.memory_bytes() if self.fallback else 0)
