"""Where each weight lives in its file, grouped into the units a budgeted run keeps resident or
streams: per layer an attention group, an FFN group and (sparse mode) a predictor group, the
embedding table, the head, and the small global tensors. Ranges are widened to the direct-I/O
alignment. The same rule names the blocks of a bundle (edgeflash.runtime.bundle.layout), so a
bundle's blocks are exactly these groups.

A streamed layer is read in smaller units than its groups (`layer_units`): by the part of the
block that reads each tensor, so that a staging slot holds a part, not a layer.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from edgeflash.base.errors import UserError
from edgeflash.kernels import _native

ALIGN = _native.IO_ALIGNMENT  # direct-I/O granularity: every streamed range starts and ends on it
LAYER_PARTS: tuple[str, ...] = _native.LAYER_PARTS  # the parts of a block, in the order it reads them
_PART_OF_TENSOR = dict(_native.layer_slot_parts())  # "ffn_down.weight" -> its index in LAYER_PARTS
# A streamed layer no larger than this is read whole: its parts would be small reads whose extra
# hand-offs cost more time than the little staging they save is worth (Gemma 3 270M at 25%, 3.8 MiB
# layers: 4.9-5.8 tok/s in 1.1 MiB parts against 9.3 whole; Qwen2.5-Coder-0.5B's 10.4 MiB layers in
# 3.4 MiB parts: 5.9-6.1 against 5.5-5.9 whole).
MIN_SPLIT_LAYER = 8 * 2**20
_LAYER_TENSOR = re.compile(r"^blk\.(\d+)\.(.+)$")
_LAYER_GROUP = re.compile(r"^layer\.(\d+)(\..+)?$")
PREDICTOR_TENSORS = ("predictor_a.weight", "predictor_b.weight")


def align_down(n: int) -> int:
    return n // ALIGN * ALIGN


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


def group_name(kind: str, layer: int | None = None) -> str:
    return f"layer.{layer}.{kind}" if layer is not None else kind


def group_of_tensor(name: str) -> str:
    """The group a canonical tensor name belongs to.

    Per-layer tensors whose name mentions the FFN (`ffn_*`, Gemma's `post_ffw_norm`) go to the
    layer's ffn group; the low-rank neuron predictors to its predictor group; every other
    per-layer tensor (norms, q/k/v/o, q/k norms, biases) to its attention group."""
    if name == "token_embd.weight":
        return "embedding"
    if name == "output.weight":
        return "head"
    m = _LAYER_TENSOR.match(name)
    if not m:
        return "globals"
    layer, rest = int(m.group(1)), m.group(2)
    if rest in PREDICTOR_TENSORS:
        return group_name("predictor", layer)
    if rest.startswith(("ffn_", "post_ffw")):
        return group_name("ffn", layer)
    return group_name("attention", layer)


def block_position(name: str) -> tuple[int, int] | None:
    """(layer, index of the part of the block that reads it) of a per-layer tensor; None for any
    other tensor."""
    m = _LAYER_TENSOR.match(name)
    return (int(m.group(1)), _PART_OF_TENSOR.get(m.group(2), 0)) if m else None


def layer_of_group(name: str) -> int | None:
    m = _LAYER_GROUP.match(name)
    return int(m.group(1)) if m else None


@dataclass(frozen=True)
class Location:
    offset: int  # absolute byte offset in the weights file
    nbytes: int


@dataclass
class WeightGroup:
    name: str  # "layer.3.attention", "layer.3.ffn", "layer.3" (both), "embedding", "head", "globals"
    layer: int | None
    tensors: list[str]
    start: int  # aligned byte range covering the group's tensors in the file
    end: int
    pinned: list[str] = field(default_factory=list)  # tensors that must stay resident (bytes differ from the file)

    @property
    def nbytes(self) -> int:
        return self.end - self.start


@dataclass
class WeightLayout:
    path: Path  # the file every location refers to
    locations: dict[str, Location]
    groups: dict[str, WeightGroup]
    n_layers: int
    head_rows: int  # rows of the output head (the vocabulary)

    def layer_groups(self, layer: int) -> list[WeightGroup]:
        names = (f"layer.{layer}.attention", f"layer.{layer}.ffn", f"layer.{layer}.predictor", f"layer.{layer}")
        return [self.groups[n] for n in names if n in self.groups]


def build_layout(path: Path, locations: dict[str, Location], *, n_layers: int, head_rows: int,
                 pinned: frozenset[str] = frozenset()) -> WeightLayout:
    """Group the tensors at `locations` (every tensor of the model, in `path`). `pinned`: tensors
    whose bytes in memory differ from the file (rewritten at load), which never stream."""
    members: dict[str, list[str]] = {}
    for name in locations:
        members.setdefault(group_of_tensor(name), []).append(name)
    # A GGUF file may interleave a layer's attention and FFN tensors: then the layer is one group.
    for layer in sorted({layer_of_group(g) for g in members} - {None}):
        split = [group_name("attention", layer), group_name("ffn", layer)]
        if any(g in members and not _dense(members[g], locations) for g in split):
            members[f"layer.{layer}"] = [n for g in split for n in members.pop(g, [])]
    groups = {}
    for group, names in members.items():
        if group != "globals" and not _dense(names, locations):
            raise UserError(f"{path}: the tensors of {group} are scattered through the file; export a bundle "
                            "with `edgeflash export` to run it under a budget")
        start, end = _span(names, locations)
        groups[group] = WeightGroup(group, layer_of_group(group), sorted(names), start, end,
                                    pinned=sorted(n for n in names if n in pinned))
    return WeightLayout(path, locations, groups, n_layers, head_rows)


def _span(names: list[str], locations: dict[str, Location]) -> tuple[int, int]:
    return (align_down(min(locations[n].offset for n in names)),
            align_up(max(locations[n].offset + locations[n].nbytes for n in names)))


def _dense(names: list[str], locations: dict[str, Location]) -> bool:
    """True when the group's byte range holds little besides its own tensors."""
    start, end = _span(names, locations)
    return end - start <= 1.5 * sum(locations[n].nbytes for n in names) + 2 * ALIGN


@dataclass
class LayerUnit:
    """What one staging slot receives for a layer: the tensors of parts `parts` (first, last
    indices into LAYER_PARTS), read as `ranges` (file offset, bytes) landing back to back."""
    layer: int
    parts: tuple[int, int]
    tensors: list[str]
    ranges: list[tuple[int, int]]

    @property
    def nbytes(self) -> int:
        return sum(n for _, n in self.ranges)

    def slot_offset(self, name: str, locations: dict[str, Location]) -> int:
        """Where tensor `name` lands in the slot."""
        offset, at = locations[name].offset, 0
        for start, n in self.ranges:
            if start <= offset < start + n:
                return at + offset - start
            at += n
        raise ValueError(f"{name} is outside its unit's ranges")


def layer_units(layout: WeightLayout, groups: list[WeightGroup], whole_below: int | None = None) -> list[LayerUnit]:
    """A layer's streamed groups as read units, in the order the block reads them.

    Tensors go by the part of the block that reads them (attention, the FFN's norm and gate, its
    up matrix, its down side); consecutive parts share a unit while it stays within the layer's
    largest part, so the staging slots hold the largest part instead of the whole layer
    (Qwen2.5-Coder-1.5B's Q4_K_M layer: 10.8 of 28.6 MiB), and every read still lands whole before
    compute needs it. A layer of at most `whole_below` bytes (None: MIN_SPLIT_LAYER) is one unit
    (0: parts always, as in a borrowed arena, where smaller units pack closer). A part's tensors
    are read as their page-aligned spans, merged where they touch."""
    names = [n for g in groups for n in g.tensors if n not in g.pinned]
    if not names:
        return []
    layer = groups[0].layer
    by_part: dict[int, list[str]] = {}
    for name in names:
        position = block_position(name)
        by_part.setdefault(position[1] if position else 0, []).append(name)
    parts = [(p, by_part[p], _spans(by_part[p], layout.locations)) for p in sorted(by_part)]
    sizes = [sum(n for _, n in ranges) for _, _, ranges in parts]
    largest = max(sizes) if sum(sizes) > (MIN_SPLIT_LAYER if whole_below is None else whole_below) else sum(sizes)
    units: list[LayerUnit] = []
    for p, tensors, ranges in parts:
        last = units[-1] if units else None
        merged = last and _merge_ranges(last.ranges + ranges)
        if last and sum(n for _, n in merged) <= largest:
            units[-1] = LayerUnit(layer, (last.parts[0], p), last.tensors + tensors, merged)
        else:
            units.append(LayerUnit(layer, (p, p), tensors, ranges))
    return units


def _spans(names: list[str], locations: dict[str, Location]) -> list[tuple[int, int]]:
    """Each tensor's aligned (offset, bytes), merged where they touch."""
    return _merge_ranges([(start, end - start) for start, end in (_span([n], locations) for n in names)])


def _merge_ranges(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """(offset, bytes) ranges sorted, overlapping or touching ones merged."""
    out: list[tuple[int, int]] = []
    for start, n in sorted(ranges):
        if out and start <= out[-1][0] + out[-1][1]:
            end = max(out[-1][0] + out[-1][1], start + n)
            out[-1] = (out[-1][0], end - out[-1][0])
        else:
            out.append((start, n))
    return out
