"""Which part of a model each rank holds under tensor parallelism, and the tensors of that part.

Rank k of N holds, in every layer, query heads [k*H/N, (k+1)*H/N), the KV heads they read (GQA
groups stay whole; with fewer KV heads than ranks, a KV head is held by every rank of its group), FFN neurons [k*F/N, (k+1)*F/N), and rows [v0, v1) of the embedding and the
head (the vocabulary split as evenly as it goes). Its q/k/v rows, o-projection columns, gate/up
rows and down-projection columns are those of its heads and neurons; norms are whole on every
rank. Each rank's attention and FFN then give a partial sum of the residual update, completed by
an all-reduce (two per layer), and its logits cover its own vocabulary rows.

A rank's part is a model of the same family with H/N heads, its KV heads and F/N neurons (its
spec, `rank_spec`), plus the vocabulary rows it holds (`Shard.vocab`).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.kernels.formats import get_format
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor

_LAYER = re.compile(r"^blk\.\d+\.(.+)$")
# Per-layer tensors and how a rank's part is cut: by rows or columns, of heads, KV heads or neurons.
CUTS: dict[str, tuple[str, str]] = {
    "attn_q.weight": ("rows", "heads"), "attn_q.bias": ("rows", "heads"),
    "attn_k.weight": ("rows", "kv_heads"), "attn_k.bias": ("rows", "kv_heads"),
    "attn_v.weight": ("rows", "kv_heads"), "attn_v.bias": ("rows", "kv_heads"),
    "attn_output.weight": ("cols", "heads"),
    "ffn_gate.weight": ("rows", "neurons"), "ffn_up.weight": ("rows", "neurons"),
    "ffn_down.weight": ("cols", "neurons"),
}
# Converted for every rank count (1 included) when cut by columns: blocks of 256 values rarely
# divide a rank's columns (Qwen2.5-1.5B: 8960 / 2 = 4480). q8_0 keeps 32-value blocks.
COLUMN_FORMAT = "q8_0"


@dataclass(frozen=True)
class Shard:
    rank: int
    ranks: int
    heads: tuple[int, int]  # query heads [begin, end)
    kv_heads: tuple[int, int]
    neurons: tuple[int, int]
    vocab: tuple[int, int]  # embedding and head rows

    def to_dict(self) -> dict[str, Any]:
        return {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()}

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Shard:
        return cls(rank=int(d["rank"]), ranks=int(d["ranks"]), heads=tuple(d["heads"]), kv_heads=tuple(d["kv_heads"]),
                   neurons=tuple(d["neurons"]), vocab=tuple(d["vocab"]))


def plan_shards(spec: ModelSpec, ranks: int, where: str = "model") -> list[Shard]:
    """Every rank's part, or a UserError saying which count does not divide.

    With fewer KV heads than ranks (Qwen2.5-1.5B: 2 KV heads on 4 ranks), each KV head is held by
    ranks / KV ranks, each with the query heads of its group: its keys and values are computed
    on each of them (a little more reading and compute, no more communication)."""
    if ranks < 1:
        raise UserError(f"ranks = {ranks}: expected an integer >= 1")
    kv = spec.n_kv_heads
    fits = spec.n_heads % ranks == 0 and spec.d_ff % ranks == 0 and (kv % ranks == 0 or ranks % kv == 0)
    if not fits:
        raise UserError(f"{where}: {spec.n_heads} query heads, {kv} KV heads and {spec.d_ff} FFN neurons do not "
                        f"split over {ranks} ranks; use a rank count that divides {spec.n_heads} and {spec.d_ff} "
                        f"and divides or is a multiple of {kv}")
    h, f, v = spec.n_heads // ranks, spec.d_ff // ranks, spec.vocab_size
    shards = []
    for k in range(ranks):
        kv_range = (k * kv // ranks, (k + 1) * kv // ranks) if kv % ranks == 0 else \
            (k // (ranks // kv), k // (ranks // kv) + 1)
        shards.append(Shard(rank=k, ranks=ranks, heads=(k * h, (k + 1) * h), kv_heads=kv_range,
                            neurons=(k * f, (k + 1) * f), vocab=(k * v // ranks, (k + 1) * v // ranks)))
    return shards


def rank_spec(spec: ModelSpec, shard: Shard) -> ModelSpec:
    """The spec of a rank's part: its heads and neurons (head size, attention scale and the whole
    vocabulary unchanged)."""
    return dataclasses.replace(spec, n_heads=shard.heads[1] - shard.heads[0],
                               n_kv_heads=shard.kv_heads[1] - shard.kv_heads[0],
                               d_ff=shard.neurons[1] - shard.neurons[0], attn_scale=spec.attn_scale)


def cut_tensor(t: Tensor, spec: ModelSpec, shard: Shard) -> Tensor:
    """This rank's part of tensor `t` (a canonical name: token_embd.weight, blk.N.attn_q.weight ...)."""
    if t.name in ("token_embd.weight", "output.weight"):
        return _rows(t, *shard.vocab)
    m = _LAYER.match(t.name)
    if not m or m.group(1) not in CUTS:
        return t  # norms and other whole tensors
    axis, unit = CUTS[m.group(1)]
    size = {"heads": spec.head_dim, "kv_heads": spec.head_dim, "neurons": 1}[unit]
    begin, end = (i * size for i in getattr(shard, unit))
    return _rows(t, begin, end) if axis == "rows" else _cols(t, begin, end)


def column_format(t: Tensor) -> str:
    """The format a column-cut tensor is stored in: its own when its blocks are 32 values or fewer
    (they divide any rank's columns here), else COLUMN_FORMAT."""
    fmt = get_format(t.fmt)
    return t.fmt if fmt.block_elems <= 32 and not fmt.row_header else COLUMN_FORMAT


def is_column_cut(name: str) -> bool:
    m = _LAYER.match(name)
    return bool(m) and CUTS.get(m.group(1), ("", ""))[0] == "cols"


def _rows(t: Tensor, begin: int, end: int) -> Tensor:
    if len(t.shape) == 1:  # a bias: values
        raw = np.asarray(t.raw).reshape(-1)
        per = raw.nbytes // t.cols
        return Tensor(t.name, t.fmt, (end - begin,), raw[begin * per:end * per].reshape(1, -1))
    raw = np.asarray(t.raw).reshape(t.rows, -1)
    return Tensor(t.name, t.fmt, (end - begin, *t.shape[1:]), raw[begin:end])


def _cols(t: Tensor, begin: int, end: int) -> Tensor:
    fmt = get_format(t.fmt)
    if begin % fmt.block_elems or end % fmt.block_elems or fmt.row_header:
        raise UserError(f"{t.name}: columns {begin}..{end} do not fall on {t.fmt} block boundaries "
                        f"({fmt.block_elems} values)")
    raw = np.asarray(t.raw).reshape(t.rows, -1)
    b0, b1 = begin // fmt.block_elems * fmt.block_bytes, end // fmt.block_elems * fmt.block_bytes
    return Tensor(t.name, t.fmt, (t.rows, end - begin), raw[:, b0:b1])


def shard_of(source: Any) -> Shard | None:
    """The part of a split model a per-rank bundle holds (None for any other model)."""
    bundle = getattr(source, "info", {}).get("bundle")
    raw = bundle.manifest.raw.get("shard") if bundle is not None else None
    return Shard.from_dict(raw) if raw else None


def vocab_rows(source: Any) -> tuple[int, int]:
    """Rows of the vocabulary whose embedding and head rows `source` holds ((0, 0): all of them)."""
    shard = shard_of(source)
    return shard.vocab if shard is not None else (0, 0)
