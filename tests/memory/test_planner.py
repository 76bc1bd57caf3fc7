"""The planner on synthetic weight layouts: no model is loaded, so these run in milliseconds and
pin down the planner's rules (the tests in test_budget.py check real runs against real RSS)."""

from __future__ import annotations

from pathlib import Path

import pytest
from edgeflash.memory.layout import ALIGN, LAYER_PARTS, Location, build_layout, group_of_tensor, layer_units
from edgeflash.memory.planner import STRATEGIES, BudgetError, make_plan

MiB = 2**20
FIXED = {"kv_cache": 2 * MiB, "activations": 1 * MiB}


def synthetic_layout(n_layers: int = 8, attention: int = 1 * MiB, ffn: int = 3 * MiB, vocab: int = 32000,
                     row_bytes: int = 288, tied: bool = True, interleave: bool = False):
    """A file with an embedding table, per layer an attention and an FFN group, a final norm and
    (untied) a head, laid out in execution order like a bundle."""
    locations: dict[str, Location] = {}
    at = 0

    def put(name: str, nbytes: int) -> None:
        nonlocal at
        locations[name] = Location(at, nbytes)
        at += -(-nbytes // ALIGN) * ALIGN

    put("token_embd.weight", vocab * row_bytes)
    for i in range(n_layers):
        attn = [(f"blk.{i}.attn_norm.weight", 4096), (f"blk.{i}.attn_q.weight", attention - 4096)]
        mlp = [(f"blk.{i}.ffn_norm.weight", 4096), (f"blk.{i}.ffn_up.weight", ffn - 4096)]
        order = [attn[0], mlp[1], attn[1], mlp[0]] if interleave else attn + mlp
        for name, nbytes in order:
            put(name, nbytes)
    put("output_norm.weight", 4096)
    if not tied:
        put("output.weight", vocab * row_bytes)
    return build_layout(Path("weights.bin"), locations, n_layers=n_layers, head_rows=vocab)


def plan(layout, budget: int, strategy: str = "flash", **kw):
    return make_plan(layout, budget, strategy, dict(FIXED), head_chunk_limit=4096, io_threads=2,
                     chunk_bytes=1 * MiB, **kw)


def test_groups_follow_the_one_naming_rule():
    layout = synthetic_layout(n_layers=2)
    assert set(layout.groups) == {"embedding", "layer.0.attention", "layer.0.ffn", "layer.1.attention", "layer.1.ffn",
                                  "globals"}
    for group in layout.groups.values():
        assert all(group_of_tensor(t) == group.name for t in group.tensors)
        assert group.start % ALIGN == 0 and group.end % ALIGN == 0


def test_interleaved_layers_become_one_group():
    layout = synthetic_layout(n_layers=2, interleave=True)
    assert "layer.0" in layout.groups and "layer.0.ffn" not in layout.groups
    assert [g.name for g in layout.layer_groups(1)] == ["layer.1"]


def gguf_ordered_layout(n_layers: int = 4, attention: int = 2 * MiB, gate_up: int = 8 * MiB, down: int = 5 * MiB):
    """Layers in the order llama.cpp writes a file: attn_norm, ffn_down, ffn_gate, ffn_up, ffn_norm,
    then the attention matrices; each layer is then one group."""
    locations: dict[str, Location] = {}
    at = 0
    for i in range(n_layers):
        for name, nbytes in [("attn_norm.weight", 6144), ("ffn_down.weight", down), ("ffn_gate.weight", gate_up // 2),
                             ("ffn_up.weight", gate_up // 2), ("ffn_norm.weight", 6144),
                             ("attn_q.weight", attention // 2), ("attn_output.weight", attention // 2)]:
            locations[f"blk.{i}.{name}"] = Location(at, nbytes)
            at += nbytes  # packed like GGUF: tensors share pages at their ends
    locations["token_embd.weight"] = Location(at, 1000 * 288)
    return build_layout(Path("weights.gguf"), locations, n_layers=n_layers, head_rows=1000)


def test_a_streamed_layer_is_read_in_the_parts_the_block_reads_in_turn():
    layout = gguf_ordered_layout()
    groups = layout.layer_groups(1)
    assert [g.name for g in groups] == ["layer.1"]
    units = layer_units(layout, groups)
    assert [tuple(LAYER_PARTS[p] for p in u.parts) for u in units] == \
        [("attention", "attention"), ("ffn_in", "ffn_in"), ("ffn_up", "ffn_up"), ("ffn_out", "ffn_out")]
    assert len(units[0].ranges) == 2  # attn_norm and the attention matrices lie apart in the file
    assert sorted(n for u in units for n in u.tensors) == sorted(groups[0].tensors)
    for u in units:
        assert all(start % ALIGN == 0 and n % ALIGN == 0 for start, n in u.ranges)
        for name in u.tensors:
            at = u.slot_offset(name, layout.locations)
            assert at + layout.locations[name].nbytes <= u.nbytes
    # The staging slots hold the largest part, not the layer.
    p = plan(layout, 25 * MiB)
    assert not any(n.startswith("layer.") for n in p.resident)
    assert p.unit_bytes == units[3].nbytes == max(u.nbytes for u in units) < groups[0].nbytes / 2


def test_small_parts_share_a_unit_up_to_the_largest_part():
    layout = gguf_ordered_layout(attention=1 * MiB, gate_up=2 * MiB, down=6 * MiB)
    units = layer_units(layout, layout.layer_groups(0))
    assert [u.parts for u in units] == [(0, 2), (3, 3)]
    assert len(units[0].ranges) == 2 and max(u.nbytes for u in units) == units[1].nbytes
    # A small layer is read whole: its parts would be reads too small to pay for their hand-offs.
    small = gguf_ordered_layout(attention=1 * MiB, gate_up=2 * MiB, down=2 * MiB)
    units = layer_units(small, small.layer_groups(0))
    assert [u.parts for u in units] == [(0, len(LAYER_PARTS) - 1)] and len(units[0].ranges) == 1


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_refusal_names_a_minimum_that_plans(strategy):
    layout = synthetic_layout()
    with pytest.raises(BudgetError) as refused:
        plan(layout, 4 * MiB, strategy)
    minimum = refused.value.minimum_bytes
    assert minimum > 4 * MiB and "raise --memory-budget" in str(refused.value)
    assert plan(layout, minimum, strategy).total <= minimum
    with pytest.raises(BudgetError):
        plan(layout, minimum - 1, strategy)


@pytest.mark.parametrize("strategy", STRATEGIES)
def test_plans_stay_inside_the_budget_and_stream_less_with_more_of_it(strategy):
    layout = synthetic_layout(tied=False)
    streamed = []
    for budget in range(30 * MiB, 70 * MiB, 2 * MiB):
        p = plan(layout, budget, strategy)
        assert p.total <= budget
        assert set(p.resident).isdisjoint(p.streamed)
        assert set(p.resident) | set(p.streamed) == {g for g in layout.groups if g != "globals"}
        streamed.append(p.stream_bytes_per_pass)
    if strategy != "naive":
        assert streamed == sorted(streamed, reverse=True) and streamed[-1] < streamed[0]


def test_hybrid_keeps_a_prefix_of_the_execution_order():
    layout = synthetic_layout(tied=False)
    p = plan(layout, 40 * MiB, "hybrid")
    layers = [g for g in p.resident if g.startswith("layer.")]
    order = [g.name for i in range(layout.n_layers) for g in layout.layer_groups(i)]
    assert layers == order[:len(layers)] and 0 < len(layers) < len(order)


def test_naive_keeps_no_layer_resident():
    p = plan(synthetic_layout(), 200 * MiB, "naive")
    assert not [g for g in p.resident if g.startswith("layer.")]
    assert not p.io.prefetch and p.io.slots == 1


def test_flash_spreads_the_streamed_ffn_groups_through_the_pass():
    layout = synthetic_layout(n_layers=8)
    p = plan(layout, 36 * MiB)
    layers = sorted(int(g.split(".")[1]) for g in p.streamed if g.endswith(".ffn"))
    assert 0 < len(layers) < 8
    assert layers[0] == 0  # the first streamed unit starts the pass
    gaps = [b - a for a, b in zip(layers, layers[1:])]
    assert max(gaps) - min(gaps, default=0) <= 1  # evenly spread, not bunched at the end


def test_flash_prefetches_with_at_least_two_slots():
    p = plan(synthetic_layout(), 36 * MiB)
    assert p.io.prefetch and p.io.slots >= 2
    assert p.staging_bytes >= p.io.slots * p.unit_bytes


def test_everything_resident_when_it_fits():
    p = plan(synthetic_layout(), 1 << 30)
    assert p.streamed == [] and p.stream_bytes_per_pass == 0 and p.head_chunk_rows == 0


def test_skipped_groups_are_neither_kept_nor_streamed():
    layout = synthetic_layout()
    skip = frozenset(f"layer.{i}.ffn" for i in range(layout.n_layers))
    p = plan(layout, 30 * MiB, skip=skip)
    assert skip.isdisjoint(p.resident) and skip.isdisjoint(p.streamed)


def test_an_untied_embedding_is_the_last_group_kept():
    """Its rows are read on demand, one page per token: streaming it costs nothing per pass,
    streaming a head of the same size costs all of it."""
    layout = synthetic_layout(tied=False)
    p = plan(layout, 56 * MiB)
    assert p.streamed == ["embedding"] and p.stream_bytes_per_pass == 0


def test_a_streamed_head_is_read_in_chunks_the_engine_can_take():
    layout = synthetic_layout(tied=False, vocab=64000)
    p = plan(layout, 25 * MiB)
    assert "head" in p.streamed
    assert 0 < p.head_chunk_rows <= 4096
    # a chunk's aligned span fits a staging slot
    assert p.head_chunk_rows * 288 + 2 * ALIGN <= p.unit_bytes


def test_an_approximate_head_leaves_the_full_head_out():
    p = plan(synthetic_layout(tied=False), 1 << 30, full_head=False)
    assert "head" not in p.resident and "head" not in p.streamed
