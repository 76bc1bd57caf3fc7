"""One speculative step: draft a tree after the token just decided, verify it with the target in
one pass, keep the accepted path. How big a tree to draft, if any, is the controller's choice
(controller.py)."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.sampler import Sampler
from edgeflash.runtime.speculative.controller import Controller
from edgeflash.runtime.speculative.drafters import CombinedDrafter, EngineDrafter, LookupDrafter
from edgeflash.runtime.speculative.tree import DraftTree


@dataclass
class SpecStats:
    passes: int = 0  # verification passes
    plain_steps: int = 0  # single-token steps (nothing drafted, or speculation paused)
    accepted: int = 0  # drafted tokens the target confirmed
    drafted: int = 0
    draft_s: float = 0.0
    verify_s: float = 0.0
    by_drafter: dict[str, list[int]] = field(default_factory=dict)  # name -> [passes, accepted]

    def to_dict(self) -> dict[str, Any]:
        return {
            "spec_passes": self.passes, "spec_plain_steps": self.plain_steps,
            "spec_mean_accepted": round(self.accepted / self.passes, 3) if self.passes else 0.0,
            "spec_acceptance_rate": round(self.accepted / self.drafted, 3) if self.drafted else 0.0,
            "spec_draft_s": round(self.draft_s, 4), "spec_verify_s": round(self.verify_s, 4),
            "spec_by_drafter": {k: {"passes": v[0], "mean_accepted": round(v[1] / v[0], 3) if v[0] else 0.0}
                                for k, v in self.by_drafter.items()},
        }


class SpeculativeDecoder:
    def __init__(self, engine: Any, drafter: Any, sampler: Sampler, max_nodes: int = 16):
        if not hasattr(engine, "forward_tree"):
            raise UserError(f"speculative decoding needs the native engine, not {engine.name!r}")
        max_nodes = min(max_nodes, getattr(engine, "max_batch", max_nodes))
        self.engine, self.drafter, self.sampler = engine, drafter, sampler
        self.controller = Controller(max_nodes)
        self.stats = SpecStats()

    def step(self, history: list[int], room: int | None = None) -> list[int]:
        """history ends with the token just decided (not yet in the cache). Returns the next
        tokens: the drafted ones the target accepted, then one the target chose itself.
        `room`: cache slots left; every tree node takes one until the pass is committed."""
        choice = self.controller.choose()
        tree = None
        t0 = time.perf_counter()
        if choice is not None:
            size, depth = choice
            if room is not None:
                size = min(size, room)
            tree = self.drafter.propose(history, size, depth)
        t1 = time.perf_counter()
        if tree is None or tree.size < 2:
            logits = self.engine.forward([history[-1]])[-1]
            token = self.sampler(logits, history)
            self.stats.plain_steps += 1
            self.controller.record_plain(time.perf_counter() - t0)
            return [token]
        out, path = self._verify(tree, history)
        t2 = time.perf_counter()
        self.engine.commit_tree(path)
        accepted = len(path) - 1
        st = self.stats
        st.passes += 1
        st.accepted += accepted
        st.drafted += tree.size - 1
        st.draft_s += t1 - t0
        st.verify_s += t2 - t1
        name = getattr(self.drafter, "last", None) or self.drafter.name
        st.by_drafter.setdefault(name, [0, 0])
        st.by_drafter[name][0] += 1
        st.by_drafter[name][1] += accepted
        if hasattr(self.drafter, "feedback"):
            self.drafter.feedback(name, accepted)
        self.controller.record(tree.size, int(tree.depths().max()), len(out), time.perf_counter() - t0)
        return out

    def _verify(self, tree: DraftTree, history: list[int]) -> tuple[list[int], list[int]]:
        depths, mask = tree.depths(), tree.ancestor_mask()
        greedy = self.sampler.params.greedy and not self.sampler.params.penalized
        if greedy:
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
            p = self.sampler.probabilities(logits[node], context).copy()
            chosen = None
            for child in tree.children(node):
                x = tree.tokens[child]
                mass = p.sum()
                if mass <= 0:
                    break
                if rng.random() < p[x] / mass:
                    chosen = child
                    break
                p[x] = 0.0
            if chosen is None:
                token = int(rng.choice(p.size, p=p / p.sum()))
                out.append(token)
                return out, path
            token = tree.tokens[chosen]
            out.append(token)
            context.append(token)
            path.append(chosen)
            node = chosen


def make_drafter(kind: str, engine: Any, *, self_layers: int | None = None, shortlist: int | None = None) -> Any:
    """A drafter by name: none | lookup | self | draft:PATH | auto."""
    if kind == "lookup":
        return LookupDrafter()
    if kind == "self":
        return EngineDrafter(_self_engine(engine, self_layers, shortlist), "self")
    if kind.startswith("draft:"):
        return EngineDrafter(_draft_model(kind[len("draft:"):], engine), "draft")
    if kind == "auto":
        try:
            fallback = EngineDrafter(_self_engine(engine, self_layers, shortlist), "self")
        except UserError:
            fallback = None  # a GGUF without calibration counts, or a budget without room
        return CombinedDrafter(LookupDrafter(), fallback)
    raise UserError(f"speculative = {kind!r}: expected none, lookup, self, draft:PATH or auto")


def _self_engine(engine: Any, layers: int | None, shortlist: int | None) -> Any:
    from edgeflash.runtime.speculative.self_draft import DEFAULT_SHORTLIST, self_draft_engine

    tensors = getattr(engine.weights, "resident_tensors", None)
    n = engine.spec.n_layers
    layers = layers or max(1, n // 4)
    if tensors is not None:  # a budgeted target: only layers it keeps resident can be shared
        resident = 0
        while resident < n and all(name in tensors for name in _layer_matrices(resident, tensors)):
            resident += 1
        if resident == 0:
            raise UserError("self-drafting needs the first layers resident; this budget keeps none")
        layers = min(layers, resident)
    return self_draft_engine(engine, layers, shortlist or DEFAULT_SHORTLIST, tensors)


def _layer_matrices(layer: int, tensors: dict) -> list[str]:
    ffn = ("ffn_arena",) if f"blk.{layer}.ffn_arena" in tensors else ("ffn_gate.weight", "ffn_up.weight",
                                                                       "ffn_down.weight")
    return [f"blk.{layer}.{n}" for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight", *ffn)]


def _draft_model(path: str, target: Any) -> Any:
    from edgeflash.base.models import resolve_model
    from edgeflash.runtime.native_engine import NativeEngine
    from edgeflash.runtime.sources import open_model

    source = open_model(resolve_model(path))
    if source.spec.vocab_size != target.spec.vocab_size or \
            source.tokenizer.encode("The quick brown fox.") != target.tokenizer.encode("The quick brown fox."):
        raise UserError(f"{path}: a draft model must use the target's tokenizer")
    return NativeEngine(source, threads=target.threads, context_length=target.context_length,
                        kv_format=target.kv_format)
