"""Structure-aware, seeded mutations of an edgeflash bundle directory (formats 1, 2 and 3).

A bundle is trusted only through its checksums: every byte a run uses (blocks, in format 3 the
FFN blocks' norms and neuron arenas, the tokenizer's files) and, from format 3 on, the manifest
itself are covered, and every run checks every block at load, so any change to them must be
refused (REJECT); edits that change no byte a reader interprets (an extra file beside the bundle,
a symlink to an identical copy, the manifest laid out differently) must leave the output as it was
(SAME). The manifest of formats 1-2 has no checksum of its own: a changed value there must be
refused or run cleanly (CLEAN). "resealed" operators change the manifest and recompute its
checksum, as a hand-made manifest or a writer with a bug would: what the reader judges field by
field behind the checksum must then fail cleanly or run (CLEAN), and block bytes still REJECT.
The operators read the manifest generically (its JSON tree, the block and tensor tables by their
field names), so they follow the format as it evolves: a new field is mutated like the others.

    model = BundleModel(Path("out/smollm2-q4_0"))
    mutation = mutate_bundle(model, seed)
    mutation.apply(copy_of_the_bundle)      # edits the copy in place
"""

from __future__ import annotations

import json
import math
import os
import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from edgeflash.runtime.bundle.seal import SEAL_KEY, sealed
from gguf_mutator import CLEAN, HOSTILE_TEXTS, REJECT, SAME

MANIFEST, WEIGHTS, TOKENIZER, TABLES = "manifest.json", "weights.bin", "tokenizer.json", "tokenizer.tables"
BUNDLE_FILES = (MANIFEST, WEIGHTS, TOKENIZER, TABLES)


@dataclass
class BundleMutation:
    op: str
    detail: str
    expect: str  # REJECT, SAME or CLEAN
    apply: Callable[[Path], None]  # edits a copy of the bundle directory in place
    touches_data: bool = False
    block: dict | None = None  # the block whose bytes changed (its manifest entry)
    offset_in_block: int = 0

    def expect_for(self, run: str) -> str:
        """Every run (plain, budgeted, sparse, inspect) checks every block's checksum at load, so
        the expectation is the same for all of them."""
        return self.expect


class BundleModel:
    """The unmutated bundle: its manifest and where its blocks, arenas and files are."""

    def __init__(self, path: Path):
        self.path = path
        self.manifest = json.loads((path / MANIFEST).read_text(encoding="utf-8"))
        self.blocks = self.manifest.get("blocks", [])
        self.tensors = self.manifest.get("tensors", [])
        self.arenas = [b for b in self.blocks if b.get("arena")]
        self.files = [name for name in BUNDLE_FILES if (path / name).exists()]
        self.leaves = [(p, v) for p, v in _leaves(self.manifest) if p != (SEAL_KEY,)]
        self.sealed = SEAL_KEY in self.manifest  # format 3: the manifest has its own checksum

    @property
    def manifest_edit(self) -> str:
        """What an edit of the manifest's values must lead to."""
        return REJECT if self.sealed else CLEAN


def _leaves(value: Any, path: tuple = ()) -> Any:
    """(path, value) of every scalar, empty container and packed array in the manifest."""
    if isinstance(value, dict) and not ("base64" in value and "dtype" in value):
        if not value:
            yield path, value
        for key, item in value.items():
            yield from _leaves(item, (*path, key))
    elif isinstance(value, list) and value and not all(isinstance(v, (int, float)) for v in value):
        for index, item in enumerate(value):
            yield from _leaves(item, (*path, index))
    else:
        yield path, value


def _set(tree: Any, path: tuple, value: Any) -> None:
    for key in path[:-1]:
        tree = tree[key]
    tree[path[-1]] = value


def _delete(tree: Any, path: tuple) -> None:
    for key in path[:-1]:
        tree = tree[key]
    del tree[path[-1]]


def _shown(path: tuple) -> str:
    return ".".join(str(p) for p in path)


def _write_manifest(bundle: Path, manifest: Any) -> None:
    (bundle / MANIFEST).write_text(json.dumps(manifest, allow_nan=True), encoding="utf-8")


def _hostile_value(old: Any, rng: random.Random) -> Any:
    if isinstance(old, bool):
        return rng.choice([not old, 1, "true", None])
    if isinstance(old, int):
        return rng.choice([0, -1, old + 1, old - 1, old * 2, 2**31, 2**63, 2**64, 10**30, 1e30, "abc", None, [],
                           {}, -(2**63), float("nan")])
    if isinstance(old, float):
        return rng.choice([math.nan, math.inf, -math.inf, 0.0, -1.0, 1e308, old * 2, "0.5", None])
    if isinstance(old, str):
        return rng.choice([*HOSTILE_TEXTS, "", "../../../etc/passwd", "/dev/zero", "x" * 100_000, old + "x",
                           None, 7])
    if isinstance(old, list):
        return rng.choice([[], [None], ["x"] * 3, {"a": 1}, None, [[[]]]])
    if isinstance(old, dict):
        if "base64" in old:  # a packed array: its bytes, dtype or shape
            field = rng.choice(["base64", "dtype", "shape"])
            return {**old, field: {"base64": old["base64"][:-8] + "AAAAAAAA", "dtype": "float64",
                                   "shape": [10**12]}[field]}
        return rng.choice([[], None, "x", {"unknown": 1}])
    return rng.choice([0, "x", [], {}])


# -- manifest operators ------------------------------------------------------------------------------


def op_manifest_field(m: BundleModel, rng: random.Random) -> BundleMutation:
    """One field anywhere in the manifest: spec, calibration, blocks, tensors, arenas, report."""
    path, old = rng.choice(m.leaves)
    new = _hostile_value(old, rng)
    if new == old and type(new) is type(old):
        new = None

    def apply(bundle: Path) -> None:
        manifest = json.loads(json.dumps(m.manifest))
        _set(manifest, path, new)
        _write_manifest(bundle, manifest)

    return BundleMutation("manifest_field", f"{_shown(path)} = {new!r:.60}", m.manifest_edit, apply)


def op_manifest_delete(m: BundleModel, rng: random.Random) -> BundleMutation:
    path, _ = rng.choice(m.leaves)

    def apply(bundle: Path) -> None:
        manifest = json.loads(json.dumps(m.manifest))
        _delete(manifest, path)
        _write_manifest(bundle, manifest)

    return BundleMutation("manifest_delete", f"{_shown(path)} removed", m.manifest_edit, apply)


def op_swap_tensor_names(m: BundleModel, rng: random.Random) -> BundleMutation:
    a, b = rng.sample(range(len(m.tensors)), 2)

    def apply(bundle: Path) -> None:
        manifest = json.loads(json.dumps(m.manifest))
        ta, tb = manifest["tensors"][a], manifest["tensors"][b]
        ta["name"], tb["name"] = tb["name"], ta["name"]
        _write_manifest(bundle, manifest)

    return BundleMutation("swap_tensor_names", f"{m.tensors[a]['name']} <-> {m.tensors[b]['name']}",
                          m.manifest_edit, apply)


def op_block_table(m: BundleModel, rng: random.Random) -> BundleMutation:
    """A block's offset, size or checksum, or its place in the table."""
    index = rng.randrange(len(m.blocks))
    block = m.blocks[index]
    choice = rng.choice(["offset_page", "offset_alias", "nbytes", "crc32", "drop", "duplicate"])

    def apply(bundle: Path) -> None:
        manifest = json.loads(json.dumps(m.manifest))
        blocks = manifest["blocks"]
        if choice == "offset_page":
            blocks[index]["offset"] += 4096
        elif choice == "offset_alias":
            blocks[index]["offset"] = blocks[(index + 1) % len(blocks)]["offset"]
        elif choice == "nbytes":
            blocks[index]["nbytes"] += rng.choice([-4096, 4096, 1])
        elif choice == "crc32":
            blocks[index]["crc32"] ^= 1 << rng.randrange(32)
        elif choice == "drop":
            del blocks[index]
        else:
            blocks.insert(index, dict(blocks[index]))
        _write_manifest(bundle, manifest)

    return BundleMutation("block_table", f"{block['name']}: {choice}", REJECT, apply, touches_data=True)


def op_nested_manifest(m: BundleModel, rng: random.Random) -> BundleMutation:
    depth = rng.choice([100, 10_000, 100_000])

    def apply(bundle: Path) -> None:
        text = json.dumps(m.manifest)
        (bundle / MANIFEST).write_text(text[:-1] + ', "nested": ' + "[" * depth + "]" * depth + "}", encoding="utf-8")

    return BundleMutation("nested_manifest", f"an unknown key nested {depth} deep", REJECT if depth > 16 else
                          m.manifest_edit, apply)


def op_manifest_bytes(m: BundleModel, rng: random.Random) -> BundleMutation:
    choice = rng.choice(["truncate", "not_json", "invalid_utf8", "array", "huge", "whitespace", "unknown_key"])

    def apply(bundle: Path) -> None:
        path = bundle / MANIFEST
        data = path.read_bytes()
        if choice == "truncate":
            path.write_bytes(data[:rng.randrange(len(data))])
        elif choice == "not_json":
            path.write_bytes(b"{" + data)
        elif choice == "invalid_utf8":
            path.write_bytes(data.replace(b'"name"', b'"n\xff\xfeme"', 1))
        elif choice == "array":
            path.write_bytes(b"[" + data + b"]")
        elif choice == "huge":  # 300 MB (a sparse tail): refused by its size, never read
            os.truncate(path, len(data) + (300 << 20))
        elif choice == "whitespace":  # the same manifest, laid out differently
            path.write_text(json.dumps(m.manifest, indent=1), encoding="utf-8")
        else:
            path.write_text(json.dumps({**m.manifest, "x-unknown": {"a": [1, 2]}}), encoding="utf-8")

    expect = SAME if choice == "whitespace" else (m.manifest_edit if choice == "unknown_key" else REJECT)
    return BundleMutation("manifest_bytes", choice, expect, apply)


# -- weights.bin operators ---------------------------------------------------------------------------


def _patch(path: Path, offset: int, data: bytes) -> None:
    with open(path, "r+b") as f:
        f.seek(offset)
        f.write(data)


def _reseal(bundle: Path) -> None:
    path = bundle / MANIFEST
    path.write_text(json.dumps(sealed(json.loads(path.read_text(encoding="utf-8"))), allow_nan=True),
                    encoding="utf-8")


def op_resealed(m: BundleModel, rng: random.Random) -> BundleMutation | None:
    """A manifest edit with the manifest's checksum recomputed: the checks behind it are what is
    tried (a changed block table must still be refused by the blocks' own checksums)."""
    if not m.sealed:
        return None
    inner = rng.choices([op_manifest_field, op_manifest_delete, op_swap_tensor_names, op_block_table,
                         op_arena_entry], [30, 8, 4, 6, 6])[0](m, rng)
    if inner is None:
        return None

    def apply(bundle: Path) -> None:
        inner.apply(bundle)
        _reseal(bundle)

    return BundleMutation("resealed_" + inner.op, inner.detail, REJECT if inner.op == "block_table" else CLEAN,
                          apply, touches_data=inner.touches_data)


def op_arena_entry(m: BundleModel, rng: random.Random) -> BundleMutation | None:
    """A neuron arena's description: its geometry, a part's format or offset, its slot order."""
    if not m.arenas:
        return None
    index = m.blocks.index(rng.choice(m.arenas))
    name = m.blocks[index]["name"]
    choice = rng.choice(["stride", "n_neurons", "d_model", "offset", "part_format", "part_offset", "order_swap",
                         "order_short", "layer"])

    def apply(bundle: Path) -> None:
        from edgeflash.runtime.bundle.packed import pack_array, unpack_array

        manifest = json.loads(json.dumps(m.manifest))
        arena = manifest["blocks"][index]["arena"]
        r = random.Random(f"{name}{choice}")
        if choice in ("stride", "n_neurons", "d_model", "offset", "layer"):
            arena[choice] = r.choice([0, arena[choice] + 64, arena[choice] * 2, max(0, arena[choice] - 64)])
        elif choice == "part_format":
            part = arena["parts"][r.randrange(3)]  # another format than its own: the same one is no edit
            part["format"] = r.choice([f for f in ("q8_0", "q4_0", "q5_0", "f16", "q4_k") if f != part["format"]])
        elif choice == "part_offset":
            arena["parts"][r.randrange(3)]["offset"] += r.choice([-64, 64, 1])
        else:
            order = unpack_array(arena["order"], "order").astype("int64")
            if choice == "order_swap":
                a, b = r.sample(range(len(order)), 2)
                order[a], order[b] = order[b], order[a]
            else:
                order = order[:-1]
            arena["order"] = pack_array(order, "int32")
        _write_manifest(bundle, manifest)

    return BundleMutation("arena_entry", f"{name}: {choice}", m.manifest_edit, apply)


def op_block_bytes(m: BundleModel, rng: random.Random) -> BundleMutation:
    block = rng.choice(m.blocks)
    where = rng.choice(["data", "data", "padding", "first_page"])
    if where == "padding" and block["nbytes"] > block.get("data_nbytes", block["nbytes"]):
        offset = block["offset"] + rng.randrange(block["data_nbytes"], block["nbytes"])
    elif where == "first_page":  # norms sit there (sparse mode reads only this page of an FFN block)
        offset = block["offset"] + rng.randrange(min(4096, block["nbytes"]))
    else:
        offset = block["offset"] + rng.randrange(block.get("data_nbytes", block["nbytes"]))
    count = rng.choice([1, 16, 4096])

    def apply(bundle: Path) -> None:
        _patch(bundle / WEIGHTS, offset, bytes(rng.randrange(256) for _ in range(count)))

    return BundleMutation("block_bytes", f"{block['name']}: {count} bytes at {offset} ({where})", REJECT, apply,
                          touches_data=True, block=block, offset_in_block=offset - block["offset"])


def op_arena_bytes(m: BundleModel, rng: random.Random) -> BundleMutation | None:
    """Bytes of a neuron arena: the hot prefix, a single neuron, or 1 MiB of it."""
    if not m.arenas:
        return None
    block = rng.choice(m.arenas)
    arena = block["arena"]
    start = block["offset"] + arena["offset"]
    size = arena["n_neurons"] * arena["stride"]
    count = min(rng.choice([1, arena["stride"], 1 << 20]), size)
    offset = start + rng.choice([0, rng.randrange(size - count + 1)])

    def apply(bundle: Path) -> None:
        _patch(bundle / WEIGHTS, offset, os.urandom(count))

    return BundleMutation("arena_bytes", f"{block['name']}: {count} arena bytes at {offset}", REJECT, apply,
                          touches_data=True, block=block, offset_in_block=offset - block["offset"])


def op_swap_blocks(m: BundleModel, rng: random.Random) -> BundleMutation:
    same = [(a, b) for a in m.blocks for b in m.blocks if a is not b and a["nbytes"] == b["nbytes"]]
    a, b = rng.choice(same) if same else rng.sample(m.blocks, 2)
    size = min(a["nbytes"], b["nbytes"])

    def apply(bundle: Path) -> None:
        with open(bundle / WEIGHTS, "r+b") as f:
            f.seek(a["offset"])
            first = f.read(size)
            f.seek(b["offset"])
            second = f.read(size)
            f.seek(a["offset"])
            f.write(second)
            f.seek(b["offset"])
            f.write(first)

    return BundleMutation("swap_blocks", f"{a['name']} <-> {b['name']} bytes", REJECT, apply, touches_data=True)


def op_weights_length(m: BundleModel, rng: random.Random) -> BundleMutation:
    choice = rng.choice(["truncate_block", "truncate_byte", "append", "sparse_tail"])

    def apply(bundle: Path) -> None:
        path = bundle / WEIGHTS
        size = path.stat().st_size
        if choice == "truncate_block":
            os.truncate(path, rng.randrange(size))
        elif choice == "truncate_byte":
            os.truncate(path, size - 1)
        elif choice == "append":
            with open(path, "ab") as f:
                f.write(b"\0" * 4096)
        else:
            os.truncate(path, size + (4 << 30))

    return BundleMutation("weights_length", choice, REJECT, apply, touches_data=True)


# -- tokenizer files ---------------------------------------------------------------------------------


def op_tokenizer_file(m: BundleModel, rng: random.Random) -> BundleMutation:
    name = rng.choice([f for f in (TOKENIZER, TABLES) if f in m.files])
    choice = rng.choice(["flip", "truncate", "empty", "other_json", "special_token_text"])

    def apply(bundle: Path) -> None:
        path = bundle / name
        data = bytearray(path.read_bytes())
        if choice == "flip":
            data[rng.randrange(len(data))] ^= 1 << rng.randrange(8)
            path.write_bytes(bytes(data))
        elif choice == "truncate":
            path.write_bytes(bytes(data[:rng.randrange(len(data))]))
        elif choice == "empty":
            path.write_bytes(b"")
        elif choice == "other_json":
            path.write_text('{"model": {"type": "BPE", "vocab": []}}', encoding="utf-8")
        else:  # an ordinary token respelled as a control token's text (tokenizer.tables has no quotes)
            respelled = bytes(data).replace(b'"the"', b'"<|im_start|>"', 1)
            if respelled == data:
                respelled = bytes(data).replace(b"the", b"<|i", 1)
            if respelled == data:
                respelled = bytes(data[:-1]) + bytes([data[-1] ^ 1])
            path.write_bytes(respelled)

    return BundleMutation("tokenizer_file", f"{name}: {choice}", REJECT, apply)


# -- the directory itself ----------------------------------------------------------------------------


def op_file_swap(m: BundleModel, rng: random.Random) -> BundleMutation:
    name = rng.choice(m.files)
    kind = rng.choice(["fifo", "dev_zero", "dev_urandom", "directory", "symlink_loop", "dangling_symlink", "missing",
                       "symlink_to_copy", "unreadable_name"])

    def apply(bundle: Path) -> None:
        path = bundle / name
        if kind == "symlink_to_copy":
            copy = bundle / (name + ".copy")
            path.rename(copy)
            path.symlink_to(copy.name)
            return
        path.unlink()
        if kind == "fifo":
            os.mkfifo(path)
        elif kind in ("dev_zero", "dev_urandom"):
            path.symlink_to("/dev/" + kind[4:])
        elif kind == "directory":
            path.mkdir()
        elif kind == "symlink_loop":
            path.symlink_to(path.name)
        elif kind == "dangling_symlink":
            path.symlink_to("absent")
        elif kind == "unreadable_name":
            path.symlink_to("\x1b[31m" + name)

    expect = SAME if kind == "symlink_to_copy" else REJECT
    return BundleMutation("file_swap", f"{name}: {kind}", expect, apply)


def op_extra_file(m: BundleModel, rng: random.Random) -> BundleMutation:
    name = rng.choice(["notes.txt", "weights.bin.old", ".tmp-123", "manifest.json~"])

    def apply(bundle: Path) -> None:
        (bundle / name).write_bytes(b"not part of the bundle")

    return BundleMutation("extra_file", name, SAME, apply)


BUNDLE_OPERATORS: list[tuple[Callable[[BundleModel, random.Random], BundleMutation | None], int]] = [
    (op_manifest_field, 30), (op_manifest_delete, 8), (op_swap_tensor_names, 4), (op_block_table, 8),
    (op_nested_manifest, 3), (op_manifest_bytes, 6), (op_block_bytes, 10), (op_arena_bytes, 6), (op_swap_blocks, 3),
    (op_weights_length, 4), (op_tokenizer_file, 6), (op_file_swap, 8), (op_extra_file, 2), (op_resealed, 20),
    (op_arena_entry, 4),
]


def mutate_bundle(model: BundleModel, seed: int) -> BundleMutation:
    """One mutation of `model`'s bundle, the same for the same seed."""
    rng = random.Random(seed)
    ops, weights = zip(*BUNDLE_OPERATORS)
    while True:
        mutation = rng.choices(ops, weights)[0](model, rng)
        if mutation is not None:
            return mutation
