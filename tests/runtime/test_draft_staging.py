"""A budgeted draft model streams through its target's staging arena (memory/native/streaming.h):
its slots cost its plan nothing, its first streamed units stay in their slots from one draft token
to the next, and taking turns with the target, which claims the arena for its passes, never
changes a logit."""

from __future__ import annotations

import edgeflash as ef
import numpy as np
import pytest
from edgeflash.kernels import current_isa
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.speculative import draft_model as dm
from edgeflash.runtime.speculative.draft_head import DraftHead, context_rows, shortlist_ids

CONTEXT = 256
PROMPT = "Once upon a time, in a small village by the sea, there lived an old fisherman who"


@pytest.fixture(scope="module")
def target(smol_bundle):
    """SmolLM2-135M under a budget that streams most of its layers: it has an arena to lend."""
    budget = int((smol_bundle / "weights.bin").stat().st_size * 0.4)
    m = ef.load(smol_bundle, memory_budget=budget, context_length=CONTEXT)
    assert m.engine.weights.plan.streamed and m.engine._engine.staging_bytes > 0
    return m


@pytest.fixture(scope="module")
def tiny_draft(tmp_path_factory, smollm_path):
    """A random 6-layer Llama with SmolLM2's tokenizer, as a bundle: units far smaller than the
    target's, so many of them fit in its arena."""
    from edgeflash.export import export
    from edgeflash.export.sources.torch_module import resolve_tokenizer
    from tiny_models import build_tiny_model

    tok = resolve_tokenizer(smollm_path)
    model = build_tiny_model("llama-gqa-untied", tmp_path_factory.mktemp("no-files"), tok.vocab_size,
                             tmp_path_factory.mktemp("tiny-draft"), num_hidden_layers=6)
    out = tmp_path_factory.mktemp("bundles") / "tiny-draft"
    export(model, out, quant="q4_0", config=model.config, tokenizer=tok, calibration_tokens=128, window_tokens=64,
           eval_tokens=64, predictor_rank=8, top_tokens=64, frequency_chars=20_000, progress=False)
    return out


def streaming_budget(source, target, keep: float) -> int:
    """A draft model's budget with about `keep` of its layer bytes resident."""
    everything = dm.budgeted_draft_weights(source, target.source, CONTEXT, target.engine.kv_format, 1 << 40)
    layers = sum(g.nbytes for name, g in everything.layout.groups.items() if name.startswith("layer."))
    embedding = everything.layout.groups["embedding"].nbytes  # its rows are read on demand anyway
    return everything.plan.total - embedding - int((1 - keep) * layers)


def drafter_engine(path, target, budget: int, lent: int | None = None) -> NativeEngine:
    """The draft model at `path` under `budget`, its slots in `lent` bytes of the target's arena."""
    source = dm.open_budgeted_draft_model(path, target.source)
    if lent is None:
        lent = target.engine._engine.staging_bytes
    planned = dm.budgeted_draft_weights(source, target.source, CONTEXT, target.engine.kv_format, budget, lent)
    head_tensor = source.tensors[dm.head_tensor_name(source)]
    head = DraftHead(head_tensor, lambda rows: planned.read_rows(dm.head_tensor_name(source), rows),
                     shortlist_ids(target.source, 4096), extra=context_rows(CONTEXT))
    options = dm.draft_options(source, CONTEXT, target.engine.kv_format, True)
    return NativeEngine(source, weights=dm.BudgetedDraftWeights(planned, head, target.engine), options=options)


def test_a_draft_model_plans_its_slots_in_the_targets_arena(target, smollm_path):
    source = dm.open_budgeted_draft_model(smollm_path, target.source)
    budget = streaming_budget(source, target, keep=0.8)
    lent = target.engine._engine.staging_bytes
    kv = target.engine.kv_format
    borrowing = dm.budgeted_draft_weights(source, target.source, CONTEXT, kv, budget, lent)
    own = dm.budgeted_draft_weights(source, target.source, CONTEXT, kv, budget, 0)
    plan = borrowing.plan
    assert plan.borrowed_staging and plan.staging_bytes == 0 and plan.streamed
    assert plan.io.slots == lent // plan.unit_bytes >= 2
    assert not own.plan.borrowed_staging and own.plan.staging_bytes > 0
    # what its own slots would have taken stays resident instead
    assert plan.resident_bytes > own.plan.resident_bytes
    assert plan.stream_bytes_per_pass < own.plan.stream_bytes_per_pass
    # an arena too small for two of its units is no arena to borrow
    small = dm.budgeted_draft_weights(source, target.source, CONTEXT, kv, budget, plan.unit_bytes)
    assert not small.plan.borrowed_staging


def retained_in(sizes: list[int], lent: int, slot: int) -> int:
    """How many of the first units fit in `lent` bytes packed at their aligned sizes, beside two
    slots of `slot` bytes for the rest (none needed when all of them fit)."""
    aligned = [-(-n // 4096) * 4096 for n in sizes]
    room = lent if sum(aligned) <= lent else lent - 2 * slot
    count = 0
    while count < len(aligned) and sum(aligned[:count + 1]) <= room:
        count += 1
    return count


@pytest.mark.parametrize("slots", [None, 5], ids=["every-unit-retained", "some-units-retained"])
def test_taking_turns_with_the_target_never_changes_a_draft_logit(target, tiny_draft, slots):
    """Draft tokens one after another (the retained units are read once a turn), and now and then a
    target pass (which takes the arena, so the draft model reads them again): the logits equal
    those of the same draft model with every layer resident. Lent `slots` of its largest unit, the
    units that fit beside two of them are retained, and the rest stream through those two."""
    budget = streaming_budget(dm.open_budgeted_draft_model(tiny_draft, target.source), target, keep=0.2)
    probe = drafter_engine(tiny_draft, target, budget)
    sizes = [sum(n for _, n in u.ranges) for u in probe.weights.weights._stream_units()]
    units, unit = len(sizes), probe.weights.weights.plan.unit_bytes
    lent = target.engine._engine.staging_bytes if slots is None else slots * unit
    streaming = drafter_engine(tiny_draft, target, budget, lent)
    resident = drafter_engine(tiny_draft, target, 1 << 40)
    native = streaming._engine
    assert streaming.weights.weights.plan.borrowed_staging == lent and native.staging_bytes == 0
    expected = retained_in(sizes, lent, unit)
    assert units >= 6 and 0 < native.retained_units == expected and (expected == units) == (slots is None)
    ids = target.encode(PROMPT)
    for e in (target.engine, streaming, resident):
        e.reset()
    target.engine.forward(ids[:8])
    a, b = [streaming.forward(ids[:8])[-1]], [resident.forward(ids[:8])[-1]]
    before, turns = native.stream_stats(), 0
    for i, token in enumerate(ids[8:20]):
        if i % 4 == 3:  # the target's turn: a pass of its own claims the arena
            target.engine.forward([token])
            turns += 1
        a.append(streaming.forward([token])[-1])
        b.append(resident.forward([token])[-1])
    after = native.stream_stats()
    passes = after.passes - before.passes
    assert after.retained_hits - before.retained_hits == native.retained_units * (passes - turns)
    assert after.units_read - before.units_read == turns * native.retained_units + passes * (units - native.retained_units)
    if current_isa() in ("avx2", "avx512"):  # rows (streamed) and panels (resident) give the same floats
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    else:
        for x, y in zip(a, b):
            np.testing.assert_allclose(x, y, rtol=1e-3, atol=1e-3)


def test_speculation_through_a_borrowed_arena_is_plain_decoding(target, smollm_path):
    """The load path: a budget that leaves the draft model streaming gives it the target's arena;
    the output is plain decoding's."""
    plain = target.generate(PROMPT, max_tokens=32, speculative="none").tokens
    budget = target.engine.weights.budget + 70 * 2**20
    spec = ef.load(target.source.path, memory_budget=budget, context_length=CONTEXT, speculative=f"draft:{smollm_path}")
    draft = spec._drafters[spec.speculative].model.engine
    plan = draft.weights.weights.plan
    assert plan.borrowed_staging and plan.streamed, plan.describe()
    r = spec.generate(PROMPT, max_tokens=32)
    assert r.tokens == plain and r.stats["spec_passes"] > 0
