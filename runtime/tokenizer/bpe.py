"""Byte-pair encoding of one pre-tokenized word.

The merge loop follows the usual priority-queue formulation: every adjacent pair that has a
merge is queued by (rank, position); the best pair is merged, stale queue entries are skipped,
and the two pairs the merge created are queued. Lower rank wins; on equal rank the leftmost
pair wins. This gives the same result as the `tokenizers` BPE model.

Where a pair's rank comes from:
- `merges`: an explicit list (tokenizer.json, GGUF `tokenizer.ggml.merges`); rank = position.
- `token_order` / `scores`: no list at all. A SentencePiece vocabulary implies its merges: a
  pair (a, b) can merge exactly when a, b and a+b are all tokens, and the merges are ranked by
  the merged token -- by its position in the vocabulary (Gemma) or by its score (other
  SentencePiece models), then longer left piece first. Deriving the rank on demand avoids
  building a list of half a million merges for a 262k vocabulary.
"""

from __future__ import annotations

import heapq
from array import array
from collections.abc import Sequence
from typing import Any

import numpy as np

from .merge_table import MergeTable
from .spec import merge_pair
from .vocab import Vocabulary, max_text_length, packed

MERGE_ORDERS = ("merges", "token_order", "scores")

# Caches are plain dicts cleared when full. They are kept small because what they hold counts
# against the device's memory budget (about 1 MB together at most); words and adjacent pairs
# repeat enough in text for small caches to hit. The word cache is bounded by an estimate of
# its bytes, as a word can be a whole line (for a model without a pre-tokenizer).
_WORD_CACHE_BYTES = 512 * 1024
_WORD_CACHE_MAX_CHARS = 1024
_PAIR_CACHE_LIMIT = 4096
_CHAR_CACHE_LIMIT = 1024
_NOT_CACHED = -2  # a pair-cache miss (-1 caches "does not merge")

Rank = Any  # int for explicit and token-order ranks, a tuple for score ranks


class BPEModel:
    """Vocabulary plus merge ranks; turns one word (a str) into token ids.

    `BPEModel.build(vocab, ...)` makes one from spec fields; `parts()` and `BPEModel(parts)`
    take it apart and put it back together (see `packing`)."""

    def __init__(self, parts: dict[str, Any]) -> None:
        self.vocab = Vocabulary(parts["vocab"])
        self.merge_order: str = parts["merge_order"]
        self.byte_fallback: bool = parts["byte_fallback"]
        self.fuse_unk: bool = parts["fuse_unk"]
        self.ignore_merges: bool = parts["ignore_merges"]
        self.unk_id: int | None = parts["unk_id"]
        self._byte_ids: array = parts["byte_ids"]  # [256] id of the <0xXX> token of each byte, -1 if none
        # Token-order ranks pack (merged id, longer left piece first) into one int.
        self._length_base: int = parts["length_base"]
        self._merge_table = MergeTable(parts["merges"], len(self.vocab)) if parts["merges"] is not None else None
        self._scores: array | None = parts["scores"]  # [N] float64, only for merge_order "scores"
        self._size = len(self.vocab)
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._word_cache_bytes = 0
        self._char_cache: dict[str, int | None] = {}
        # left id * N + right id -> merged id (derived ranks) or rank * N + merged id (explicit
        # merges); -1 when the pair does not merge.
        self._pair_cache: dict[int, int] = {}

    def parts(self) -> dict[str, Any]:
        return {"vocab": self.vocab.parts(), "merge_order": self.merge_order, "byte_fallback": self.byte_fallback,
                "fuse_unk": self.fuse_unk, "ignore_merges": self.ignore_merges, "unk_id": self.unk_id,
                "byte_ids": self._byte_ids, "length_base": self._length_base,
                "merges": self._merge_table.parts() if self._merge_table is not None else None,
                "scores": self._scores}

    @classmethod
    def build(
        cls,
        vocab: Sequence[str | None],
        *,
        merge_order: str,
        merges: Sequence[Sequence[str] | str] | None = None,
        scores: Sequence[float] | None = None,
        byte_fallback: bool = False,
        unk_token: str | None = None,
        fuse_unk: bool = False,
        ignore_merges: bool = False,
    ) -> BPEModel:
        if merge_order not in MERGE_ORDERS:
            raise ValueError(f"BPE merge_order {merge_order!r} is not one of {MERGE_ORDERS}")
        # A later duplicate wins (`find` gives the largest id), as in a dict built from the file.
        vocabulary = Vocabulary.build(vocab)
        unk_id = None
        if unk_token is not None:
            unk_id = vocabulary.find(unk_token)
            if unk_id is None:
                raise ValueError(f"BPE unk_token {unk_token!r} is not in the vocabulary")
        byte_ids = array("q", [-1] * 256)
        for byte in range(256):
            found = vocabulary.find(f"<0x{byte:02X}>")
            if found is not None:
                byte_ids[byte] = found
        table = None
        score_array = None
        if merge_order == "merges":
            if merges is None:
                raise ValueError("BPE merge_order 'merges' needs a merges list")
            table = _build_merge_table(vocabulary, merges)
        elif merge_order == "scores":
            if scores is None or len(scores) != len(vocabulary):
                raise ValueError(
                    f"BPE merge_order 'scores' needs one score per token: got "
                    f"{0 if scores is None else len(scores)} scores for {len(vocabulary)} tokens"
                )
            score_array = packed(np.asarray(scores, dtype=np.float64), "d")
        return cls({"vocab": vocabulary.parts(), "merge_order": merge_order, "byte_fallback": bool(byte_fallback),
                    "fuse_unk": bool(fuse_unk), "ignore_merges": bool(ignore_merges), "unk_id": unk_id,
                    "byte_ids": byte_ids, "length_base": max_text_length(vocab) + 1,
                    "merges": table.parts() if table is not None else None, "scores": score_array})

    # -- the model as spec fields -----------------------------------------------------------------

    def merges_list(self) -> list[list[str]]:
        """The explicit merges as [left, right] texts, lowest rank first (a pair listed twice
        appears once, at the rank that counts)."""
        if self._merge_table is None:
            return []
        text = self.vocab.text
        lefts, rights = self._merge_table.pairs_in_rank_order()
        pairs = zip(lefts.tolist(), rights.tolist())
        return [[text(left), text(right)] for left, right in pairs]  # type: ignore[list-item]

    def scores_list(self) -> list[float] | None:
        return None if self._scores is None else self._scores.tolist()

    # -- pair ranks ---------------------------------------------------------------------------

    def _explicit_pair(self, left_id: int, right_id: int) -> tuple[Rank, int] | None:
        """(rank, merged id) of adjacent pieces under the explicit merge list."""
        cache = self._pair_cache
        key = left_id * self._size + right_id
        packed_rank = cache.get(key, _NOT_CACHED)  # rank * N + merged id, or -1
        if packed_rank == _NOT_CACHED:
            found = self._merge_table.get(left_id, right_id)  # type: ignore[union-attr]
            packed_rank = -1 if found is None else found[0] * self._size + found[1]
            if len(cache) >= _PAIR_CACHE_LIMIT:
                cache.clear()
            cache[key] = packed_rank
        return None if packed_rank < 0 else divmod(packed_rank, self._size)

    def _derived_pair(self, left_id: int, left: str, right_id: int, right: str) -> tuple[Rank, int] | None:
        """(rank, merged id) of adjacent pieces (ids and texts) under a vocabulary-implied merge
        order."""
        cache = self._pair_cache
        key = left_id * self._size + right_id
        merged_id = cache.get(key, _NOT_CACHED)  # or -1
        if merged_id == _NOT_CACHED:
            found = self.vocab.find(left + right)
            merged_id = -1 if found is None else found
            if len(cache) >= _PAIR_CACHE_LIMIT:
                cache.clear()
            cache[key] = merged_id
        if merged_id < 0:
            return None
        if self._scores is None:  # token order
            return merged_id * self._length_base + (self._length_base - 1 - len(left)), merged_id
        return (-self._scores[merged_id], -len(left), -len(right), merged_id), merged_id

    # -- encoding ------------------------------------------------------------------------------

    def _char_id(self, char: str) -> int | None:
        cache = self._char_cache
        if char in cache:
            return cache[char]
        token_id = self.vocab.find(char)
        if len(cache) >= _CHAR_CACHE_LIMIT:
            cache.clear()
        cache[char] = token_id
        return token_id

    def _initial_symbols(self, word: str) -> list[int]:
        """One symbol per character; unknown characters become their bytes (byte fallback) or
        the unknown token (consecutive unknowns fused into one when fuse_unk)."""
        symbols: list[int] = []
        char_id = self._char_id
        pending_unk = False
        for char in word:
            token_id = char_id(char)
            if token_id is not None:
                if pending_unk:
                    symbols.append(self.unk_id)  # type: ignore[arg-type]
                    pending_unk = False
                symbols.append(token_id)
                continue
            if self.byte_fallback:
                byte_ids = [self._byte_ids[byte] for byte in char.encode("utf-8")]
                if min(byte_ids) >= 0:
                    symbols.extend(byte_ids)
                    continue
            if self.unk_id is None:
                continue  # no unknown token: the character is dropped, as the reference does
            if pending_unk and not self.fuse_unk:
                symbols.append(self.unk_id)
            pending_unk = True
        if pending_unk:
            symbols.append(self.unk_id)  # type: ignore[arg-type]
        return symbols

    def _merge_all(self, symbols: list[int]) -> list[int]:
        count = len(symbols)
        if count < 2:
            return symbols
        explicit = self._merge_table is not None
        # Vocabulary-implied ranks look pieces up by text: keep each symbol's text alongside.
        texts = None if explicit else [self.vocab.text(symbol) for symbol in symbols]
        explicit_pair, derived_pair = self._explicit_pair, self._derived_pair

        def pair(left: int, right: int) -> tuple[Rank, int] | None:
            if explicit:
                return explicit_pair(symbols[left], symbols[right])
            return derived_pair(symbols[left], texts[left], symbols[right], texts[right])  # type: ignore[index]

        following = list(range(1, count + 1))
        following[-1] = -1
        preceding = list(range(-1, count - 1))
        alive = [True] * count
        # Entries (rank, position, merged id, left id, right id); lower rank, then leftmost, first.
        queue: list[tuple[Rank, int, int, int, int]] = []
        for position in range(count - 1):
            found = pair(position, position + 1)
            if found is not None:
                queue.append((found[0], position, found[1], symbols[position], symbols[position + 1]))
        heapq.heapify(queue)
        while queue:
            _, position, merged_id, left_id, right_id = heapq.heappop(queue)
            if not alive[position]:
                continue
            right = following[position]
            if right < 0:
                continue
            if symbols[position] != left_id or symbols[right] != right_id:
                # One side has merged since this entry was queued: it still stands only when
                # the pair there now makes the same token (the reference's rule).
                current = pair(position, right)
                if current is None or current[1] != merged_id:
                    continue
            symbols[position] = merged_id
            if texts is not None:
                texts[position] += texts[right]
            alive[right] = False
            after = following[right]
            following[position] = after
            if after >= 0:
                preceding[after] = position
                found = pair(position, after)
                if found is not None:
                    heapq.heappush(queue, (found[0], position, found[1], merged_id, symbols[after]))
            before = preceding[position]
            if before >= 0:
                found = pair(before, position)
                if found is not None:
                    heapq.heappush(queue, (found[0], before, found[1], symbols[before], merged_id))
        return [symbol for symbol, keep in zip(symbols, alive) if keep]

    def encode_word(self, word: str) -> tuple[int, ...] | list[int]:
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        whole = self.vocab.find(word) if self.ignore_merges else None
        if whole is not None:
            return (whole,)
        ids = self._merge_all(self._initial_symbols(word))
        if len(word) <= _WORD_CACHE_MAX_CHARS:
            # About what the entry costs: the key, a tuple of ints (most ids are int objects), a slot.
            cost = 120 + 2 * len(word) + 40 * len(ids)
            if self._word_cache_bytes + cost > _WORD_CACHE_BYTES:
                self._word_cache.clear()
                self._word_cache_bytes = 0
            self._word_cache[word] = tuple(ids)
            self._word_cache_bytes += cost
        return ids


def _build_merge_table(vocab: Vocabulary, merges: Sequence[Sequence[str] | str]) -> MergeTable:
    find = vocab.find
    lefts, rights, merged = array("q"), array("q"), array("q")
    for rank, merge in enumerate(merges):
        left, right = merge_pair(merge, rank)
        left_id, right_id, merged_id = find(left), find(right), find(left + right)
        if left_id is None or right_id is None or merged_id is None:
            missing = next(t for t, i in ((left, left_id), (right, right_id), (left + right, merged_id)) if i is None)
            raise ValueError(f"BPE merge #{rank} ({left!r}, {right!r}) uses {missing!r}, which is not in the vocabulary")
        lefts.append(left_id)
        rights.append(right_id)
        merged.append(merged_id)
    return MergeTable.build(*(np.frombuffer(ids, dtype=np.int64) for ids in (lefts, rights, merged)), len(vocab))
