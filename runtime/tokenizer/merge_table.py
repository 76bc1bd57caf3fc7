"""An explicit BPE merge list as compact arrays: (left id, right id) -> (rank, merged id).

A dict of tuples costs about 250 bytes per merge; these arrays cost 16 bytes per merge plus
4 bytes per bucket (about one bucket per merge). A pair (l, r) is the key l * V + r (V = the
vocabulary size) and its bucket comes from the top bits of a Fibonacci hash of the key:

    starts [B + 1] uint32   bucket b holds entries starts[b] .. starts[b + 1]
    keys   [M] int64        l * V + r of each entry
    ranks  [M] uint32       the merge's position in the list (lower merges first)
    merged [M] uint32       id of the token the merge makes
"""

from __future__ import annotations

from array import array
from typing import Any

import numpy as np

from .vocab import packed

_GOLDEN = 0x9E3779B97F4A7C15  # 2**64 / golden ratio, odd: spreads consecutive keys over buckets
_MASK64 = (1 << 64) - 1


class MergeTable:
    __slots__ = ("_keys", "_merged", "_ranks", "_shift", "_starts", "_vocab_size")

    def __init__(self, parts: dict[str, Any], vocab_size: int) -> None:
        self._vocab_size = vocab_size
        self._shift: int = parts["shift"]
        self._starts: array = parts["starts"]  # [B + 1] uint32
        self._keys: array = parts["keys"]  # [M] int64
        self._ranks: array = parts["ranks"]  # [M] uint32
        self._merged: array = parts["merged"]  # [M] uint32

    def parts(self) -> dict[str, Any]:
        return {"shift": self._shift, "starts": self._starts, "keys": self._keys, "ranks": self._ranks,
                "merged": self._merged}

    @classmethod
    def build(cls, lefts: np.ndarray, rights: np.ndarray, merged: np.ndarray, vocab_size: int) -> MergeTable:
        """lefts, rights, merged: [M] token ids of the merges in rank order. A pair listed twice
        keeps its last rank, as a dict built from the list would."""
        count = len(lefts)
        keys = lefts.astype(np.int64) * vocab_size + rights.astype(np.int64)
        ranks = np.arange(count, dtype=np.int64)
        # Keep the last occurrence of each key: unique over the reversed list finds it first.
        _, last_from_end = np.unique(keys[::-1], return_index=True)
        keep = np.sort(count - 1 - last_from_end)
        keys, ranks, merged = keys[keep], ranks[keep], merged[keep]
        bucket_bits = max(1, (max(len(keys), 1) - 1).bit_length())
        shift = 64 - bucket_bits
        buckets = (keys.astype(np.uint64) * np.uint64(_GOLDEN)) >> np.uint64(shift)
        order = np.argsort(buckets, kind="stable")
        starts = np.searchsorted(buckets[order], np.arange((1 << bucket_bits) + 1, dtype=np.uint64))
        return cls({"shift": shift, "starts": packed(starts, "I"), "keys": packed(keys[order], "q"),
                    "ranks": packed(ranks[order], "I"), "merged": packed(merged[order], "I")}, vocab_size)

    def __len__(self) -> int:
        return len(self._keys)

    def get(self, left_id: int, right_id: int) -> tuple[int, int] | None:
        """(rank, merged id) of the pair, or None when it never merges."""
        key = left_id * self._vocab_size + right_id
        bucket = ((key * _GOLDEN) & _MASK64) >> self._shift
        keys = self._keys
        entry, stop = self._starts[bucket], self._starts[bucket + 1]
        while entry < stop:
            if keys[entry] == key:
                return self._ranks[entry], self._merged[entry]
            entry += 1
        return None

    def pairs_in_rank_order(self) -> tuple[np.ndarray, np.ndarray]:
        """(left ids, right ids) [M] of the merges, lowest rank first."""
        keys = np.frombuffer(self._keys, dtype=np.int64)
        by_rank = keys[np.argsort(np.frombuffer(self._ranks, dtype=np.uint32), kind="stable")]
        return by_rank // self._vocab_size, by_rank % self._vocab_size
