"""A bundle stores each layer's FFN once, as its neuron arena, and every reader gets the same FFN
from it: the native engine's dense path (the sparse kernel over every neuron, in place), the
numpy reference (dense matrices read out of the arena), and a budgeted run that streams the
arena from flash."""

from __future__ import annotations

import edgeflash as ef
import numpy as np
from edgeflash import kernels
from edgeflash.runtime.bundle import load_bundle
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.reference import ReferenceEngine

PROMPT = "To be, or not to be, that is the question"
# The engine's arena FFN meets its 4-bit gate and up rows with Q8 activations (ggml's kernels);
# the reference multiplies in float32. Measured up to 3.2% of each step's logit range on the tiny
# random model (its large random weights amplify rounding); greedy tokens agree.
REL_TOL = 0.05


def test_bundle_has_no_dense_ffn(tiny_bundle_dir):
    source = load_bundle(tiny_bundle_dir)
    b = source.info["bundle"]
    for layer in range(source.spec.n_layers):
        block = b.blocks[f"layer.{layer}.ffn"]
        assert block.arena is not None and set(block.tensors) == {f"blk.{layer}.ffn_norm.weight"}
        assert f"layer.{layer}.neurons" not in b.blocks
        for part in ("gate", "up", "down"):
            assert f"blk.{layer}.ffn_{part}.weight" not in source.tensors
    assert source.info["manifest"]["format_version"] == 3


def test_the_arena_read_both_ways_gives_the_same_logits(tiny_bundle_dir):
    source = load_bundle(tiny_bundle_dir)
    ids = source.tokenizer.encode(PROMPT)
    native = NativeEngine(source, context_length=128)
    ref = ReferenceEngine(source, kv_dtype="f16")
    a = native.forward(ids, all_logits=True)
    b = ref.forward(ids, all_logits=True)
    assert np.abs(a - b).max() <= REL_TOL * float(np.abs(b).max())
    for _ in range(8):  # greedy decoding through both
        t = int(np.argmax(a[-1]))
        assert t == int(np.argmax(b[-1]))
        a, b = native.forward([t]), ref.forward([t])
        assert np.abs(a - b).max() <= REL_TOL * float(np.abs(b).max())


def test_the_sparse_kernel_over_every_neuron_is_the_dense_ffn(tiny_bundle_dir):
    source = load_bundle(tiny_bundle_dir)
    spec = source.spec
    x = np.random.default_rng(0).standard_normal((5, spec.d_model)).astype(np.float32)
    for layer in range(spec.n_layers):
        arena = source.tensors[f"blk.{layer}.ffn_arena"]
        gate, up = (arena.dense(f"ffn_{p}.weight").dequantize() for p in ("gate", "up"))  # [d_ff, d_model]
        down = arena.dense("ffn_down.weight").dequantize()  # [d_model, d_ff]
        g = x @ gate.T
        expected = (g / (1 + np.exp(-g)) * (x @ up.T)) @ down.T
        got = kernels.ffn_sparse(np.ascontiguousarray(arena.raw), x, np.arange(spec.d_ff), d_model=spec.d_model,
                                 gate_fmt=arena.fmt, up_fmt=arena.fmt, down_fmt=arena.down_fmt, act="silu")
        assert np.abs(got - expected).max() < 0.02 * np.abs(expected).max()


def test_streamed_arenas_give_exactly_the_resident_logits(tiny_bundle_dir):
    """Exact mode under a budget streams each layer's FFN block (its norms and arena) from flash."""
    from edgeflash.memory.planner import BudgetError

    full = ef.load(tiny_bundle_dir, context_length=128)
    ids = full.encode(PROMPT)
    expected = full.engine.forward(ids, all_logits=True)
    budget = 4 << 20
    while True:
        try:
            small = ef.load(tiny_bundle_dir, memory_budget=budget, context_length=128, strategy="naive")
            break
        except BudgetError as e:
            budget = (e.minimum_bytes or budget) + (256 << 10)
    plan = small.engine.weights.plan
    assert [g for g in plan.streamed if g.endswith(".ffn")], plan.describe()
    got = small.engine.forward(ids, all_logits=True)
    if rows_match_panels():
        assert np.array_equal(got, expected)
    else:  # float rounding only: well below the logits' spread, and the same greedy tokens
        assert np.abs(got - expected).max() < 1e-3 * np.abs(expected).max()
        assert np.array_equal(got.argmax(-1), expected.argmax(-1))


def rows_match_panels() -> bool:
    """Whether this CPU's kernel level computes a quantized product from rows (how a streamed arena
    is read) to the same bits as from panels (how a resident one is laid out). AVX-512 does: it
    moves 16 rows into lanes as the panel layout stores them. AVX2 and NEON sum each row across
    lanes instead, a different order of float additions."""
    rng = np.random.default_rng(3)
    w = kernels.quantize(rng.standard_normal((64, 256)).astype(np.float32), "q4_0")
    x = rng.standard_normal((3, 256)).astype(np.float32)
    return np.array_equal(kernels.matmul(w, "q4_0", x),
                          kernels.matmul_panels(kernels.pack_panels(w, "q4_0", 256), "q4_0", 64, 256, x))
