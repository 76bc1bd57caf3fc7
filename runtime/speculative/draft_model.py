"""A separate draft model: a smaller model with the target's tokenizer (Qwen2.5-Coder-0.5B for
the 1.5B) drafts token by token. What makes it cheap enough to pay on a CPU:
- its head computes a shortlist (draft_head.py) instead of the whole vocabulary,
- its activations meet the weights as plain Q8 (`q8`): a draft is only a guess, and the 0.5B's
  top-1 agrees with the 1.5B as often that way (78.8% of MT-Bench answer tokens, 78.7% with q8x2),
- without a budget, its matrices are converted to q4_0 at load (DRAFT_REQUANTIZE): the 0.5B's
  file holds q5_0, q6_k and q8_0 matrices, and in q4_0 its top-1 agrees with the 1.5B's answers
  as often while each draft token costs less and its weights take less memory; under a budget
  it is read from a copy of its file in q4_0 (draft_file.py),
- and it drafts only while the next token is worth its forward (controller.py): its probabilities
  are calibrated against what the target accepts.

`auto` looks for a draft model among the model aliases already on this machine: one that shares
the target's tokenizer and has at most half its weight bytes (nothing is downloaded for it).
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UserError
from edgeflash.base.heap import release_free_heap
from edgeflash.base.models import ALIASES, describe_alias, resolve_model
from edgeflash.base.rss import current_rss_bytes
from edgeflash.runtime.budgeted import BudgetedWeights
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.speculative.draft_head import (
    DEFAULT_DRAFT_SHORTLIST,
    DraftHead,
    context_rows,
    head_bytes,
    shortlist_ids,
)
from edgeflash.runtime.speculative.drafters import ModelDrafter, level_logits_bytes

DRAFT_ACTIVATIONS = "q8"
DRAFT_REQUANTIZE = "q4_0"  # what a draft model's wider matrices become at load without a budget
DRAFT_MAX_BATCH = 64  # a draft model catches up on the prompt in chunks of this many tokens
BUDGETED_DRAFT_BATCH = 16  # under a budget: smaller work buffers
MAX_DRAFT_SHARE = 0.5  # `auto` takes a draft model of at most this share of the target's weight bytes
PROBE_TEXT = "The quick brown fox, def main(): return 42 # üñï 東京"


def head_tensor_name(source: ModelSource) -> str:
    return "token_embd.weight" if source.spec.tied_embeddings else "output.weight"


def same_tokenizer(a: ModelSource, b: ModelSource) -> bool:
    return a.spec.vocab_size == b.spec.vocab_size and \
        a.tokenizer.encode(PROBE_TEXT) == b.tokenizer.encode(PROBE_TEXT) and \
        set(a.tokenizer.eos_ids) == set(b.tokenizer.eos_ids)


def _opened(target: ModelSource) -> dict[str, tuple[ModelSource | None, int]]:
    """Draft models opened for this target: path -> (source or None if its tokenizer differs, the
    memory the opened source keeps). Each is opened once, while loading: opening a GGUF parses its
    metadata into temporaries several times what it keeps, which a budget must not see once the
    target's weights are in memory."""
    return target.info.setdefault("draft_models", {})


def open_draft_model(path: str | Path, target: ModelSource, verify: bool = True,
                     required: bool = True) -> ModelSource | None:
    """The draft model at `path`, checked to use the target's tokenizer (then it uses the
    target's: a GGUF file with the same tokenizer metadata never builds its own). None if it does
    not and not `required`."""
    resolved = Path(resolve_model(str(path))).expanduser().resolve()
    cache = _opened(target)
    if str(resolved) not in cache:
        before = current_rss_bytes()
        source: ModelSource | None = open_model(resolved, verify=verify, tokenizer_of=target)
        if source.tokenizer is target.tokenizer or same_tokenizer(source, target):
            source.tokenizer = target.tokenizer
        else:
            source = None
        gc.collect()
        release_free_heap()
        cache[str(resolved)] = (source, max(0, current_rss_bytes() - before))
    source = cache[str(resolved)][0]
    if source is None and required:
        raise UserError(f"{path}: a draft model must use the target's tokenizer")
    return source


def open_budgeted_draft_model(path: str | Path, target: ModelSource) -> ModelSource:
    """The draft model at `path` as a budgeted run plans and reads it: from its q4_0 copy
    (draft_file.py). The original, opened once to find the copy, is then forgotten. Checksums are
    verified with direct I/O while loading."""
    from edgeflash.runtime.speculative.draft_file import budgeted_draft_path

    copies: dict[str, Path] = target.info.setdefault("draft_copies", {})
    key = str(Path(resolve_model(str(path))).expanduser().resolve())
    if key not in copies:
        original = open_draft_model(path, target, verify=False)
        copies[key] = budgeted_draft_path(original)
        if copies[key] != Path(original.path):
            _opened(target).pop(key, None)
            del original
            gc.collect()
            release_free_heap()
    return open_draft_model(copies[key], target, verify=False)


def opening_bytes(path: str | Path, target: ModelSource) -> int:
    """What the opened draft model at `path` keeps in memory (its metadata), as measured."""
    return _opened(target)[str(Path(resolve_model(str(path))).expanduser().resolve())][1]


def find_draft_model(target: ModelSource) -> Path | None:
    """A model alias on this machine that can draft for `target`: the same tokenizer and at most
    MAX_DRAFT_SHARE of its weight bytes (the largest such). None if there is none."""
    if "draft_model_found" in target.info:
        return target.info["draft_model_found"]
    found: list[tuple[int, Path]] = []
    target_path = Path(target.path).resolve()
    for alias in ALIASES:
        try:
            path = describe_alias(alias)["path"]
        except UserError:
            continue
        if path is None or Path(path).resolve() == target_path:
            continue
        size = Path(path).stat().st_size
        if size > MAX_DRAFT_SHARE * target.weight_bytes or any(p == Path(path) for _, p in found):
            continue
        try:
            candidate = open_draft_model(path, target, required=False)
        except (ModelFormatError, UserError, OSError):  # a file that does not open is no drafter
            continue
        if candidate is not None:
            found.append((size, Path(path)))
    target.info["draft_model_found"] = max(found)[1] if found else None
    return target.info["draft_model_found"]


class DraftModelWeights:
    """The draft model's weights: layers, norms and embedding as its file holds them (read in
    place), and its head over the shortlist."""

    def __init__(self, source: ModelSource, head: DraftHead):
        self.source, self.head = source, head

    def install(self, engine: NativeEngine) -> None:
        engine.set_tensors({n: t for n, t in self.source.tensors.items() if n != "output.weight"}, panels=True,
                           head=False)
        self.head.install(engine._engine)

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        return {"head_shortlist_rows": self.head.count}

    def memory_bytes(self, engine: NativeEngine) -> int:
        """Weights (all but the head, as converted at load), head rows, KV cache, work buffers and a
        tree level's logits."""
        untied_head = self.source.tensors.get("output.weight")
        weights = engine.weight_bytes - (untied_head.nbytes if untied_head is not None else 0)
        return weights + self.head.nbytes + _buffers(engine) + level_logits_bytes(engine.spec.vocab_size)


class BudgetedDraftWeights:
    """A draft model under a memory budget: planned and streamed like any model (BudgetedWeights),
    its head replaced by the shortlist, whose rows are read with direct I/O. What it streams goes
    through its target's staging arena: the two engines compute in turn."""

    def __init__(self, weights: BudgetedWeights, head: DraftHead, target: NativeEngine):
        self.weights, self.head, self.target = weights, head, target

    def install(self, engine: NativeEngine) -> None:
        self.weights.install(engine, lender=self.target)
        self.head.install(engine._engine)

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        out = {"head_shortlist_rows": self.head.count, "draft_planned_bytes": self.weights.plan.total}
        if self.weights.plan.borrowed_staging:
            out["draft_retained_units"] = engine._engine.retained_units
        return out

    def memory_bytes(self, engine: NativeEngine) -> int:
        return self.weights.plan.total  # its KV cache, buffers and head rows are fixed costs of its plan


def draft_options(draft: ModelSource, target_context: int, kv_format: str, budgeted: bool) -> Any:
    from edgeflash.runtime.budgeted import BUDGETED_HEAD_CHUNK
    from edgeflash.runtime.native_config import engine_options

    if not budgeted:
        return engine_options(draft.spec, context_length=target_context, max_batch=DRAFT_MAX_BATCH,
                              kv_format=kv_format, activations=DRAFT_ACTIVATIONS)
    return engine_options(draft.spec, context_length=target_context, max_batch=BUDGETED_DRAFT_BATCH,
                          kv_format=kv_format, activations=DRAFT_ACTIVATIONS, head_chunk=BUDGETED_HEAD_CHUNK)


def lent_staging(target: ModelSource) -> int:
    """The staging arena a budgeted target lends its draft model: what its plan holds at its minimum.
    A draft model streams only when the budget leaves it less than all of its weights, and it gets
    everything above the target's minimum first, so the target is then at its minimum."""
    from edgeflash.memory.planner import lendable_staging
    from edgeflash.runtime.budgeted import source_layout

    layout = source_layout(target)
    return lendable_staging(layout, skip=frozenset(g for g in layout.groups if g.endswith(".predictor")))


def budgeted_draft_weights(draft: ModelSource, target: ModelSource, context: int, kv_format: str,
                           budget: int, lent: int | None = None) -> BudgetedWeights:
    """The draft model's plan within `budget` bytes (BudgetError if it cannot fit), its slots in the
    target's staging arena of `lent` bytes (None: what the target holds at its minimum)."""
    from edgeflash.runtime.approximate import ROW_READ_BYTES

    head = draft.tensors[head_tensor_name(draft)]
    fixed = {"draft_head": head_bytes(head, DEFAULT_DRAFT_SHORTLIST, context_rows(context)) + ROW_READ_BYTES,
             "draft_metadata": opening_bytes(draft.path, target),
             "draft_level_logits": level_logits_bytes(draft.spec.vocab_size)}
    return BudgetedWeights(draft, budget=budget, options=draft_options(draft, context, kv_format, True),
                           fixed_costs=fixed, full_head=False, panels=True,
                           lent_staging=lent_staging(target) if lent is None else lent)


def model_drafter(path: str | Path, target: NativeEngine, shortlist: int | None = None,
                  budget: int | None = None, requantize: str | None = DRAFT_REQUANTIZE,
                  source: ModelSource | None = None, borrow_staging: bool = True) -> ModelDrafter:
    """The draft model at `path` drafting for `target`; within `budget` bytes if given. Without a
    budget its wider matrices become `requantize` at load (None: as the file holds them).
    `source`: the draft model already opened (or a variant of it) instead of opening `path`.
    `borrow_staging` False: under a budget, stream through slots of its own, inside `budget`, not
    through the target's arena (what benchmarks/speculative/draft_staging.py compares with)."""
    if source is None:
        source = open_draft_model(path, target.source) if budget is None else \
            open_budgeted_draft_model(path, target.source)
    head_name = head_tensor_name(source)
    head_tensor = source.tensors[head_name]
    ids = shortlist_ids(target.source, shortlist or DEFAULT_DRAFT_SHORTLIST)
    weights: Any
    if budget is None:
        head = DraftHead(head_tensor, lambda rows: np.ascontiguousarray(head_tensor.take_rows(rows).raw), ids,
                         extra=context_rows(target.context_length))
        weights = DraftModelWeights(source, head)
    else:
        # the arena the target has: at least its minimum's whenever the draft model streams (its
        # share was planned with that), often more where the target's plan rounded it up
        lent = target._engine.staging_bytes if borrow_staging else 0
        planned = budgeted_draft_weights(source, target.source, target.context_length, target.kv_format, budget, lent)
        head = DraftHead(head_tensor, lambda rows: planned.read_rows(head_name, rows), ids,
                         extra=context_rows(target.context_length))
        weights = BudgetedDraftWeights(planned, head, target)
    options = draft_options(source, target.context_length, target.kv_format, budget is not None)
    engine = NativeEngine(source, weights=weights, threads=target.threads, options=options,
                          requantize=requantize if budget is None else None)
    engine.name = "draft-model"
    return ModelDrafter(engine, head, "draft")


def _buffers(engine: NativeEngine) -> int:
    stats = engine.stats()
    return sum(int(stats.get(k, 0)) for k in ("kv_cache_bytes", "activation_bytes"))
