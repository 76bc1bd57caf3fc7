"""Per-rank bundles for tensor parallelism: `edgeflash export SOURCE -o OUT --ranks N` writes
OUT/rank-0 ... OUT/rank-{N-1}, each a bundle holding only that rank's part of every tensor
(edgeflash.runtime.distributed.shard), so a board stores and streams its share and nothing else.

Bytes are copied, not re-quantized: rows and whole blocks are cut out of the source's own
encoding. The exception is a tensor cut by columns (o projection, down projection) stored in
256-value blocks, which rarely divide a rank's columns: it is rewritten as q8_0 for every rank
count, 1 included, so that `--ranks 1` is the single-process model the ranks reproduce.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from edgeflash import kernels
from edgeflash.export.partition import BlockPlan
from edgeflash.export.sources.resolve import load_source
from edgeflash.export.writer import check_output, write_bundle
from edgeflash.runtime.bundle.layout import FORMAT_VERSION, MAGIC, block_of_tensor, block_sort_key
from edgeflash.runtime.distributed.shard import (
    column_format,
    cut_tensor,
    is_column_cut,
    plan_shards,
    rank_spec,
)
from edgeflash.runtime.tensors import Tensor

RANK_DIR = "rank-{rank}"


def rank_dir(out: Path, rank: int) -> Path:
    return Path(out) / RANK_DIR.format(rank=rank)


def export_shards(source: Any, out: str | Path, ranks: int, *, overwrite: bool = False,
                  progress: bool = True) -> list[Path]:
    """Write one bundle per rank under `out`; returns their paths."""
    out = Path(out).expanduser()
    model = load_source(source)
    shards = plan_shards(model.spec, ranks, str(model.path))
    for s in shards:
        check_output(rank_dir(out, s.rank), overwrite)
    tensors = {name: _stored(t) for name, t in model.tensors.items()}
    paths = []
    for shard in shards:
        spec = rank_spec(model.spec, shard)
        part = {name: cut_tensor(t, model.spec, shard) for name, t in tensors.items()}
        blocks: dict[str, BlockPlan] = {}
        for name in sorted(part):
            block = block_of_tensor(name)
            if block not in blocks:
                layer = int(block.split(".")[1]) if block.startswith("layer.") else None
                blocks[block] = BlockPlan(name=block, kind=block.split(".")[-1] if layer is not None else block,
                                          layer=layer)
            blocks[block].tensors.append((part[name], "weight"))
        for b in blocks.values():  # small 1-D tensors first: a reader needing only them reads one page
            b.tensors.sort(key=lambda item: (len(item[0].shape) > 1, item[0].name))
        manifest = {"magic": MAGIC, "format_version": FORMAT_VERSION, "created_by": "edgeflash export --ranks",
                    "model": {"name": model.name, "spec": spec.to_dict()},
                    "source": {"kind": model.kind, "path": str(model.path), "name": model.name},
                    "shard": {**shard.to_dict(), "spec": model.spec.to_dict()}}
        path = rank_dir(out, shard.rank)
        write_bundle(path, [blocks[n] for n in sorted(blocks, key=block_sort_key)], manifest,
                     model.tokenizer.to_json(), model.tokenizer.tables(), overwrite=overwrite)
        if progress:
            print(f"rank {shard.rank}/{ranks}: {path} (heads {shard.heads}, KV heads {shard.kv_heads}, "
                  f"neurons {shard.neurons}, vocabulary rows {shard.vocab})", flush=True)
        paths.append(path)
    return paths


def _stored(t: Tensor) -> Tensor:
    """The tensor in the format its shards store (column-cut tensors in 256-value blocks become q8_0)."""
    if not is_column_cut(t.name) or column_format(t) == t.fmt:
        return t
    fmt = column_format(t)
    raw = kernels.quantize(t.dequantize().reshape(t.rows, t.cols), fmt)
    return Tensor(t.name, fmt, t.shape, raw.reshape(t.rows, -1))

