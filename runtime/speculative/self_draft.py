"""Self-drafting: the target's own first layers, its final norm and a head over the most frequent
tokens (draft_head.shortlist_ids) form a small draft model. It shares the target's
weight arrays, so it costs only its KV cache, its work buffers and the head rows."""

from __future__ import annotations

import dataclasses
from types import SimpleNamespace
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.runtime.native_engine import NativeEngine, ResidentWeights
from edgeflash.runtime.speculative.draft_head import DraftHead, shortlist_ids
from edgeflash.runtime.speculative.drafters import ModelDrafter, level_logits_bytes

DEFAULT_SHORTLIST = 8192
SELF_DRAFT_MAX_BATCH = 16


class SelfDraftWeights:
    """The draft model's weights: the target's first layers and final norm (shared arrays, no copy),
    the head rows of the most frequent tokens, and the embedding the way the target reads it."""

    def __init__(self, target: NativeEngine, tensors: dict, layers: int, ids: np.ndarray):
        self.tensors = {n: t for n, t in tensors.items()
                        if n != "output.weight" and (not n.startswith("blk.") or int(n.split(".")[1]) < layers)}
        self.layers = layers
        # A resident target, or a budgeted one that laid its resident layers out in place, holds its
        # layers in the engine's own layout (panels): the draft runs those, not the file's rows,
        # which would be resident a second time (or are no longer rows).
        laid_out = isinstance(target.weights, ResidentWeights) or getattr(target.weights, "panels", False)
        self.shared = target if laid_out else None
        spec = target.spec
        head_name = "token_embd.weight" if spec.tied_embeddings else "output.weight"
        head = target.source.tensors[head_name]
        budgeted = getattr(target.weights, "read_rows", None)
        if budgeted is not None:  # a budgeted target: direct reads, no memory map
            read = lambda rows: target.weights.read_rows(head_name, rows)
        else:
            read = lambda rows: np.ascontiguousarray(head.take_rows(rows).raw)
        self.head = DraftHead(head, read, ids, extra=0)
        self.embedding_plan = target.weights.embedding_plan() if budgeted is not None else None

    def install(self, engine: NativeEngine) -> None:
        if self.shared is not None:
            engine.set_tensors({n: t for n, t in self.tensors.items() if not n.startswith("blk.")})
            engine._engine.share_layers(self.shared._engine, self.layers)
        else:
            engine.set_tensors(self.tensors)  # embedding, layers, final norm
        if "token_embd.weight" not in self.tensors and self.embedding_plan is not None:
            engine._engine.set_streaming(self.embedding_plan)  # the target reads rows on demand
        self.head.install(engine._engine)

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        return {"head_shortlist_bytes": self.head.rows.nbytes}

    def memory_bytes(self, engine: NativeEngine) -> int:
        """Head rows, KV cache, work buffers and a tree level's logits (the layers are the target's)."""
        stats = engine.stats()
        return self.head.nbytes + sum(int(stats.get(k, 0)) for k in ("kv_cache_bytes", "activation_bytes")) + \
            level_logits_bytes(engine.spec.vocab_size)


def self_draft_engine(target: NativeEngine, layers: int, shortlist: int = DEFAULT_SHORTLIST,
                      tensors: dict | None = None) -> NativeEngine:
    """A native engine running the target's first `layers` layers with a shortlist head."""
    spec = target.spec
    if not 1 <= layers < spec.n_layers:
        raise UserError(f"self-draft layers = {layers}: expected 1..{spec.n_layers - 1}")
    weights = SelfDraftWeights(target, tensors if tensors is not None else target.source.tensors, layers,
                               shortlist_ids(target.source, shortlist))
    draft_spec = dataclasses.replace(spec, n_layers=layers, layer_kinds=spec.layer_kinds[:layers])
    view = SimpleNamespace(spec=draft_spec, tokenizer=target.tokenizer, tensors=weights.tensors,
                           path=target.source.path, weight_bytes=0, info={})
    engine = NativeEngine(view, weights=weights, threads=target.threads, context_length=target.context_length,
                          max_batch=min(target.max_batch, SELF_DRAFT_MAX_BATCH), activations=target.activations,
                          kv_format=target.kv_format)
    engine.name = "self-draft"
    return engine


def self_drafter(engine: NativeEngine, layers: int | None = None, shortlist: int | None = None) -> ModelDrafter:
    """The target's first `layers` (a quarter by default; under a budget, only layers it keeps
    resident can be shared) with a head over the `shortlist` most frequent tokens."""
    tensors = getattr(engine.weights, "resident_tensors", None)
    n = engine.spec.n_layers
    layers = layers or max(1, n // 4)
    if tensors is not None:  # a budgeted target: only layers it keeps resident can be shared
        if getattr(engine.weights, "panels", False):  # laid out in the engine, not kept as rows
            resident = engine.weights.resident_layers
        else:
            resident = 0
            while resident < n and all(name in tensors for name in _layer_matrices(resident, tensors)):
                resident += 1
        if resident == 0:
            raise UserError("self-drafting needs the first layers resident; this budget keeps none")
        layers = min(layers, resident)
    draft = self_draft_engine(engine, layers, shortlist or DEFAULT_SHORTLIST, tensors)
    return ModelDrafter(draft, draft.weights.head, "self")


def _layer_matrices(layer: int, tensors: dict) -> list[str]:
    # a format-3 bundle's FFN is one neuron arena; earlier formats hold three matrices
    ffn = ("ffn_arena",) if f"blk.{layer}.ffn_arena" in tensors else ("ffn_gate.weight", "ffn_up.weight",
                                                                       "ffn_down.weight")
    return [f"blk.{layer}.{n}" for n in ("attn_q.weight", "attn_k.weight", "attn_v.weight", "attn_output.weight",
                                         *ffn)]
