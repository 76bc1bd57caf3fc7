"""Drafters: cheap guesses of what the target will say next, added to a token tree.

- LookupDrafter: no weights. The context's own n-grams: where the last few tokens occurred
  before, what followed (several earlier occurrences become several branches).
- ModelDrafter: a smaller engine drafting a tree one level at a time (each node's two likeliest
  tokens, the likeliest nodes of a level forwarded together) while the controller finds the next
  level worth its forward: a separate draft model with the same tokenizer (draft_model.py), or the
  target's own first layers (self_draft.py). Both compute a head over a shortlist of tokens
  (draft_head.py).
- Drafters: the set a decoder drafts with (`auto`: lookup and a draft model).
"""

from __future__ import annotations

from typing import Any

import numpy as np
from edgeflash.runtime.speculative import learned
from edgeflash.runtime.speculative.controller import RUNNER_UP, Acceptance, Controller, CostModel, Guard, now
from edgeflash.runtime.speculative.tree import DraftTree


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
        self.extend(tree, history, max_nodes, max_depth)
        return tree

    def extend(self, tree: DraftTree, history: list[int], max_nodes: int, max_depth: int) -> None:
        if len(history) < self.min_ngram + 1:
            return
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
                    scores = [float(n)] * len(continuation)
                    if used:  # an older occurrence that went on otherwise: its first token is an alternative
                        scores[0] = Acceptance.LOOKUP_ALTERNATIVE
                    tree.add_chain(0, continuation, max_nodes, "lookup", scores)
                    used += tree.size > before
                if used >= self.branches or tree.size >= max_nodes:
                    return
            if used:
                return  # longer matches are better evidence than shorter ones

    def memory_bytes(self) -> int:
        return lookup_index_bytes(len(self._index), len(self._seen))


# Python's cost of one index entry (tuple key, position list, an int, the dict slot: about 206 bytes
# measured with tracemalloc on a 512-token context) and of one remembered context token.
INDEX_ENTRY_BYTES = 256
SEEN_TOKEN_BYTES = 40


def lookup_index_bytes(entries: int, tokens: int) -> int:
    return INDEX_ENTRY_BYTES * entries + SEEN_TOKEN_BYTES * tokens


def level_logits_bytes(vocab_size: int) -> int:
    """What a model drafter's forward of a tree level returns: a row of logits per node."""
    return ModelDrafter.LEVEL_WIDTH * vocab_size * 4


class ModelDrafter:
    """Token trees from a draft engine whose KV cache follows the committed context (and the nodes
    of its last tree, until the next step keeps those the target accepted). `head`
    (draft_head.DraftHead) holds the shortlist the engine's head computes.

    The draft engine sees the context's first SINK tokens and, from where it joined, the rest: on a
    long prompt it joins WINDOW tokens before the end, so catching up costs at most that many draft
    tokens (a 300-token passage would cost the 0.5B draft model as much as several target steps).
    Its positions are then closer together than the target's, which changes no relative distance
    inside the window."""

    SINK = 4  # the first tokens (chat template, BOS) models attend to from everywhere
    WINDOW = 192
    # The per-token price of a catch-up is what a new prompt's costs: a few tokens taken in after a
    # pause cost about a forward, 2-3x a new prompt's per token, and priced the next prompt so high
    # that the draft model stopped joining answers.
    PRICED_CATCH_UP = 32
    LEVEL_WIDTH = 2  # nodes of a tree level forwarded together, at most (Controller.widen)

    def __init__(self, engine: Any, head: Any, name: str):
        self.engine, self.head, self.name = engine, head, name
        self._drafted: list[tuple[int, int]] = []  # the draft engine's uncommitted tree: (token, parent index or -1)
        self._join = 0  # history index from which the draft engine has every token (after the sink)
        self.catch_up_s = 0.0  # seconds this step's drafting spent taking in context it had not seen

    def _view(self, history: list[int]) -> list[int]:
        """The tokens the draft engine holds for this history."""
        return history[:self.SINK] + history[max(self.SINK, self._join):]

    def _common(self, view: list[int]) -> int:
        """How many of `view`'s first tokens the draft cache holds."""
        common = 0
        for a, b in zip(self.engine.tokens, view):
            if a != b:
                break
            common += 1
        return common

    def _rejoins(self, view: list[int], common: int) -> bool:
        # a new context (or a long stretch without drafting): join it afresh near its end
        return common < min(len(view), self.SINK + 1) or len(view) - common > self.WINDOW

    def join_afresh(self, history: list[int]) -> list[int]:
        """Join `history` WINDOW tokens before its end: the tokens the draft engine then takes in."""
        self._join = max(self.SINK, len(history) - self.WINDOW)
        return self._view(history)

    def behind(self, history: list[int]) -> int:
        """Context tokens the draft cache must take in before it drafts after history[-1]."""
        view = self._view(history)
        common = self._common(view)
        if self._rejoins(view, common):
            return min(len(history), self.SINK + self.WINDOW)
        return len(view) - min(common, len(view) - 1)

    def _catch_up(self, history: list[int], controller: Controller) -> Any:
        """Bring the draft cache up to history[-1]: logits of the token after it."""
        e = self.engine
        view = self._view(history)
        common = self._common(view)
        if self._rejoins(view, common):
            view, common = self.join_afresh(history), 0
        e.truncate(min(common, len(view) - 1))
        tail = view[len(e.tokens):]
        # The context's tokens join the shortlist before they are needed; when earlier contexts'
        # tokens have filled the head's room, only this context's are kept.
        if not self.head.has_room(tail):
            self.head.forget_context()
            self.head.add(view)
            self.head.install(e._engine)
        elif self.head.add(tail):
            self.head.install(e._engine)
        t0 = now()
        logits = e.forward(tail)[-1]
        if len(tail) <= 2:  # a drafting step; a longer catch-up is not what a draft token costs
            controller.costs.record_draft(self.name, now() - t0)
            return logits
        self.catch_up_s = now() - t0
        if len(tail) >= self.PRICED_CATCH_UP:
            controller.costs.record_catch_up(self.name, self.catch_up_s / len(tail))
        return logits

    def extend(self, tree: DraftTree, history: list[int], controller: Controller, max_depth: int) -> bool:
        """Draft a tree under the root one level at a time while the controller finds the likeliest
        node of the level worth a forward: each forwarded node gets its top two tokens as children,
        and the next level forwards the likeliest of those (up to LEVEL_WIDTH, as the controller
        widens it) in one batch. Whether the draft model ran at all."""
        e = self.engine
        self.catch_up_s = 0.0
        self._keep_drafted(self._view(history))
        steps = min(max_depth, e.context_length - len(history) - 1)
        memo: dict[int, float] = {}
        if steps <= 0 or not controller.draft_more(self.name, 1.0, controller.worth_verifying(tree, memo), first=True,
                                                   behind=self.behind(history)):
            return False
        level = self._expand(tree, 0, self._catch_up(history, controller), controller)
        forwarded: dict[int, int] = {}  # tree node -> its index in the draft engine's uncommitted tree
        # The tree may hold more nodes than a pass verifies: most runner-up leaves are not worth
        # verifying, and a draft that stopped once they filled a pass's nodes saw the target accept
        # every level it drafted in most passes at 25% of Qwen2.5-Coder-1.5B (40 of 72 on 6
        # MT-Bench answers). draft_more stops when the nodes worth verifying fill a pass.
        for _ in range(1, steps):
            memo.clear()
            ranked = sorted(level, key=lambda i: -controller.reach(tree, i, memo))
            width = controller.worth_verifying(tree, memo)
            if not ranked or not controller.draft_more(self.name, memo[ranked[0]], width):
                break
            chosen = ranked[:1] + [i for i in ranked[1:self.LEVEL_WIDTH] if controller.widen(self.name, memo[i], width)]
            room = min(e.max_batch, e.context_length - len(e.tokens)) - len(forwarded)  # the draft tree's slots
            chosen = chosen[:max(0, room)]
            if not chosen:
                break
            t0 = now()
            rows = self._forward_level(tree, chosen, forwarded)
            controller.costs.record_draft(self.name, now() - t0)
            level = [child for node, row in zip(chosen, rows) for child in self._expand(tree, node, row, controller)]
        return True

    def _expand(self, tree: DraftTree, node: int, logits: Any, controller: Controller) -> list[int]:
        """Add the draft's two likeliest tokens after `node` as its children: the nodes added."""
        token, p, runner_up, p2 = self.head.best_two(logits)
        trust = controller.acceptance.estimate  # where lookup proposed the same token
        added = [tree.add(node, token, self.name, p, trust)]
        if p2 > 0:  # the runner-up: a leaf unless the next level finds it worth a forward
            added.append(tree.add(node, runner_up, self.name + RUNNER_UP, p2, trust))
        return added

    def _forward_level(self, tree: DraftTree, nodes: list[int], forwarded: dict[int, int]) -> Any:
        """Logits after each of `nodes` (children of the root or of forwarded nodes), forwarded together
        as the next tokens of the draft engine's uncommitted tree."""
        base = len(forwarded)
        for row, node in enumerate(nodes):
            forwarded[node] = base + row
            self._drafted.append((tree.tokens[node], forwarded.get(tree.parents[node], -1)))
        mask = np.zeros((len(nodes), base + len(nodes)), dtype=np.uint8)
        for row, node in enumerate(nodes):  # the root is the last committed token: every query sees it
            mask[row, [forwarded[a] for a in tree.path_to(node)[1:]]] = 1
        return self.engine.extend_tree([tree.tokens[i] for i in nodes], [tree.depth[i] - 1 for i in nodes], mask)

    def _keep_drafted(self, view: list[int]) -> None:
        """Keep the last step's drafted nodes the context went on with (the target accepted them) in
        the draft cache: the draft engine then forwards only what follows them."""
        drafted, self._drafted = self._drafted, []
        e = self.engine
        at = len(e.tokens)
        if not drafted or e._engine.tree_size != len(drafted) or view[:at] != e.tokens:
            return
        path, parent = [], -1
        for token in view[at:-1]:  # the last token is the new root: the catch-up forwards it
            node = next((k for k, (t, p) in enumerate(drafted) if p == parent and t == token), None)
            if node is None:
                break
            path.append(node)
            parent = node
        if path:
            e.commit_tree(path)

    def memory_bytes(self) -> int:
        return self.engine.weights.memory_bytes(self.engine)  # the draft engine's weight source knows


class Drafters:
    """What a decoder drafts with: lookup first (it costs nothing), then a draft model, if any."""

    def __init__(self, name: str, lookup: LookupDrafter | None, model: ModelDrafter | None, target: Any = None):
        """`target`: the engine drafted for, whose earlier runs' costs and calibration are kept
        (learned.py); None: nothing is kept between runs."""
        self.name, self.lookup, self.model, self.target = name, lookup, model, target
        self._state: dict[bool, tuple[CostModel, Acceptance, dict[str, Guard]]] = {}

    def state(self, greedy: bool) -> tuple[CostModel, Acceptance, dict[str, Guard]]:
        """What the controller learned with these drafters (costs are the engine's, acceptance the
        drafters', guards what paid against plain decoding), kept across generations, and costs and
        calibration across runs; greedy and sampled verification apart."""
        if greedy not in self._state:
            self._state[greedy] = (CostModel(), Acceptance(), {})
            learned.restore(self._learned_path(greedy), *self._state[greedy][:2])
        return self._state[greedy]

    def save(self, greedy: bool) -> None:
        """Keep what was learned for the next run (after a generation)."""
        if greedy in self._state:
            learned.store(self._learned_path(greedy), *self._state[greedy][:2])

    def _learned_path(self, greedy: bool) -> Any:
        if self.target is None:
            return None
        return learned.learned_path(self.target, self.name, self.model.engine if self.model else None, greedy)

    def catch_up_seconds(self) -> float:
        """Seconds the last extend() spent bringing a draft model up to the context (a new prompt, or
        what was decided while it sat out)."""
        return self.model.catch_up_s if self.model is not None else 0.0

    def extend(self, tree: DraftTree, history: list[int], controller: Controller, max_depth: int) -> str | None:
        """Add every drafter's proposals to `tree`; the name of the draft model if one ran."""
        if self.lookup is not None and not controller.lookup_benched():
            self.lookup.extend(tree, history, controller.max_nodes, max_depth)
        if self.model is not None and self.model.extend(tree, history, controller, max_depth):
            return self.model.name
        return None

    def memory_bytes(self) -> int:
        return sum(d.memory_bytes() for d in (self.lookup, self.model) if d is not None)
