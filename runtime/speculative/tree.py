"""A token tree to verify: node 0 is the root (the token just decided, not yet in the cache);
every other node is a drafted token whose parent comes before it."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # tokens[0] is the root
    parents: list[int] = field(default_factory=list)  # parents[0] == -1

    @classmethod
    def root(cls, token: int) -> DraftTree:
        return cls([int(token)], [-1])

    def add(self, parent: int, token: int) -> int:
        """Add `token` under `parent` (or return the existing child with that token)."""
        existing = self.child(parent, token)
        if existing is not None:
            return existing
        self.tokens.append(int(token))
        self.parents.append(parent)
        return len(self.tokens) - 1

    def add_chain(self, parent: int, tokens: list[int], max_nodes: int) -> None:
        for t in tokens:
            if len(self.tokens) >= max_nodes and self.child(parent, t) is None:
                return
            parent = self.add(parent, t)

    def child(self, parent: int, token: int) -> int | None:
        for i in range(parent + 1, len(self.tokens)):
            if self.parents[i] == parent and self.tokens[i] == token:
                return i
        return None

    def children(self, parent: int) -> list[int]:
        return [i for i in range(parent + 1, len(self.tokens)) if self.parents[i] == parent]

    @property
    def size(self) -> int:
        return len(self.tokens)

    def depths(self) -> np.ndarray:
        d = np.zeros(len(self.tokens), dtype=np.int32)
        for i in range(1, len(self.tokens)):
            d[i] = d[self.parents[i]] + 1
        return d

    def ancestor_mask(self) -> np.ndarray:
        """mask[i, j] = 1 when node j is node i or one of its ancestors."""
        n = len(self.tokens)
        mask = np.zeros((n, n), dtype=np.uint8)
        for i in range(n):
            j = i
            while j >= 0:
                mask[i, j] = 1
                j = self.parents[j]
        return mask
