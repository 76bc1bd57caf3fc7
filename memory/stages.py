"""A streamed layer's read units. Hybrid and naive read a layer's streamed groups as one unit;
flash cuts them by the stage of the block that uses them (q/k/v, attention output, gate, up,
down: engine::Stage), so a unit is a few hundred KiB instead of a few MiB and the same staging
memory holds several more reads in flight. Each stage's weights arrive before the engine needs
them and the arithmetic is unchanged, so exact mode's output is too."""

from __future__ import annotations

from dataclasses import dataclass

from edgeflash.memory.layout import WeightGroup, WeightLayout, align_down, align_up

# canonical suffix -> the engine's name for a layer tensor
LAYER_TARGETS = {
    "attn_q.weight": "q", "attn_k.weight": "k", "attn_v.weight": "v", "attn_output.weight": "o",
    "ffn_gate.weight": "gate", "ffn_up.weight": "up", "ffn_down.weight": "down",
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "ffn_norm", "post_attention_norm.weight": "post_attn_norm",
    "post_ffw_norm.weight": "post_ffn_norm", "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "attn_q.bias": "q_bias", "attn_k.bias": "k_bias", "attn_v.bias": "v_bias",
    "predictor_a.weight": "pred_a", "predictor_b.weight": "pred_b",
}

# engine::Stage of each target: the stage that uses it (memory/native/streaming.cpp, stage_of)
QKV, ATTN_OUT, GATE, UP, DOWN = range(5)
WHOLE_LAYER = (QKV, DOWN)
STAGE_OF = {"o": ATTN_OUT, "post_attn_norm": ATTN_OUT, "gate": GATE, "ffn_norm": GATE, "pred_a": GATE,
            "pred_b": GATE, "up": UP, "down": DOWN, "post_ffn_norm": DOWN}  # the rest: QKV


def target_of(tensor: str) -> str:
    return LAYER_TARGETS[tensor.split(".", 2)[2]]


@dataclass
class LayerUnit:
    layer: int
    stages: tuple[int, int]  # first and last engine stage it covers
    tensors: list[str]  # the tensors it delivers (a pinned tensor stays resident)
    ranges: list[tuple[int, int]]  # (file offset, bytes), 4 KiB aligned; they land back to back

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.ranges)


def layer_units(layout: WeightLayout, layer: int, groups: list[WeightGroup], by_stage: bool) -> list[LayerUnit]:
    """The read units of one layer's streamed `groups`, in the order a pass uses them."""
    if not groups:
        return []
    tensors = [t for g in groups for t in g.tensors if t not in g.pinned]
    if not by_stage:
        return [LayerUnit(layer, WHOLE_LAYER, tensors, group_ranges(groups))]
    stages: dict[int, list[str]] = {}
    for t in tensors:
        stages.setdefault(STAGE_OF.get(target_of(t), QKV), []).append(t)
    units = [LayerUnit(layer, (s, s), names, _spans(layout, names)) for s, names in sorted(stages.items())]
    # Neighbouring stages that together are no larger than the largest one share a unit (SmolLM2's
    # q/k/v and attention output): fewer reads, and no slot grows.
    largest = max(u.nbytes for u in units)
    merged = [units[0]]
    for u in units[1:]:
        last = merged[-1]
        names = last.tensors + u.tensors
        ranges = _spans(layout, names)
        if sum(n for _, n in ranges) <= largest:
            merged[-1] = LayerUnit(layer, (last.stages[0], u.stages[1]), names, ranges)
        else:
            merged.append(u)
    return merged


def group_ranges(groups: list[WeightGroup]) -> list[tuple[int, int]]:
    """Byte ranges of the groups, merged when adjacent (one read instead of two)."""
    ranges: list[tuple[int, int]] = []
    for g in sorted(groups, key=lambda g: g.start):
        if ranges and ranges[-1][0] + ranges[-1][1] == g.start:
            ranges[-1] = (ranges[-1][0], ranges[-1][1] + g.nbytes)
        else:
            ranges.append((g.start, g.nbytes))
    return ranges


def _spans(layout: WeightLayout, names: list[str]) -> list[tuple[int, int]]:
    """The 4 KiB pages holding these tensors, as few ranges as possible. Tensors of different
    stages can share a page at their border: both units read it (one page each)."""
    spans = sorted((align_down(layout.locations[n].offset),
                    align_up(layout.locations[n].offset + layout.locations[n].nbytes)) for n in names)
    ranges: list[list[int]] = []
    for start, end in spans:
        if ranges and start <= ranges[-1][1]:
            ranges[-1][1] = max(ranges[-1][1], end)
        else:
            ranges.append([start, end])
    return [(s, e - s) for s, e in ranges]
