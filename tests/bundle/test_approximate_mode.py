"""Approximate mode of a budgeted run on a real bundle (the tiny Llama): the shortlist head and the
windowed neuron cache, at the smallest budget each configuration accepts (so weights stream)."""

from __future__ import annotations

import edgeflash as ef
import numpy as np
import pytest

PROMPT = "To be, or not to be, that is the question"
SHORTLIST = 32
STEP = 256 * 1024


def smallest_load(bundle, **options):
    """The model loaded at the smallest budget (in STEP increments) the planner accepts."""
    from edgeflash.memory.planner import BudgetError

    budget = 8 << 20
    while budget < 256 << 20:
        try:
            return ef.load(bundle, memory_budget=budget, strategy="flash", context_length=128, **options), budget
        except BudgetError as e:  # start again from the minimum it names (load-time measurements vary a little)
            budget = max(budget + STEP, (e.minimum_bytes or 0) + STEP)
    raise AssertionError(f"no budget under 256 MiB accepted {options}")


@pytest.fixture(scope="module")
def prompt_ids(tiny_bundle_dir):
    return ef.load(tiny_bundle_dir).encode(PROMPT)


def test_shortlist_head_picks_the_best_shortlisted_token(tiny_bundle_dir, prompt_ids):
    full = ef.load(tiny_bundle_dir)
    logits = np.asarray(full.engine.forward(prompt_ids)).reshape(-1)
    model, _ = smallest_load(tiny_bundle_dir, head_shortlist=SHORTLIST)
    ids = np.asarray(model.source.info["manifest"]["calibration"]["token_frequencies"]["ids"][:SHORTLIST])
    result = model.generate(prompt_ids, max_tokens=6)
    assert result.stats["head_shortlist"] == SHORTLIST
    assert set(result.tokens) <= set(ids.tolist())
    # Exact logits for the shortlisted rows: its first choice is the full head's best among them.
    assert result.tokens[0] == int(ids[np.argmax(logits[ids])])


def test_neuron_cache_window_keeps_neurons_and_reads_less(tiny_bundle_dir, prompt_ids):
    from edgeflash.runtime.bundle import load_bundle

    # The layers keep their down columns in different formats (q5_0 in layer 0, q8_0 in the others):
    # the neuron cache reads each layer's bundles in its own format and size.
    layout = load_bundle(tiny_bundle_dir).info["bundle"]
    downs = [next(p.fmt for p in layout.arena(i)[0].parts if p.name == "down") for i in range(3)]
    assert downs == ["q5_0", "q8_0", "q8_0"]
    runs = {}
    for window in (0, 4):
        # as asked (no fallback to exact flash): the cache itself is under test
        model, _ = smallest_load(tiny_bundle_dir, sparsity=0.5, window=window, ffn_fallback=False)
        plan = model.engine.weights.plan
        # The dense FFN is never read: neither resident nor streamed; its neurons come from the arenas.
        assert not [g for g in plan.resident + plan.streamed if g.endswith(".ffn")], plan.describe()
        runs[window] = model.generate(prompt_ids, max_tokens=8).stats
    for window, s in runs.items():
        assert s["sparsity"] == 0.5 and s["window"] == window
        assert 0 < s["predicted_active_fraction"] <= 1
        assert s["neurons_loaded"] > 0
    # Without a window every token reloads its neurons; a window of 4 tokens keeps most of them.
    assert runs[0]["neuron_cache_hit_rate"] < runs[4]["neuron_cache_hit_rate"]
    assert runs[4]["neurons_loaded"] < runs[0]["neurons_loaded"]
    assert runs[4]["neuron_bytes_read"] < runs[0]["neuron_bytes_read"]


def test_chunk_aware_selection_reads_whole_chunks(tiny_bundle_dir, prompt_ids):
    from edgeflash.runtime.bundle import load_bundle

    source = load_bundle(tiny_bundle_dir)
    layout, spec = source.info["bundle"], source.spec
    stride = min(layout.arena_block(i).arena.stride for i in range(spec.n_layers))
    chunk_bytes = max(4096, spec.d_ff * stride // 8)  # eight chunks or so an arena
    model, _ = smallest_load(tiny_bundle_dir, sparsity=0.5, window=4, ffn_fallback=False, neuron_chunk=chunk_bytes)
    s = model.generate(prompt_ids, max_tokens=8).stats
    chunk = s["neuron_chunk_neurons"]
    assert chunk == -(-chunk_bytes // stride)
    # every read is a whole chunk or several merged (the arena's last chunk may be shorter)
    assert s["neuron_read_median_bytes"] >= chunk_bytes
    # a token takes the resident neurons and half of all chunks (rounded), no more
    n_chunks = -(-spec.d_ff // chunk)
    most = max(s["resident_neurons"], int(0.5 * n_chunks + 0.5) * chunk) / spec.d_ff
    assert 0 < s["predicted_active_fraction"] <= most + 1e-3  # (the statistic is rounded)
    assert s["neurons_loaded"] > 0
