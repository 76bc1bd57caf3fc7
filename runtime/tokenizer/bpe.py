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
from collections.abc import Sequence
from typing import Any

MERGE_ORDERS = ("merges", "token_order", "scores")

# Caches are plain dicts cleared when full: simple, and the hit rate on text stays high.
_WORD_CACHE_LIMIT = 50_000
_PAIR_CACHE_LIMIT = 500_000

Rank = Any  # int for explicit and token-order ranks, a tuple for score ranks


class BPEModel:
    """Vocabulary plus merge ranks; turns one word (a str) into token ids."""

    def __init__(
        self,
        vocab: Sequence[str | None],
        *,
        merge_order: str,
        merges: Sequence[tuple[str, str]] | None = None,
        scores: Sequence[float] | None = None,
        byte_fallback: bool = False,
        unk_token: str | None = None,
        fuse_unk: bool = False,
        ignore_merges: bool = False,
    ) -> None:
        if merge_order not in MERGE_ORDERS:
            raise ValueError(f"BPE merge_order {merge_order!r} is not one of {MERGE_ORDERS}")
        self.vocab: list[str | None] = list(vocab)
        # A later duplicate wins, as in a dict built from the file's vocabulary.
        self.id_of: dict[str, int] = {token: index for index, token in enumerate(self.vocab) if token is not None}
        self.merge_order = merge_order
        self.byte_fallback = byte_fallback
        self.fuse_unk = fuse_unk
        self.ignore_merges = ignore_merges
        self.unk_id: int | None = None
        if unk_token is not None:
            if unk_token not in self.id_of:
                raise ValueError(f"BPE unk_token {unk_token!r} is not in the vocabulary")
            self.unk_id = self.id_of[unk_token]
        self._byte_ids: list[int | None] = [self.id_of.get(f"<0x{byte:02X}>") for byte in range(256)]
        self._word_cache: dict[str, tuple[int, ...]] = {}
        self._pair_cache: dict[tuple[int, int], tuple[Rank, int] | None] = {}

        self._merge_table: dict[tuple[int, int], tuple[int, int]] | None = None
        self._scores: list[float] | None = None
        if merge_order == "merges":
            if merges is None:
                raise ValueError("BPE merge_order 'merges' needs a merges list")
            self._merge_table = self._build_merge_table(merges)
        elif merge_order == "scores":
            if scores is None or len(scores) != len(self.vocab):
                raise ValueError(
                    f"BPE merge_order 'scores' needs one score per token: got "
                    f"{0 if scores is None else len(scores)} scores for {len(self.vocab)} tokens"
                )
            self._scores = [float(score) for score in scores]
        # Token-order ranks pack (merged id, longer left piece first) into one int.
        self._length_base = max((len(token) for token in self.id_of), default=0) + 1

    def _build_merge_table(self, merges: Sequence[tuple[str, str]]) -> dict[tuple[int, int], tuple[int, int]]:
        table: dict[tuple[int, int], tuple[int, int]] = {}
        id_of = self.id_of
        for rank, (left, right) in enumerate(merges):
            left_id, right_id, merged_id = id_of.get(left), id_of.get(right), id_of.get(left + right)
            if left_id is None or right_id is None or merged_id is None:
                missing = next(t for t, i in ((left, left_id), (right, right_id), (left + right, merged_id)) if i is None)
                raise ValueError(f"BPE merge #{rank} ({left!r}, {right!r}) uses {missing!r}, which is not in the vocabulary")
            table[(left_id, right_id)] = (rank, merged_id)  # a repeated pair keeps its last rank
        return table

    # -- pair ranks ---------------------------------------------------------------------------

    def _pair(self, left_id: int, right_id: int) -> tuple[Rank, int] | None:
        """(rank, merged id) of an adjacent pair, or None when the pair never merges."""
        key = (left_id, right_id)
        if self._merge_table is not None:
            return self._merge_table.get(key)
        cache = self._pair_cache
        if key in cache:
            return cache[key]
        left, right = self.vocab[left_id], self.vocab[right_id]
        found: tuple[Rank, int] | None = None
        if left is not None and right is not None:
            merged_id = self.id_of.get(left + right)
            if merged_id is not None:
                if self._scores is None:  # token order
                    found = (merged_id * self._length_base + (self._length_base - 1 - len(left)), merged_id)
                else:
                    found = ((-self._scores[merged_id], -len(left), -len(right), merged_id), merged_id)
        if len(cache) >= _PAIR_CACHE_LIMIT:
            cache.clear()
        cache[key] = found
        return found

    # -- encoding ------------------------------------------------------------------------------

    def _initial_symbols(self, word: str) -> list[int]:
        """One symbol per character; unknown characters become their bytes (byte fallback) or
        the unknown token (consecutive unknowns fused into one when fuse_unk)."""
        symbols: list[int] = []
        id_of = self.id_of
        pending_unk = False
        for char in word:
            token_id = id_of.get(char)
            if token_id is not None:
                if pending_unk:
                    symbols.append(self.unk_id)  # type: ignore[arg-type]
                    pending_unk = False
                symbols.append(token_id)
                continue
            if self.byte_fallback:
                byte_ids = [self._byte_ids[byte] for byte in char.encode("utf-8")]
                if all(byte_id is not None for byte_id in byte_ids):
                    symbols.extend(byte_ids)  # type: ignore[arg-type]
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
        pair = self._pair
        following = list(range(1, count + 1))
        following[-1] = -1
        preceding = list(range(-1, count - 1))
        alive = [True] * count
        queue: list[tuple[Rank, int, int]] = []
        for position in range(count - 1):
            found = pair(symbols[position], symbols[position + 1])
            if found is not None:
                queue.append((found[0], position, found[1]))
        heapq.heapify(queue)
        while queue:
            _, position, merged_id = heapq.heappop(queue)
            if not alive[position]:
                continue
            right = following[position]
            if right < 0:
                continue
            current = pair(symbols[position], symbols[right])
            if current is None or current[1] != merged_id:
                continue  # stale: one side has merged since this entry was queued
            symbols[position] = merged_id
            alive[right] = False
            after = following[right]
            following[position] = after
            if after >= 0:
                preceding[after] = position
                found = pair(merged_id, symbols[after])
                if found is not None:
                    heapq.heappush(queue, (found[0], position, found[1]))
            before = preceding[position]
            if before >= 0:
                found = pair(symbols[before], merged_id)
                if found is not None:
                    heapq.heappush(queue, (found[0], before, found[1]))
        return [symbol for symbol, keep in zip(symbols, alive) if keep]

    def encode_word(self, word: str) -> tuple[int, ...]:
        cached = self._word_cache.get(word)
        if cached is not None:
            return cached
        if self.ignore_merges and word in self.id_of:
            ids: tuple[int, ...] = (self.id_of[word],)
        else:
            ids = tuple(self._merge_all(self._initial_symbols(word)))
        if len(self._word_cache) >= _WORD_CACHE_LIMIT:
            self._word_cache.clear()
        self._word_cache[word] = ids
        return ids
