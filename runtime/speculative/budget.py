"""What speculation adds to a budgeted run, reserved in the plan before the drafter exists (the
drafter shares the engine's resident weights, so it is built after the engine): the lookup
drafter's n-gram index (at its largest: every n-gram of a full context), the self-drafter's KV
cache, work buffers and head rows, and the target's tree-verification buffers. `Model` checks the
drafter's real size against the reservation."""

from __future__ import annotations

import dataclasses

from edgeflash.memory.planner import kv_cache_bytes
from edgeflash.runtime.native_engine import HEAD_CHUNK
from edgeflash.runtime.source import ModelSource


def speculative_reserve(kind: str, source: ModelSource, context: int | None, kv_format: str = "f16") -> int:
    from edgeflash.runtime.speculative.drafters import LookupDrafter, lookup_index_bytes
    from edgeflash.runtime.speculative.self_draft import DEFAULT_SHORTLIST, SELF_DRAFT_MAX_BATCH

    spec = source.spec
    context = context or min(4096, spec.context_length)
    lookup = LookupDrafter()  # at most one index entry per n-gram length and context position
    total = lookup_index_bytes((lookup.max_ngram - lookup.min_ngram + 1) * context, context)
    if kind in ("self", "auto"):
        layers = max(1, spec.n_layers // 4)
        draft = dataclasses.replace(spec, n_layers=layers, layer_kinds=spec.layer_kinds[:layers])
        head = source.tensors["token_embd.weight" if spec.tied_embeddings else "output.weight"]
        row_bytes = head.nbytes // head.rows
        buffers = _work_buffers(draft, SELF_DRAFT_MAX_BATCH)
        total += kv_cache_bytes(draft, context, SELF_DRAFT_MAX_BATCH, kv_format) + buffers \
            + DEFAULT_SHORTLIST * row_bytes + spec.vocab_size * 4
    if kind.startswith("draft:"):  # a separate model: its weights stay resident, next to its KV cache
        from edgeflash.base.models import resolve_model
        from edgeflash.runtime.sources import open_model

        d = open_model(resolve_model(kind[len("draft:"):]))
        total += d.weight_bytes + kv_cache_bytes(d.spec, context, 64, kv_format) + _work_buffers(d.spec, 64) + \
            d.spec.vocab_size * 4
    return total


def _work_buffers(spec, max_batch: int) -> int:
    """runtime/native/engine.cpp's preallocated buffers for this shape (a slight overestimate)."""
    qd = spec.n_heads * spec.head_dim
    kd = spec.n_kv_heads * spec.head_dim
    max_cols = max(spec.d_model, qd, spec.d_ff)
    max_rows = max(max_cols, min(spec.vocab_size, HEAD_CHUNK))
    floats = max_batch * (3 * spec.d_model + 2 * qd + 2 * kd + 2 * spec.d_ff) + 2 * max_batch * max_cols \
        + 2 * max_batch * max_rows + max_batch * min(spec.vocab_size, HEAD_CHUNK)
    return 4 * floats + 2 * max_batch * max_cols * 19 // 8 + max_batch * 4096 + 4 * max_batch
