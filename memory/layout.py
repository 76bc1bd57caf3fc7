"""Where each weight lives in its file, grouped into the units a budgeted run keeps resident or
streams: per layer an attention group and an FFN group, the embedding table, the head, and the
small global tensors. Ranges are widened to 4 KiB boundaries for direct I/O."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from pathlib import Path

from edgeflash.base.errors import UserError
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor

ALIGN = 4096
_LAYER = re.compile(r"^blk\.(\d+)\.(.+)$")
_ATTENTION = ("attn_norm.", "attn_q", "attn_k", "attn_v", "attn_output.", "post_attention_norm.")
_FFN = ("ffn_norm.", "ffn_gate.", "ffn_up.", "ffn_down.", "post_ffw_norm.")


def align_down(n: int) -> int:
    return n // ALIGN * ALIGN


def align_up(n: int) -> int:
    return -(-n // ALIGN) * ALIGN


@dataclass(frozen=True)
class Location:
    offset: int  # absolute byte offset in the weights file
    nbytes: int


@dataclass
class WeightGroup:
    name: str  # "layer.3.attention", "layer.3.ffn", "embedding", "head", "globals"
    layer: int | None
    tensors: list[str]
    start: int  # 4 KiB-aligned byte range covering the group's tensors in the file
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

    def layer_groups(self, layer: int) -> list[WeightGroup]:
        names = (f"layer.{layer}.attention", f"layer.{layer}.ffn", f"layer.{layer}.predictor", f"layer.{layer}")
        return [self.groups[n] for n in names if n in self.groups]


def _locations(source: ModelSource) -> tuple[Path, dict[str, Location]]:
    if source.kind == "gguf":
        gguf = source.info["gguf"]
        return gguf.path, {n: Location(i.offset, i.nbytes) for n, i in gguf.tensors.items()}
    if source.kind == "bundle":
        bundle = source.info["bundle"]
        return bundle.weights_path, {n: Location(bundle.blocks[e.block].offset + e.offset, e.nbytes)
                                     for n, e in bundle.tensors.items()}
    raise UserError(f"{source.path}: a memory budget needs a GGUF file or an edgeflash bundle "
                    f"(export this {source.kind} model with `edgeflash export`)")


def _group_of(name: str) -> tuple[str, int | None]:
    m = _LAYER.match(name)
    if m:
        layer, rest = int(m.group(1)), m.group(2)
        if rest.startswith(_ATTENTION):
            return f"layer.{layer}.attention", layer
        if rest.startswith(_FFN):
            return f"layer.{layer}.ffn", layer
        if rest.startswith("predictor_"):
            return f"layer.{layer}.predictor", layer
        return "globals", None
    if name == "token_embd.weight":
        return "embedding", None
    if name == "output.weight":
        return "head", None
    return "globals", None


def weight_layout(source: ModelSource) -> WeightLayout:
    path, locations = _locations(source)
    members: dict[str, list[str]] = {}
    layers: dict[str, int | None] = {}
    for name in source.tensors:
        group, layer = _group_of(name)
        members.setdefault(group, []).append(name)
        layers[group] = layer
    # A GGUF file may interleave a layer's attention and FFN tensors: then the layer is one group.
    for layer in sorted({v for v in layers.values() if v is not None}):
        split = [f"layer.{layer}.attention", f"layer.{layer}.ffn"]
        if any(g in members and not _dense(members[g], locations) for g in split):
            members[f"layer.{layer}"] = [n for g in split for n in members.pop(g, [])]
            layers[f"layer.{layer}"] = layer
    rewritten = set(source.info.get("rewritten_tensors", []))
    groups = {}
    for group, names in members.items():
        if group != "globals" and not _dense(names, locations):
            raise UserError(f"{path}: the tensors of {group} are scattered through the file; export a bundle "
                            "with `edgeflash export` to run it under a budget")
        start, end = _span(names, locations)
        groups[group] = WeightGroup(group, layers[group], sorted(names), start, end,
                                    pinned=sorted(n for n in names if n in rewritten))
    return WeightLayout(path, locations, groups)


def _span(names: list[str], locations: dict[str, Location]) -> tuple[int, int]:
    return (align_down(min(locations[n].offset for n in names)),
            align_up(max(locations[n].offset + locations[n].nbytes for n in names)))


def _dense(names: list[str], locations: dict[str, Location]) -> bool:
    """True when the group's byte range holds little besides its own tensors."""
    start, end = _span(names, locations)
    return end - start <= 1.5 * sum(locations[n].nbytes for n in names) + 2 * ALIGN


def tensor_view_of(tensor: Tensor, buffer, offset: int) -> Tensor:
    """The same tensor, its bytes taken from `buffer[offset:]` (a resident copy read from flash)."""
    raw = buffer[offset:offset + tensor.nbytes].reshape(tensor.raw.shape)
    return Tensor(tensor.name, tensor.fmt, tensor.shape, raw)
