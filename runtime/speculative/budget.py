"""What speculation adds to a budgeted run, reserved in the plan before the drafter exists (a
self-drafter shares the engine's resident weights, so it is built after the engine): the lookup
drafter's n-gram index (at its largest: every n-gram of a full context), the logits rows of a
sampled verification pass, the self-drafter's KV cache, work buffers and head rows, and a draft
model's share of the budget. The engines' memory comes from the engine's own function
(plan_memory). The loader checks the drafter's real size against the reservation.

A draft model under a budget is planned like any model (its own BudgetedWeights over its q4_0
copy, draft_file.py, with a shortlist head instead of its full one), but with no staging slots of
its own: the layers it cannot keep stream through the target's staging arena (the two compute in
turn), where they stay from one draft token to the next while they fit (memory/native/streaming.h).
Each pass drafts several tokens, so a byte of the draft model kept resident saves more reading than
a byte of the target: the draft model gets as much of the budget as keeps all of it resident, as
far as the target keeps what its own plan needs at the least. A budget that leaves the draft model
less than its own minimum runs `auto` without it (and refuses `draft:PATH`).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from edgeflash.kernels import _native
from edgeflash.memory.planner import BudgetError
from edgeflash.runtime.native_config import engine_memory, engine_options
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.speculative.draft_head import DEFAULT_DRAFT_SHORTLIST, context_rows, head_bytes
from edgeflash.runtime.speculative.drafters import LookupDrafter, level_logits_bytes, lookup_index_bytes
from edgeflash.runtime.speculative.self_draft import DEFAULT_SHORTLIST, SELF_DRAFT_MAX_BATCH

TARGET_MARGIN = 1 << 20  # what the target's plan keeps above its minimum, for rounding
# Sampled verification (a temperature, or a repeat penalty) needs each tree node's whole row of
# logits, [nodes, vocab] floats, where greedy verification needs only each row's argmax. Under a
# budget, a sampled tree has at most this many nodes, and their rows are reserved up front
# (Qwen2.5-Coder's 151,936 tokens: 2.3 MiB, where a 16-node tree's would be 9.3 MiB).
SAMPLED_TREE_NODES = 4


def sampled_rows_bytes(spec: ModelSpec) -> int:
    """The logits rows a sampled verification pass of SAMPLED_TREE_NODES nodes keeps."""
    return SAMPLED_TREE_NODES * spec.vocab_size * 4


def uses_lookup(kind: str) -> bool:
    return kind in ("lookup", "auto") or kind.startswith("auto:")


def lookup_reserve(kind: str, context: int) -> int:
    if not uses_lookup(kind):
        return 0
    lookup = LookupDrafter()  # at most one index entry per n-gram length and context position
    return lookup_index_bytes((lookup.max_ngram - lookup.min_ngram + 1) * context, context)


def draft_model_path(kind: str, source: ModelSource) -> str | Path | None:
    from edgeflash.runtime.speculative.draft_model import find_draft_model

    if kind.startswith(("draft:", "auto:")):
        return kind.split(":", 1)[1]
    return find_draft_model(source) if kind == "auto" else None


def speculative_reserve(kind: str, source: ModelSource, context: int | None, kv_format: str = "f16", *,
                        budget: int | None = None, options: _native.EngineOptions | None = None,
                        fixed: dict[str, int] | None = None, strategy: str = "flash") -> int:
    """Bytes the drafters of `kind` take. With `budget` (the whole run's), `options` and `fixed`
    (the target's engine options and other fixed costs), a draft model gets the share described
    above."""
    spec = source.spec
    context = context or min(4096, spec.context_length)
    total = lookup_reserve(kind, context) + (sampled_rows_bytes(spec) if budget is not None else 0)
    if kind == "self":
        layers = max(1, spec.n_layers // 4)
        draft = dataclasses.replace(spec, n_layers=layers, layer_kinds=spec.layer_kinds[:layers])
        head = source.tensors["token_embd.weight" if spec.tied_embeddings else "output.weight"]
        total += _engine_bytes(draft, context, SELF_DRAFT_MAX_BATCH, kv_format, "q8x2") + \
            head_bytes(head, DEFAULT_SHORTLIST, extra=0) + level_logits_bytes(spec.vocab_size)
    path = draft_model_path(kind, source)
    if path is None:
        return total
    if budget is None:
        return total + draft_model_bytes(path, source, context, kv_format)
    share = draft_model_share(path, source, context, kv_format, budget - total, options, fixed or {}, strategy)
    if share == 0 and kind.startswith("draft:"):
        raise BudgetError(f"memory budget: no room for draft model {path} next to the target; raise "
                          "--memory-budget or use --speculative auto (lookup alone fits)")
    return total + share


def draft_model_bytes(path: str | Path, target: ModelSource, context: int, kv_format: str) -> int:
    """A draft model without a budget: every weight but its head resident, its head rows and engine."""
    from edgeflash.runtime.speculative.draft_model import (
        DRAFT_ACTIVATIONS,
        DRAFT_MAX_BATCH,
        head_tensor_name,
        open_draft_model,
    )

    d = open_draft_model(path, target)
    head = d.tensors[head_tensor_name(d)]
    weights = sum(t.nbytes for n, t in d.tensors.items() if n != "output.weight")
    return weights + head_bytes(head, DEFAULT_DRAFT_SHORTLIST, context_rows(context)) + \
        level_logits_bytes(d.spec.vocab_size) + _engine_bytes(d.spec, context, DRAFT_MAX_BATCH, kv_format, DRAFT_ACTIVATIONS)


def draft_model_share(path: str | Path, target: ModelSource, context: int, kv_format: str, room: int,
                      options: _native.EngineOptions | None, fixed: dict[str, int], strategy: str) -> int:
    """The bytes of `room` a draft model plans with (0: not enough for it next to the target)."""
    from edgeflash.runtime.budgeted import BudgetedWeights
    from edgeflash.runtime.speculative.draft_model import budgeted_draft_weights, open_budgeted_draft_model

    if options is None:
        raise ValueError("a draft model's share needs the target's engine options")
    try:
        BudgetedWeights(target, budget=1, options=options, strategy=strategy, fixed_costs=fixed, verify=False)
        target_minimum = 0
    except BudgetError as e:
        target_minimum = e.minimum_bytes or 0
    available = room - target_minimum - TARGET_MARGIN
    draft = open_budgeted_draft_model(path, target)
    full = budgeted_draft_weights(draft, target, context, kv_format, 1 << 50)
    # all of it resident but the embedding, whose rows are read on demand (a page a token)
    embedding = full.layout.groups["embedding"].nbytes if "embedding" in full.plan.resident else 0
    share = min(full.plan.total - embedding, available)
    try:
        budgeted_draft_weights(draft, target, context, kv_format, share)
    except BudgetError:
        return 0
    return share


def _engine_bytes(spec: ModelSpec, context: int, max_batch: int | None, kv_format: str, activations: str) -> int:
    """KV cache, work buffers and the one row of logits an engine of this spec keeps."""
    options = engine_options(spec, context_length=context, kv_format=kv_format, activations=activations,
                             **({"max_batch": max_batch} if max_batch else {}))
    mem = engine_memory(spec, options)
    return mem.kv_cache + mem.activations + spec.vocab_size * 4
