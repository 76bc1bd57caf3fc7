"""A sparse FFN is used only where it pays against exact flash: the estimate (memory/sparse_cost.py),
measured tokens/s that override it (memory/sparsity_profile.py), the fallback's output (exact flash's,
token for token), `sparsity="auto"`, and peak RSS inside the budget for sparse and auto runs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import edgeflash as ef
import numpy as np
import pytest
from edgeflash.memory import sparsity_profile
from edgeflash.memory.sparse_cost import SparseLayerGeometry, choose_ffn, layer_read_bytes

PROMPT = "The history of the lighthouse keepers on this coast begins"


def exact_bytes(bundle) -> int:
    manifest = json.loads((bundle / "manifest.json").read_text())
    return sum(b["nbytes"] for b in manifest["blocks"] if b["kind"] not in ("neurons", "predictor"))


@pytest.fixture
def profile_home(tmp_path, monkeypatch):
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    return tmp_path


def test_window_and_hot_first_order_read_fewer_pages():
    rng = np.random.default_rng(0)
    freq = np.sort(rng.beta(0.5, 1.5, 2048))[::-1]  # hot first, as the exporter orders an arena
    hot_first = SparseLayerGeometry(freq, 1000, 0)
    shuffled = SparseLayerGeometry(rng.permutation(freq), 1000, 0)
    by_window = [layer_read_bytes(hot_first, 0.3, k, 2048) for k in (0, 2, 8)]
    assert by_window[0] > by_window[1] > by_window[2] > 0
    # hot neurons sharing pages: a token touches fewer pages than with the same neurons scattered
    assert layer_read_bytes(hot_first, 0.3, 4, 2048) < layer_read_bytes(shuffled, 0.3, 4, 2048)
    # a cache too small for the window's union keeps a shorter window: more misses
    assert layer_read_bytes(hot_first, 0.3, 8, 200) > by_window[2]


def test_measured_tokens_per_second_decide_over_the_estimate():
    assert not choose_ffn(100, 10, 1, {"exact": 5.0, "sparse": 4.0}).sparse  # the estimate would keep it
    assert choose_ffn(100, 100, 100, {"exact": 5.0, "sparse": 6.0}).sparse  # the estimate would refuse it
    assert not choose_ffn(0, 0, 1_000_000).sparse  # exact flash reads nothing: sparse cannot read less


_EXACT_TOKENS: dict[tuple[str, int], list[int]] = {}  # exact flash's greedy tokens per bundle and budget


def exact_tokens(bundle, budget: int) -> list[int]:
    """Exact flash's 12 greedy tokens of PROMPT under `budget`, decoded once for both neuron
    chunkings compared with them."""
    key = (str(bundle), budget)
    if key not in _EXACT_TOKENS:
        _EXACT_TOKENS[key] = ef.load(bundle, memory_budget=budget, context_length=256).generate(
            PROMPT, max_tokens=12).tokens
    return _EXACT_TOKENS[key]


@pytest.mark.parametrize("fixture", ["smol_bundle", "gemma_bundle"])
@pytest.mark.parametrize("fraction", [0.4, 0.6, 1.5])
@pytest.mark.parametrize("neuron_chunk", [0, 65536])
def test_planner_falls_back_to_exact_flash_where_sparse_loses(fixture, fraction, neuron_chunk, request, profile_home):
    bundle = request.getfixturevalue(fixture)
    budget = int(exact_bytes(bundle) * fraction)
    m = ef.load(bundle, memory_budget=budget, context_length=256, sparsity=0.5, window=4, neuron_chunk=neuron_chunk)
    r = m.generate(PROMPT, max_tokens=12)
    notes = m.engine.weights.plan.notes
    if fraction >= 1:  # every weight resident: exact flash reads nothing, so sparse must fall back
        assert "sparsity" not in r.stats, notes
    if "sparsity" not in r.stats:  # fell back: the plan says so, and the run is exact flash's
        assert r.stats["ffn_sparsity_requested"] == 0.5 and r.stats["ffn_fallback"]
        assert any("not used" in n for n in notes), notes
        assert r.tokens == exact_tokens(bundle, budget)
        assert not any(g.endswith(".predictor") for g in m.engine.weights.plan.streamed)
    else:
        assert any("sparse FFN kept" in n for n in notes), notes


def test_measured_profile_overrides_the_estimate(smol_bundle, profile_home):
    budget = int(exact_bytes(smol_bundle) * 1.5)  # the estimate alone falls back here (test above)
    weights = smol_bundle / "weights.bin"
    sparsity_profile.record(weights, budget, {"exact": 50.0, "s0.5 k4": 60.0})
    kept = ef.load(smol_bundle, memory_budget=budget, context_length=256, sparsity=0.5, window=4)
    assert kept.generate(PROMPT, max_tokens=4).stats["sparsity"] == 0.5
    sparsity_profile.record(weights, budget, {"exact": 50.0, "s0.5 k4": 40.0})
    dropped = ef.load(smol_bundle, memory_budget=budget, context_length=256, sparsity=0.5, window=4)
    stats = dropped.generate(PROMPT, max_tokens=4).stats
    assert "sparsity" not in stats and "measured 40.00 tok/s" in stats["ffn_fallback"]


def test_auto_picks_the_fastest_measured_setting(smol_bundle, profile_home):
    budget = int(exact_bytes(smol_bundle) * 0.5)
    m = ef.load(smol_bundle, memory_budget=budget, context_length=256, sparsity="auto")
    measured = sparsity_profile.measurements(smol_bundle / "weights.bin", budget)
    levels = json.loads((smol_bundle / "manifest.json").read_text())["calibration"]["sparsity"]["targets"]
    assert set(measured) == {"exact"} | {f"s{s:g} k{k}" for s in levels for k in (0, 4)}
    best = max(measured, key=measured.get)
    stats = m.generate(PROMPT, max_tokens=4).stats
    chosen = "exact" if "sparsity" not in stats else f"s{stats['sparsity']:g} k{stats['window']}"
    assert chosen == best, (measured, m.engine.weights.plan.notes)
    assert any("auto chose" in n for n in m.engine.weights.plan.notes)
    # a setting that agrees with exact flash on fewer than 90% of tokens is recorded at 0: never picked
    assert measured["exact"] > 0


RSS_SCRIPT = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    bundle, budget, options = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3])
    reset_peak_rss()
    before = current_rss_bytes()
    m = ef.load(bundle, memory_budget=budget, context_length=256, **options)
    r = m.generate("Once upon a time", max_tokens=24)
    print(json.dumps({"peak_over_baseline": peak_rss_bytes() - before, "generated": r.stats["generated_tokens"],
                      "sparsity": r.stats.get("sparsity"), "neuron_bytes_read": r.stats.get("neuron_bytes_read")}))
""")


@pytest.mark.parametrize("options", [{"sparsity": 0.5, "window": 4, "ffn_fallback": False},
                                     {"sparsity": 0.3, "window": 0, "ffn_fallback": False},
                                     {"sparsity": 0.5, "window": 4, "ffn_fallback": False, "neuron_chunk": 65536},
                                     {"sparsity": "auto"}])
@pytest.mark.parametrize("fraction", [0.4, 0.6])
def test_peak_rss_inside_the_budget_in_sparse_and_auto_runs(smol_bundle, options, fraction, profile_home):
    budget = int(exact_bytes(smol_bundle) * fraction)
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, str(smol_bundle), str(budget), json.dumps(options)],
                          capture_output=True, text=True, timeout=600, env={**__import__("os").environ,
                                                                           "XDG_CACHE_HOME": str(profile_home)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert out["generated"] == 24
    if options.get("ffn_fallback") is False:
        assert out["sparsity"] == options["sparsity"] and out["neuron_bytes_read"] > 0  # neurons really streamed
    assert out["peak_over_baseline"] <= budget, out
