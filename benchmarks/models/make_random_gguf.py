"""A GGUF with the shapes of a real model, random Q4_0 weights and a real tokenizer: scale without a hub.

    python benchmarks/models/make_random_gguf.py --shape qwen2-7b --out bench-out/models/random-qwen2-7b.gguf

The architecture keys (qwen2) and the whole tokenizer (tokenizer.ggml.*, chat template) are copied
from a real Qwen2.5-Coder GGUF (`--tokenizer-from`, an alias or a path); the shape keys are then set
from the table below. Every 2-D weight is Q4_0 with random nibbles and fp16 scales of about
1/sqrt(fan_in)/4.6 per block (4.6 is the spread of a uniform nibble around 8), so each matmul keeps
its input's magnitude and activations stay finite through all layers; norms are ones, the q/k/v
biases small. The text such a model writes is noise; its memory, time and I/O are those of the
real shape.

Tensors are generated and written a slice at a time, so the writer's memory stays at a few tens of
MB whatever the model's size. The file is written under a temporary name and renamed when done.
"""

from __future__ import annotations

import argparse
import math
import mmap
import os
import struct
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
from gguf import GGMLQuantizationType, GGUFValueType, GGUFWriter, LlamaFileType

Q4_0_BLOCK = 32  # weights per block
Q4_0_BYTES = 18  # fp16 scale + 16 bytes of nibbles
NIBBLE_STD = math.sqrt((16**2 - 1) / 12)  # spread of a uniform 0..15 value
# Rows generated at once are capped so that one slice is about this many bytes.
SLICE_BYTES = 16 << 20


@dataclass(frozen=True)
class Shape:
    layers: int
    hidden: int
    ffn: int
    heads: int
    kv_heads: int
    tied_head: bool

    @property
    def kv_width(self) -> int:
        return self.hidden // self.heads * self.kv_heads


SHAPES: dict[str, Shape] = {
    # Qwen2-7B: 28 layers, hidden 3584, FFN 18944, 28 query / 4 KV heads of 128, untied output head.
    "qwen2-7b": Shape(layers=28, hidden=3584, ffn=18944, heads=28, kv_heads=4, tied_head=False),
    # For checking the script and the loaders in seconds (the vocabulary is still the real one).
    "qwen2-tiny": Shape(layers=2, hidden=256, ffn=768, heads=4, kv_heads=2, tied_head=False),
}


class RandomQ4_0:
    """A [rows, cols] Q4_0 tensor that generates its bytes while it writes them (GGUFWriter calls tofile)."""

    dtype = np.dtype(np.uint8)

    def __init__(self, rows: int, cols: int, seed: np.random.SeedSequence) -> None:
        if cols % Q4_0_BLOCK:
            raise ValueError(f"Q4_0 rows need a multiple of {Q4_0_BLOCK} columns, got {cols}")
        self.rows, self.cols, self.seed = rows, cols, seed
        self.row_bytes = cols // Q4_0_BLOCK * Q4_0_BYTES
        self.shape = (rows, self.row_bytes)  # the byte shape GGUFWriter converts to the element shape
        self.nbytes = rows * self.row_bytes
        self.scale = 1.0 / math.sqrt(cols) / NIBBLE_STD

    def tofile(self, fp: IO[bytes]) -> None:
        rng = np.random.default_rng(self.seed)
        step = max(1, SLICE_BYTES // self.row_bytes)
        for start in range(0, self.rows, step):
            n_blocks = min(step, self.rows - start) * (self.cols // Q4_0_BLOCK)
            blocks = np.empty((n_blocks, Q4_0_BYTES), dtype=np.uint8)
            # Per-block scales vary by +-50% around the base, as real blocks' do.
            scales = (self.scale * rng.uniform(0.5, 1.5, n_blocks)).astype("<f2")
            blocks[:, :2] = scales.view(np.uint8).reshape(n_blocks, 2)
            blocks[:, 2:] = np.frombuffer(rng.bytes(n_blocks * 16), dtype=np.uint8).reshape(n_blocks, 16)
            fp.write(blocks.data)


def tensor_plan(shape: Shape, vocab: int, seeds: list[np.random.SeedSequence]) -> list[tuple[str, object]]:
    """(name, data) in llama.cpp's qwen2 order; data is a RandomQ4_0 or a small float32 array."""
    seed = iter(seeds)
    rng = np.random.default_rng(next(seed))
    h, kv = shape.hidden, shape.kv_width
    plan: list[tuple[str, object]] = [("token_embd.weight", RandomQ4_0(vocab, h, next(seed)))]
    for i in range(shape.layers):
        b = f"blk.{i}."
        plan += [
            (b + "attn_norm.weight", np.ones(h, dtype=np.float32)),
            (b + "attn_q.weight", RandomQ4_0(h, h, next(seed))),
            (b + "attn_q.bias", rng.normal(0, 0.02, h).astype(np.float32)),
            (b + "attn_k.weight", RandomQ4_0(kv, h, next(seed))),
            (b + "attn_k.bias", rng.normal(0, 0.02, kv).astype(np.float32)),
            (b + "attn_v.weight", RandomQ4_0(kv, h, next(seed))),
            (b + "attn_v.bias", rng.normal(0, 0.02, kv).astype(np.float32)),
            (b + "attn_output.weight", RandomQ4_0(h, h, next(seed))),
            (b + "ffn_norm.weight", np.ones(h, dtype=np.float32)),
            (b + "ffn_gate.weight", RandomQ4_0(shape.ffn, h, next(seed))),
            (b + "ffn_up.weight", RandomQ4_0(shape.ffn, h, next(seed))),
            (b + "ffn_down.weight", RandomQ4_0(h, shape.ffn, next(seed))),
        ]
    plan.append(("output_norm.weight", np.ones(h, dtype=np.float32)))
    if not shape.tied_head:
        plan.append(("output.weight", RandomQ4_0(vocab, h, next(seed))))
    return plan


# Set from the shape table, not copied.
SHAPE_KEYS = {f"qwen2.{k}" for k in ("block_count", "embedding_length", "feed_forward_length",
                                    "attention.head_count", "attention.head_count_kv")}


def read_donor_keys(path: Path) -> dict[str, tuple[GGUFValueType, GGUFValueType | None, object]]:
    """key -> (type, array element type, value) of a GGUF's metadata, types exactly as in the file.

    Read here rather than with gguf's GGUFReader, which keeps one numpy array per vocabulary string
    (about 500 MB for this tokenizer) and would make that the writer's peak memory.
    """
    scalars = {GGUFValueType.UINT8: "B", GGUFValueType.INT8: "b", GGUFValueType.UINT16: "H",
               GGUFValueType.INT16: "h", GGUFValueType.UINT32: "I", GGUFValueType.INT32: "i",
               GGUFValueType.FLOAT32: "f", GGUFValueType.BOOL: "?", GGUFValueType.UINT64: "Q",
               GGUFValueType.INT64: "q", GGUFValueType.FLOAT64: "d"}
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        pos = 0

        def take(code: str):
            nonlocal pos
            value = struct.unpack_from("<" + code, buf, pos)[0]
            pos += struct.calcsize("<" + code)
            return value

        def string() -> str:
            nonlocal pos
            n = take("Q")
            pos += n
            return buf[pos - n:pos].decode("utf-8")

        def value(vtype: GGUFValueType):
            return string() if vtype == GGUFValueType.STRING else take(scalars[vtype])

        if buf[:4] != b"GGUF":
            raise SystemExit(f"--tokenizer-from {path}: not a GGUF file")
        pos = 8
        _n_tensors, n_kv = take("Q"), take("Q")
        keys = {}
        for _ in range(n_kv):
            key = string()
            vtype = GGUFValueType(take("I"))
            if vtype == GGUFValueType.ARRAY:
                etype = GGUFValueType(take("I"))
                keys[key] = (vtype, etype, [value(etype) for _ in range(take("Q"))])
            else:
                keys[key] = (vtype, None, value(vtype))
    return keys


# Set from the shape table, not copied.
SHAPE_KEYS = {f"qwen2.{k}" for k in ("block_count", "embedding_length", "feed_forward_length",
                                    "attention.head_count", "attention.head_count_kv")}


def copy_donor_keys(writer: GGUFWriter, donor: Path) -> int:
    """The tokenizer and the qwen2 keys of a real file; returns its vocabulary size."""
    keys = read_donor_keys(donor)
    arch = keys.get("general.architecture", (None, None, None))[2]
    if arch != "qwen2":
        raise SystemExit(f"--tokenizer-from {donor}: general.architecture is {arch!r}, expected 'qwen2'")
    for name, (vtype, etype, val) in keys.items():
        if name.startswith(("tokenizer.", "qwen2.")) and name not in SHAPE_KEYS:
            writer.add_key_value(name, val, vtype, etype)
    return len(keys["tokenizer.ggml.tokens"][2])


def resolve_donor(source: str) -> Path:
    path = Path(source).expanduser()
    if path.is_file():
        return path
    from edgeflash.base.models import resolve_model  # an alias, assembled on first use

    return resolve_model(source)


def write(out: Path, shape_name: str, seed: int, donor_path: Path) -> None:
    shape = SHAPES[shape_name]
    tmp = out.with_name(f".{out.name}.partial")
    writer = GGUFWriter(tmp, "qwen2")
    vocab = copy_donor_keys(writer, donor_path)
    writer.add_block_count(shape.layers)
    writer.add_embedding_length(shape.hidden)
    writer.add_feed_forward_length(shape.ffn)
    writer.add_head_count(shape.heads)
    writer.add_head_count_kv(shape.kv_heads)
    writer.add_name(f"random {shape_name} (tokenizer of {donor_path.name}, seed {seed})")
    writer.add_file_type(LlamaFileType.MOSTLY_Q4_0)
    writer.add_quantization_version(2)

    seeds = np.random.SeedSequence(seed).spawn(2 + 7 * shape.layers + 1)
    plan = tensor_plan(shape, vocab, seeds)
    for name, data in plan:
        if isinstance(data, RandomQ4_0):
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes, raw_dtype=GGMLQuantizationType.Q4_0)
        else:
            writer.add_tensor_info(name, data.shape, data.dtype, data.nbytes)
    total = sum(data.nbytes for _, data in plan)
    print(f"{out}: {shape_name}, {len(plan)} tensors, {total / 1e9:.2f} GB of tensor data, vocab {vocab}",
          file=sys.stderr, flush=True)

    out.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.perf_counter()
    try:
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        written = 0
        for name, data in plan:
            writer.write_tensor_data(data)  # RandomQ4_0 streams itself in slices
            written += data.nbytes
            if name.endswith("ffn_down.weight") or name == plan[-1][0]:
                rate = written / 1e6 / max(time.perf_counter() - t0, 1e-9)
                print(f"  {name}: {written / 1e9:.2f}/{total / 1e9:.2f} GB, {rate:.0f} MB/s",
                      file=sys.stderr, flush=True)
        writer.close()
        os.replace(tmp, out)
    finally:
        writer.close()
        tmp.unlink(missing_ok=True)
    print(f"{out}: {out.stat().st_size / 1e9:.2f} GB written in {time.perf_counter() - t0:.1f} s",
          file=sys.stderr, flush=True)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--out", type=Path, required=True, help="the GGUF file to write")
    p.add_argument("--shape", choices=sorted(SHAPES), default="qwen2-7b")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--tokenizer-from", default="qwen2.5-coder-1.5b",
                   help="a qwen2 GGUF (path or model alias) whose tokenizer and qwen2 keys are copied")
    args = p.parse_args()
    write(args.out, args.shape, args.seed, resolve_donor(args.tokenizer_from))


if __name__ == "__main__":
    main()
