"""What speculation adds to a budgeted run, reserved in the plan before the drafter exists (a
self-drafter shares the engine's resident weights, so it is built after the engine): the lookup
drafter's n-gram index (at its largest: every n-gram of a full context), the self-drafter's KV
cache, work buffers and head rows, and a draft model's weights, head rows and engine. The engines'
memory comes from the engine's own function (plan_memory). The loader checks the drafter's real
size against the reservation."""

from __future__ import annotations

import dataclasses

from edgeflash.runtime.native_config import engine_memory, engine_options
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.speculative.draft_head import DEFAULT_CONTEXT_ROWS, DEFAULT_DRAFT_SHORTLIST, head_bytes
from edgeflash.runtime.speculative.drafters import LookupDrafter, lookup_index_bytes
from edgeflash.runtime.speculative.self_draft import DEFAULT_SHORTLIST, SELF_DRAFT_MAX_BATCH


def speculative_reserve(kind: str, source: ModelSource, context: int | None, kv_format: str = "f16") -> int:
    from edgeflash.runtime.speculative.draft_model import (
        DRAFT_ACTIVATIONS,
        DRAFT_MAX_BATCH,
        find_draft_model,
        head_tensor_name,
        open_draft_model,
    )

    spec = source.spec
    context = context or min(4096, spec.context_length)
    total = 0
    if kind in ("lookup", "auto") or kind.startswith("auto:"):
        lookup = LookupDrafter()  # at most one index entry per n-gram length and context position
        total += lookup_index_bytes((lookup.max_ngram - lookup.min_ngram + 1) * context, context)
    if kind == "self":
        layers = max(1, spec.n_layers // 4)
        draft = dataclasses.replace(spec, n_layers=layers, layer_kinds=spec.layer_kinds[:layers])
        head = source.tensors["token_embd.weight" if spec.tied_embeddings else "output.weight"]
        total += _engine_bytes(draft, context, SELF_DRAFT_MAX_BATCH, kv_format, "q8x2") + \
            head_bytes(head, DEFAULT_SHORTLIST, extra=0)
    path = None
    if kind.startswith(("draft:", "auto:")):
        path = kind.split(":", 1)[1]
    elif kind == "auto":
        path = find_draft_model(source)
    if path is not None:  # a separate model: its weights stay resident, next to its engine and head
        d = open_draft_model(path, source)
        head_name = head_tensor_name(d)
        head = d.tensors[head_name]
        weights = sum(t.nbytes for n, t in d.tensors.items() if n != "output.weight")
        total += weights + head_bytes(head, DEFAULT_DRAFT_SHORTLIST, DEFAULT_CONTEXT_ROWS) + \
            _engine_bytes(d.spec, context, DRAFT_MAX_BATCH, kv_format, DRAFT_ACTIVATIONS)
    return total


def _engine_bytes(spec: ModelSpec, context: int, max_batch: int | None, kv_format: str, activations: str) -> int:
    """KV cache, work buffers and the one row of logits an engine of this spec keeps."""
    options = engine_options(spec, context_length=context, kv_format=kv_format, activations=activations,
                             **({"max_batch": max_batch} if max_batch else {}))
    mem = engine_memory(spec, options)
    return mem.kv_cache + mem.activations + spec.vocab_size * 4
