"""A token tree to verify: node 0 is the root (the token just decided, not yet in the cache);
every other node is a drafted token whose parent comes before it.

Each drafted node carries what its drafter knew of it: `origin` (which drafter proposed it) and
`score` (the drafter's own confidence: a draft model's probability of the token, a lookup's
n-gram length), from which the controller estimates how likely the target accepts it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np


@dataclass
class DraftTree:
    tokens: list[int] = field(default_factory=list)  # tokens[0] is the root
    parents: list[int] = field(default_factory=list)  # parents[0] == -1
    origins: list[str] = field(default_factory=list)  # drafter of each node ("" for the root)
    scores: list[float] = field(default_factory=list)  # the drafter's confidence in each node
    depth: list[int] = field(default_factory=list)

    @classmethod
    def root(cls, token: int) -> DraftTree:
        return cls([int(token)], [-1], [""], [1.0], [0])

    def add(self, parent: int, token: int, origin: str = "", score: float = 0.0,
            trust: Callable[[str, float, int], float] | None = None) -> int:
        """Add `token` under `parent`, or return the existing child with that token, labelled with
        whichever proposal is trusted more: two drafters agreeing is no reason to trust the token
        less. One drafter's scores compare as they are; another's (a lookup's n-gram length against
        a draft model's probability) only through `trust(origin, score, depth)`, the acceptance the
        controller expects of each; without it the first proposal keeps the node."""
        existing = self.child(parent, token)
        if existing is not None:
            old_origin, old_score = self.origins[existing], self.scores[existing]
            if old_origin == origin:
                better = score > old_score
            else:
                depth = self.depth[existing]
                better = trust is not None and trust(origin, score, depth) > trust(old_origin, old_score, depth)
            if better:
                self.origins[existing], self.scores[existing] = origin, score
            return existing
        self.tokens.append(int(token))
        self.parents.append(parent)
        self.origins.append(origin)
        self.scores.append(float(score))
        self.depth.append(self.depth[parent] + 1)
        return len(self.tokens) - 1

    def add_chain(self, parent: int, tokens: list[int], max_nodes: int, origin: str = "",
                  scores: list[float] | None = None) -> None:
        for i, t in enumerate(tokens):
            if len(self.tokens) >= max_nodes and self.child(parent, t) is None:
                return
            parent = self.add(parent, t, origin, scores[i] if scores is not None else 0.0)

    def child(self, parent: int, token: int) -> int | None:
        for i in range(parent + 1, len(self.tokens)):
            if self.parents[i] == parent and self.tokens[i] == token:
                return i
        return None

    def children(self, parent: int) -> list[int]:
        return [i for i in range(parent + 1, len(self.tokens)) if self.parents[i] == parent]

    def path_to(self, node: int) -> list[int]:
        """Node indices from the root to `node`, root first."""
        path = []
        while node >= 0:
            path.append(node)
            node = self.parents[node]
        return path[::-1]

    def keep(self, nodes: list[int]) -> DraftTree:
        """The tree of just these nodes (each one's parent must be kept too), in their order."""
        index = {old: new for new, old in enumerate(sorted(nodes))}
        out = DraftTree()
        for old in sorted(nodes):
            out.tokens.append(self.tokens[old])
            out.parents.append(index[self.parents[old]] if old else -1)
            out.origins.append(self.origins[old])
            out.scores.append(self.scores[old])
            out.depth.append(self.depth[old])
        return out

    @property
    def size(self) -> int:
        return len(self.tokens)

    def depths(self) -> np.ndarray:
        return np.asarray(self.depth, dtype=np.int32)

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
