"""One speculative step: draft a tree after the token just decided, verify the part worth it with
the target in one pass, keep the accepted path. What is worth verifying, and how far a draft
model drafts, is the controller's choice (controller.py)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.sampler import Sampler
from edgeflash.runtime.speculative.budget import SAMPLED_TREE_NODES
from edgeflash.runtime.speculative.controller import Controller, now
from edgeflash.runtime.speculative.drafters import Drafters, LookupDrafter
from edgeflash.runtime.speculative.tree import DraftTree

MAX_TREE = 32  # nodes per verification at most (the engine's batch may allow more)


@dataclass
class SpecStats:
    passes: int = 0  # verification passes
    plain_steps: int = 0  # single-token steps (nothing worth verifying, or speculation paused)
    accepted: int = 0  # drafted tokens the target confirmed
    drafted: int = 0  # drafted tokens verified
    draft_s: float = 0.0
    verify_s: float = 0.0
    by_drafter: dict[str, list[int]] = field(default_factory=dict)  # name -> [passes, verified, accepted]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec_passes": self.passes, "spec_plain_steps": self.plain_steps,
            "spec_mean_accepted": round(self.accepted / self.passes, 3) if self.passes else 0.0,
            "spec_acceptance_rate": round(self.accepted / self.drafted, 3) if self.drafted else 0.0,
            "spec_draft_s": round(self.draft_s, 4), "spec_verify_s": round(self.verify_s, 4),
            "spec_by_drafter": {k: {"passes": v[0], "verified": v[1], "accepted": v[2],
                                    "mean_accepted": round(v[2] / v[0], 3) if v[0] else 0.0}
                                for k, v in self.by_drafter.items()},
        }


class SpeculativeDecoder:
    def __init__(self, engine: Any, drafters: Drafters, sampler: Sampler, max_nodes: int = MAX_TREE):
        if not hasattr(engine, "forward_tree"):
            raise UserError(f"speculative decoding needs the native engine, not {engine.name!r}")
        max_nodes = min(max_nodes, getattr(engine, "max_batch", max_nodes))
        self.engine, self.drafters, self.sampler = engine, drafters, sampler
        self.greedy = sampler.params.greedy and not sampler.params.penalized
        if not self.greedy and getattr(getattr(engine, "weights", None), "plan", None) is not None:
            max_nodes = min(max_nodes, SAMPLED_TREE_NODES)  # the logits rows the budget reserved
        self.controller = Controller(max_nodes, *drafters.state(self.greedy))
        self.controller.acceptance.new_text()
        self.stats = SpecStats()

    def step(self, history: list[int], room: int | None = None, wanted: int | None = None) -> list[int]:
        """history ends with the token just decided (not yet in the cache). Returns the next
        tokens: the drafted ones the target accepted, then one the target chose itself.
        `room`: cache slots left; every tree node takes one until the pass is committed.
        `wanted`: tokens the generation still asks for. A pass adds its own token after the
        accepted ones, so a draft deeper than wanted - 1 would be verified for nothing."""
        c = self.controller
        t0 = now()
        drafted, model, once = False, None, 0.0
        if not c.plain_now() and (wanted is None or wanted > 1):
            limit = min(c.max_nodes, room) if room is not None else c.max_nodes
            depth = limit - 1 if wanted is None else min(limit - 1, wanted - 1)
            tree = DraftTree.root(history[-1])
            model = self.drafters.extend(tree, history, c, max_depth=depth)
            # A draft model's catch-up on the context is paid once, and the controller charged it to
            # the steps it serves (draft_more). The guards judge a few steps: they leave it out, or
            # they would bench the draft model at the start of every answer.
            once = self.drafters.catch_up_seconds()
            drafted = tree.size > 1
            selection = c.select_pass(tree, limit=limit) if drafted else None
            if selection is not None:
                out = self._pass(tree.keep(selection.nodes), history, t0)
                c.record_step(model, len(out), now() - t0 - once)
                return out
        t1 = now()
        logits = self.engine.forward([history[-1]])[-1]
        token = self.sampler(logits, history)
        t2 = now()
        if self.drafters.model is not None:
            c.record_confidence(logits)
        self.stats.plain_steps += 1
        self.stats.draft_s += t1 - t0
        c.record_plain(t2 - t1)
        if drafted:  # drafting that found nothing worth verifying still took its time
            c.record_step(model, 1, t2 - t0 - once)
        return [token]

    def finish(self) -> None:
        """The generation ended: what it taught is kept for the next run."""
        self.drafters.save(self.greedy)

    def _pass(self, tree: DraftTree, history: list[int], t0: float) -> list[int]:
        t1 = now()
        out, path = self._verify(tree, history)
        self.engine.commit_tree(path)
        t2 = now()
        accepted = len(path) - 1
        st = self.stats
        st.passes += 1
        st.accepted += accepted
        st.drafted += tree.size - 1
        st.draft_s += t1 - t0
        st.verify_s += t2 - t1
        on_path = set(path)
        for name in set(tree.origins[1:]):
            row = st.by_drafter.setdefault(name, [0, 0, 0])
            nodes = [i for i in range(1, tree.size) if tree.origins[i] == name]
            row[0] += 1
            row[1] += len(nodes)
            row[2] += sum(i in on_path for i in nodes)
        self.controller.record_pass(tree, path, t2 - t1)
        return out

    def _verify(self, tree: DraftTree, history: list[int]) -> tuple[list[int], list[int]]:
        depths, mask = tree.depths(), tree.ancestor_mask()
        if self.greedy:
            best = self.engine.forward_tree(tree.tokens, depths, mask, argmax_only=True)
            node, out, path = 0, [], [0]
            while True:
                pred = int(best[node])
                out.append(pred)
                child = tree.child(node, pred)
                if child is None:
                    return out, path
                path.append(child)
                node = child
        logits = self.engine.forward_tree(tree.tokens, depths, mask)
        return self._verify_sampled(tree, logits, history)

    def _verify_sampled(self, tree: DraftTree, logits: np.ndarray, history: list[int]) -> tuple[list[int], list[int]]:
        """Multi-candidate rejection sampling with point-mass drafts: try each drafted child x in
        turn, accept it with probability p(x) under what is left of the target's distribution p,
        else remove x from p and renormalize; if every child is rejected, sample from what is
        left. The token that comes out is distributed exactly as p."""
        rng = self.sampler.rng
        node, out, path = 0, [], [0]
        context = list(history)
        while True:
            ids, p = self.sampler.distribution(logits[node], context)  # ids ascending, p a fresh array
            chosen = None
            for child in tree.children(node):
                x = tree.tokens[child]
                mass = p.sum()
                if mass <= 0:
                    break
                at = int(np.searchsorted(ids, x))
                px = p[at] if at < ids.size and ids[at] == x else 0.0
                if rng.random() < px / mass:
                    chosen = child
                    break
                if px:
                    p[at] = 0.0
            if chosen is None:
                token = int(ids[rng.choice(ids.size, p=p / p.sum())])
                out.append(token)
                return out, path
            token = tree.tokens[chosen]
            out.append(token)
            context.append(token)
            path.append(chosen)
            node = chosen


KINDS = "none, lookup, self, draft:PATH, auto or auto:PATH"


def make_drafter(kind: str, engine: Any, *, self_layers: int | None = None, shortlist: int | None = None) -> Drafters:
    """Drafters by name: lookup | self | draft:PATH | auto | auto:PATH. Under a budget, a draft
    model plans within what the budget reserved for speculation (budget.py)."""
    if kind == "lookup":
        return Drafters(kind, LookupDrafter(), None, engine)
    if kind == "self":
        from edgeflash.runtime.speculative.self_draft import self_drafter

        return Drafters(kind, None, self_drafter(engine, self_layers, shortlist), engine)
    if kind == "auto" or kind.startswith(("draft:", "auto:")):
        from edgeflash.runtime.speculative.budget import draft_model_path, lookup_reserve, sampled_rows_bytes
        from edgeflash.runtime.speculative.draft_model import model_drafter

        path = draft_model_path(kind, engine.source)
        budget = None
        plan = getattr(engine.weights, "plan", None)
        if path is not None and plan is not None:  # a budgeted target: the draft model's share
            budget = plan.fixed.get("speculative", 0) - lookup_reserve(kind, engine.context_length) - \
                sampled_rows_bytes(engine.spec)
            if budget <= 0:
                if kind.startswith("draft:"):
                    raise UserError(f"speculative = {kind!r}: the memory budget reserved no room for a draft "
                                    f"model; load the model with speculative={kind!r}")
                path = None  # `auto` under a budget without room for the draft model: lookup alone
        model = model_drafter(path, engine, shortlist, budget) if path is not None else None
        return Drafters(kind, None if kind.startswith("draft:") else LookupDrafter(), model, engine)
    raise UserError(f"speculative = {kind!r}: expected {KINDS}")
