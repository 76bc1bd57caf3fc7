"""Budgeted runs: the plan, exact greedy output under every strategy, peak RSS inside the budget
(measured by the OS in a fresh process), and faults while loaded."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap

import edgeflash as ef
import pytest
from edgeflash.base.errors import ModelFormatError, UserError
from edgeflash.base.sizes import parse_size
from edgeflash.kernels._native import read_pieces
from edgeflash.memory import layout as layout_module
from edgeflash.memory.planner import BudgetError, split_reads
from edgeflash.runtime.native_config import kv_cache_bytes

PROMPT = "The three most useful things to pack for a week of hiking are"


@pytest.fixture(scope="module")
def reference_tokens():
    """Unbudgeted greedy output of each model: what every budgeted run must reproduce."""
    return {alias: ef.load(alias).generate(PROMPT, max_tokens=24).tokens for alias in ("smollm2-135m", "gemma3-270m")}


def test_sizes():
    assert parse_size("96MB") == 96_000_000
    assert parse_size("1.5GiB") == 3 * 2**29
    assert parse_size(4096) == 4096
    for bad in ("lots", "-5MB", "12 parsecs", 0):
        with pytest.raises(UserError, match="memory budget"):
            parse_size(bad)


def test_kv_estimate_matches_engine():
    for alias in ("smollm2-135m", "gemma3-270m"):
        m = ef.load(alias, context_length=1000)
        assert m.engine.stats()["kv_cache_bytes"] == kv_cache_bytes(m.spec, 1000)
        q8 = ef.load(alias, context_length=1000, kv_cache="q8_0")
        assert q8.engine.stats()["kv_cache_bytes"] == kv_cache_bytes(m.spec, 1000, kv_format="q8_0")
        assert q8.engine.stats()["kv_cache_bytes"] < 0.6 * m.engine.stats()["kv_cache_bytes"]


def test_q8_kv_cache_buys_room_under_a_budget():
    """The same budget and context: a q8_0 cache leaves more of the budget to resident weights,
    and the text stays close to the f16 cache's (greedy, first tokens the same)."""
    runs = {kv: ef.load("smollm2-135m", memory_budget="60MB", context_length=1024, kv_cache=kv)
            for kv in ("f16", "q8_0")}
    assert runs["q8_0"].engine.weights.plan.resident_bytes > runs["f16"].engine.weights.plan.resident_bytes
    tokens = {kv: m.generate(PROMPT, max_tokens=8).tokens for kv, m in runs.items()}
    assert tokens["q8_0"][:4] == tokens["f16"][:4]
    with pytest.raises(UserError, match="kv_cache = 'q4'"):
        ef.load("smollm2-135m", kv_cache="q4")


def test_streamed_units_are_split_across_the_io_threads():
    threads, read = split_reads(4 << 20, 1_990_000, 8, cores=2)  # a 1.9 MB layer, 2 cores
    assert threads == 2 and read * threads >= 1_990_000 and read % 4096 == 0
    # A unit a little over two of the device's best reads: still one read per thread, not three.
    assert split_reads(1 << 20, 2_224_128, 8, cores=2) == (2, 1_114_112)
    assert split_reads(1 << 20, 6 << 20, 8, cores=2) == (2, 1 << 20)  # three each, all equal
    assert split_reads(1 << 20, 64 << 20, 8, cores=8) == (8, 1 << 20)  # big units: the device's best read
    assert split_reads(1 << 20, 8192, 4, cores=4)[1] == 64 << 10  # never below 64 KiB
    # Several units in flight: each read whole, one I/O thread per read in flight, up to the depth.
    assert split_reads(4 << 20, 1 << 20, 8, cores=2, units_in_flight=14) == (8, 1 << 20)
    assert split_reads(1 << 20, 3 << 20, 8, cores=2, units_in_flight=2) == (6, 1 << 20)
    assert split_reads(4 << 20, 2 << 20, 8, cores=2, units_in_flight=2) == (2, 2 << 20)
    m = ef.load("smollm2-135m", memory_budget="60MB", context_length=256)
    io, unit = m.engine.weights.plan.io, m.engine.weights.plan.unit_bytes
    pieces = read_pieces(unit, io.chunk_bytes)  # how the reader cuts the largest unit
    # No I/O thread idles while another still reads: with one unit in flight (two slots) every
    # thread gets as many equal pieces; with more, each unit's pieces are all in flight at once.
    even = len(pieces) % io.threads == 0 if io.slots == 2 else len(pieces) <= io.threads
    assert even and max(pieces) - min(pieces) <= 4096, (io, unit, pieces)


def test_streamed_reads_are_split_into_equal_pieces():
    """A request is read in as few pieces as the read size allows, all within a page of each
    other, so no I/O thread finishes long before the others (a 1.47 MB head chunk against 1.1 MB
    reads was one full read and a third of one)."""
    assert read_pieces(1_474_560, 1_110_016) == [737_280, 737_280]
    for n, chunk in [(1_474_560, 1_110_016), (1_499_136, 749_568), (10 * 4096, 4 * 4096), (5000, 4096),
                     (64 << 20, 1 << 20), (3 * 4096 + 1, 8192)]:
        pieces = read_pieces(n, chunk)
        assert sum(pieces) == n and max(pieces) <= chunk, (n, chunk, pieces)
        assert len(pieces) == -(-n // chunk), (n, chunk, pieces)
        assert all(p % 4096 == 0 for p in pieces[:-1]), (n, chunk, pieces)
        assert max(pieces) - min(pieces) <= 4096, (n, chunk, pieces)
    assert read_pieces(0, 4096) == []


def test_spare_budget_deepens_prefetch():
    """Budget no weight group fits in becomes staging slots, so reads run further ahead; never
    past the budget, and none left over that would hold one more slot."""
    from edgeflash.memory.planner import MAX_PREFETCH_SLOTS

    plans = {b: ef.load("gemma3-270m", memory_budget=b, context_length=256).engine.weights.plan for b in ("110MB", "160MB")}
    for plan in plans.values():
        unit = plan.staging_bytes // plan.io.slots
        assert plan.total <= plan.budget
        assert plan.io.slots == MAX_PREFETCH_SLOTS or plan.budget - plan.total < unit
    assert plans["160MB"].io.slots > 3  # the head streams and 50 MB are spare
    assert plans["160MB"].stream_bytes_per_pass <= plans["110MB"].stream_bytes_per_pass


def test_flash_spreads_streamed_layers_through_the_pass(monkeypatch):
    """Flash streams no more bytes than the greedy's choice (the last layers), but spread through
    the pass, starting with the first layer: bunched at the end, they would leave reads idle
    while the resident first layers compute."""
    import edgeflash.memory.planner as planner

    engine = ef.load("smollm2-135m", memory_budget="100MB", context_length=256, strategy="flash").engine
    fixed = {k: v for k, v in engine.weights.plan.fixed.items() if k not in ("runtime_reserve", "pinned_weights")}
    n_layers = engine.spec.n_layers

    def plans(budget: int) -> tuple:
        args = (engine.weights.layout, budget, "flash", fixed)
        io = {"head_chunk_limit": engine.head_chunk, "io_threads": 2, "chunk_bytes": 1 << 20}
        with monkeypatch.context() as m:
            m.setattr(planner, "_spread_streamed", lambda resident, order, groups: set(resident))
            greedy = planner.make_plan(*args, **io)
        return planner.make_plan(*args, **io), greedy

    checked = 0
    for budget in range(60_000_000, 110_000_000, 5_000_000):
        spread, greedy = plans(budget)
        layers = [int(n.split(".")[1]) for n in spread.streamed if n.startswith("layer.")]
        assert spread.stream_bytes_per_pass <= greedy.stream_bytes_per_pass and spread.total <= budget
        if not 3 <= len(layers) < n_layers:
            continue
        checked += 1
        assert layers[0] == 0
        gaps = [b - a for a, b in zip(layers, layers[1:] + [layers[0] + n_layers])]
        assert max(gaps) <= -(-n_layers // len(layers)) + 1, (budget, layers)
    assert checked >= 3


def test_infeasible_budget_is_refused_with_the_minimum():
    with pytest.raises(BudgetError, match=r"at least [0-9.]+ MiB is needed"):
        ef.load("smollm2-135m", memory_budget="20MB")


OPEN_SCRIPT = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    try:
        ef.load(sys.argv[1], memory_budget=sys.argv[2], strategy="naive")
    except ef.UserError as e:
        print(json.dumps({"error": str(e), "minimum": e.minimum_bytes}))
""")


def test_budget_below_the_opening_peak_is_refused():
    """Building the tokenizer peaks far above what it keeps (Gemma 3's GGUF: about 60 MiB while
    opening, 21 MiB kept). A budget the plan alone would accept but that peak exceeds is refused
    with the minimum, and a run at that minimum stays inside it (fresh processes: the peak
    depends on what the process allocated before)."""
    proc = subprocess.run([sys.executable, "-c", OPEN_SCRIPT, "gemma3-270m", "45MiB"], capture_output=True, text=True,
                          timeout=600)
    refusal = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "opening it (tokenizer and metadata)" in refusal["error"], refusal
    assert refusal["minimum"] > parse_size("45MiB")
    out = run_rss("gemma3-270m", refusal["minimum"], strategy="naive", tokens=4)
    assert out["peak_over_baseline"] <= refusal["minimum"]


def test_context_that_does_not_fit_is_refused():
    with pytest.raises(BudgetError, match="kv_cache"):
        ef.load("smollm2-135m", memory_budget="120MB", context_length=8192)


@pytest.mark.parametrize("alias,fraction", [("smollm2-135m", 0.5), ("smollm2-135m", 0.25), ("gemma3-270m", 0.5),
                                            ("gemma3-270m", 0.25)])
@pytest.mark.parametrize("strategy", ["flash", "hybrid", "naive"])
def test_exact_mode_greedy_equals_unbudgeted(alias, fraction, strategy, model_path, reference_tokens):
    size = model_path(alias).stat().st_size
    budget = max(int(size * fraction), 0) + 64 * 2**20  # the model's share plus room for fixed costs
    m = ef.load(alias, memory_budget=budget, context_length=512, strategy=strategy)
    r = m.generate(PROMPT, max_tokens=24)
    assert r.tokens == reference_tokens[alias]
    assert r.stats["flash_bytes_per_token"] > 0  # weights really streamed
    assert r.stats["planned_bytes"] <= budget


@pytest.mark.parametrize("alias", ["smollm2-135m", "gemma3-270m"])
def test_a_model_that_fits_its_budget_runs_from_panels_laid_out_in_place(alias, model_path, reference_tokens):
    """Resident matrices, the tied head among them, are laid out in panels in the buffers they were
    read into (the kernels run a token about 3x faster than from rows), with no copy. The tied
    table's bytes are then panels, so its embedding rows come from flash on demand; a self-drafter
    runs the engine's laid-out layers. Output: the unbudgeted model's."""
    size = model_path(alias).stat().st_size
    m = ef.load(alias, memory_budget=2 * size + 64 * 2**20, context_length=512)
    stats = m.engine.stats()
    assert m.engine.weights.plan.streamed == []  # everything fits
    assert stats["laid_out_bytes"] == 0  # nothing copied
    assert stats["laid_out_in_place_bytes"] > 0.8 * stats["resident_weight_bytes"]
    assert m.spec.tied_embeddings and m.engine.tied_head_in_place
    assert "token_embd.weight" not in m.engine.weights.resident_tensors  # its bytes are no rows any more
    r = m.generate(PROMPT, max_tokens=24)
    assert r.tokens == reference_tokens[alias]
    assert r.stats["flash_bytes_read"] > 0  # the embedding rows, nothing else is read
    assert r.stats["flash_bytes_per_token"] < 64 * 1024
    s = m.generate(PROMPT, max_tokens=24, speculative="self")
    assert s.tokens == reference_tokens[alias]
    assert m._drafters["self"].model.engine.weights.shared is m.engine  # the target's laid-out layers, shared


@pytest.mark.parametrize("alias,budget", [("smollm2-135m", "64MB"), ("gemma3-270m", "80MB")])
@pytest.mark.parametrize("strategy", ["flash", "naive"])
def test_layers_streamed_in_parts_give_the_unbudgeted_output(alias, budget, strategy, reference_tokens, monkeypatch):
    """Layers read part by part (attention, gate, up, down: here even these models' small layers,
    which are otherwise read whole), with prefetch and without: the same tokens."""
    monkeypatch.setattr(layout_module, "MIN_SPLIT_LAYER", 0)
    m = ef.load(alias, memory_budget=budget, context_length=512, strategy=strategy)
    units = [u for u in m.engine.weights._stream_units() if u.layer >= 0]
    assert len(units) > len({u.layer for u in units})  # more than one unit a layer
    assert m.engine.weights.plan.unit_bytes < max(g.nbytes for g in m.engine.weights.layout.groups.values()
                                                   if g.layer is not None)
    assert m.generate(PROMPT, max_tokens=24).tokens == reference_tokens[alias]


RSS_SCRIPT = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    alias, budget, strategy, tokens = sys.argv[1], int(sys.argv[2]), sys.argv[3], int(sys.argv[4])
    reset_peak_rss()
    before = current_rss_bytes()
    m = ef.load(alias, memory_budget=budget, strategy=strategy)
    r = m.generate("Once upon a time", max_tokens=tokens)
    print(json.dumps({"peak_over_baseline": peak_rss_bytes() - before, "generated": r.stats["generated_tokens"],
                      "planned": r.stats["planned_bytes"], "context": m.engine.context_length}))
""")


def run_rss(alias: str, budget: int, strategy: str = "flash", tokens: int = 32) -> dict:
    proc = subprocess.run([sys.executable, "-c", RSS_SCRIPT, alias, str(budget), strategy, str(tokens)],
                          capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("alias,budget", [("smollm2-135m", "70MB"), ("smollm2-135m", "85MB"),
                                          ("gemma3-270m", "96MB"), ("gemma3-270m", "160MB")])
def test_peak_rss_stays_inside_the_budget(alias, budget, model_path):
    b = parse_size(budget)
    out = run_rss(alias, b)
    print(alias, budget, out)
    assert out["generated"] == 32
    assert out["peak_over_baseline"] <= b
    assert b < model_path(alias).stat().st_size  # far below the model: weights really stream


def test_file_truncated_while_loaded(tmp_path, smollm_path):
    copy = tmp_path / "model.gguf"
    shutil.copy(smollm_path, copy)
    m = ef.load(str(copy), memory_budget="80MB", context_length=256)
    m.generate("Hello", max_tokens=2)
    with open(copy, "r+b") as f:
        f.truncate(copy.stat().st_size // 2)
    with pytest.raises(ModelFormatError, match="changed size while loaded|truncated"):
        m.generate("Hello again", max_tokens=2)


def test_file_modified_while_loaded(tmp_path, smollm_path):
    copy = tmp_path / "model.gguf"
    shutil.copy(smollm_path, copy)
    m = ef.load(str(copy), memory_budget="80MB", context_length=256)
    m.generate("Hello", max_tokens=2)
    with open(copy, "r+b") as f:
        f.seek(copy.stat().st_size // 2)
        f.write(b"\xff" * 64)
        f.flush()
        os.fsync(f.fileno())
    with pytest.raises(ModelFormatError, match="modified while loaded"):
        m.generate("Hello again", max_tokens=2)


def test_read_error_while_loaded(tmp_path, smollm_path):
    """A real read error from the kernel: the streaming reader's descriptor is swapped for a
    write-only one on the same file (same size and time, so only the read itself fails)."""
    copy = tmp_path / "model.gguf"
    shutil.copy(smollm_path, copy)
    m = ef.load(str(copy), memory_budget="80MB", context_length=256)
    m.generate("Hello", max_tokens=2)
    fds = [int(fd) for fd in os.listdir("/proc/self/fd")
           if os.path.realpath(f"/proc/self/fd/{fd}") == str(copy.resolve())]
    assert fds, "the budgeted run keeps its weights file open"
    write_only = os.open(copy, os.O_WRONLY)
    try:
        for fd in fds:
            os.dup2(write_only, fd)
        with pytest.raises(ModelFormatError, match="read error at byte"):
            m.generate("Hello again", max_tokens=2)
    finally:
        os.close(write_only)
