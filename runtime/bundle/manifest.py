"""The manifest's tables as typed, validated records.

Every offset and size is checked here, before any byte of weights.bin is touched: blocks must be
aligned, padded, inside the file and disjoint; tensors and neuron arenas must lie inside their
block and have exactly the size their format and shape imply. A failed check raises
ModelFormatError naming the manifest field and the value.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.kernels.formats import FORMATS
from edgeflash.runtime.bundle.arena import is_one_copy
from edgeflash.runtime.bundle.layout import (
    BLOCK_ALIGNMENT,
    BLOCK_KINDS,
    FORMAT_VERSION,
    MAGIC,
    TENSOR_ALIGNMENT,
    TOKENIZER_FILE,
    TOKENIZER_TABLES_FILE,
    WEIGHTS_FILE,
)
from edgeflash.runtime.bundle.packed import unpack_array


@dataclass(frozen=True)
class TensorEntry:
    name: str
    block: str
    offset: int  # bytes from the start of its block
    nbytes: int
    fmt: str
    shape: tuple[int, ...]
    crc32: int
    role: str

    @property
    def rows(self) -> int:
        return int(np.prod(self.shape[:-1])) if len(self.shape) > 1 else 1


@dataclass(frozen=True)
class ArenaPart:
    name: str  # "gate" | "up" | "down"
    fmt: str
    offset: int  # bytes from the start of a neuron bundle
    nbytes: int


@dataclass(frozen=True)
class ArenaEntry:
    """A layer's neuron-bundle arena: slot j holds FFN neuron `order[j]` (gate row, up row and
    down column, each a row of d_model values) at `offset + j * stride` in its block."""

    layer: int
    n_neurons: int
    d_model: int
    stride: int
    offset: int  # bytes from the start of its block
    parts: tuple[ArenaPart, ...]
    order: np.ndarray  # [n_neurons] int32, slot -> neuron id, hot first

    @property
    def nbytes(self) -> int:
        return self.n_neurons * self.stride

    def part(self, name: str) -> ArenaPart:
        for p in self.parts:
            if p.name == name:
                return p
        raise KeyError(name)


@dataclass(frozen=True)
class BlockEntry:
    name: str
    kind: str
    layer: int | None
    offset: int  # bytes from the start of weights.bin, a multiple of BLOCK_ALIGNMENT
    nbytes: int  # padded size, a multiple of BLOCK_ALIGNMENT
    data_nbytes: int  # bytes before the zero padding
    crc32: int  # zlib CRC-32 of all `nbytes` bytes, padding included
    tensors: tuple[str, ...]
    arena: ArenaEntry | None


@dataclass(frozen=True)
class Manifest:
    raw: dict[str, Any]
    blocks: dict[str, BlockEntry]  # in file order
    tensors: dict[str, TensorEntry]
    weights_nbytes: int
    tokenizer_nbytes: int
    tokenizer_crc32: int
    tokenizer_tables: TokenizerTables | None = None


@dataclass(frozen=True)
class TokenizerTables:
    """tokenizer.tables: the tokenizer's compact tables, in the format of the edgeflash that wrote them."""
    format: int
    nbytes: int
    crc32: int


class _Checker:
    def __init__(self, where: Path):
        self.where = where

    def fail(self, message: str) -> ModelFormatError:
        return ModelFormatError(f"{self.where}: {message}")

    def get(self, obj: Any, key: str, kind: type | tuple[type, ...], field: str) -> Any:
        if not isinstance(obj, dict) or key not in obj:
            raise self.fail(f"{field} is missing")
        value = obj[key]
        kinds = kind if isinstance(kind, tuple) else (kind,)
        if isinstance(value, bool) and bool not in kinds or not isinstance(value, kinds):
            names = " or ".join(k.__name__ for k in kinds)
            raise self.fail(f"{field} = {_short(value)}: expected {names}")
        return value

    def non_negative(self, obj: Any, key: str, field: str) -> int:
        value = self.get(obj, key, int, field)
        if value < 0:
            raise self.fail(f"{field} = {value}: expected an integer >= 0")
        return value


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 60 else text[:57] + "..."


def parse_manifest(raw: Any, where: Path, weights_size: int) -> Manifest:
    """Validate a parsed manifest.json against the weights file size; return its typed tables."""
    c = _Checker(where)
    if not isinstance(raw, dict):
        raise c.fail("the manifest is not a JSON object")
    magic = raw.get("magic")
    if magic != MAGIC:
        raise c.fail(f"magic = {_short(magic)}: not an edgeflash bundle (expected {MAGIC!r})")
    version = c.get(raw, "format_version", int, "format_version")
    if version > FORMAT_VERSION or version < 1:
        raise UnsupportedModelError(f"{where}: bundle format version {version} is not supported by this edgeflash "
                                    f"(it reads versions 1 to {FORMAT_VERSION}); re-export the model or upgrade")
    weights = c.get(raw, "weights", dict, "weights")
    if c.get(weights, "file", str, "weights.file") != WEIGHTS_FILE:
        raise c.fail(f"weights.file = {weights['file']!r}: expected {WEIGHTS_FILE!r}")
    weights_nbytes = c.non_negative(weights, "nbytes", "weights.nbytes")
    if weights_nbytes != weights_size:
        raise c.fail(f"weights.nbytes = {weights_nbytes} but {WEIGHTS_FILE} has {weights_size} bytes "
                     "(truncated or replaced)")
    tok = c.get(raw, "tokenizer", dict, "tokenizer")
    if c.get(tok, "file", str, "tokenizer.file") != TOKENIZER_FILE:
        raise c.fail(f"tokenizer.file = {tok['file']!r}: expected {TOKENIZER_FILE!r}")
    c.get(c.get(raw, "model", dict, "model"), "spec", dict, "model.spec")

    blocks: dict[str, BlockEntry] = {}
    end_of_previous = 0
    for i, b in enumerate(c.get(raw, "blocks", list, "blocks")):
        block = _parse_block(c, b, f"blocks[{i}]", weights_size)
        if block.name in blocks:
            raise c.fail(f"blocks[{i}].name = {block.name!r} appears twice")
        if block.offset < end_of_previous:
            raise c.fail(f"block {block.name} (offset {block.offset}) overlaps the block before it "
                         f"(which ends at {end_of_previous})")
        end_of_previous = block.offset + block.nbytes
        blocks[block.name] = block

    tensors: dict[str, TensorEntry] = {}
    for i, t in enumerate(c.get(raw, "tensors", list, "tensors")):
        tensor = _parse_tensor(c, t, f"tensors[{i}]", blocks)
        if tensor.name in tensors:
            raise c.fail(f"tensors[{i}].name = {tensor.name!r} appears twice")
        tensors[tensor.name] = tensor
    _check_no_overlap(c, blocks, tensors)
    tables = None
    if "tables" in tok:
        t = c.get(tok, "tables", dict, "tokenizer.tables")
        if c.get(t, "file", str, "tokenizer.tables.file") != TOKENIZER_TABLES_FILE:
            raise c.fail(f"tokenizer.tables.file = {t['file']!r}: expected {TOKENIZER_TABLES_FILE!r}")
        tables = TokenizerTables(format=c.non_negative(t, "format", "tokenizer.tables.format"),
                                 nbytes=c.non_negative(t, "nbytes", "tokenizer.tables.nbytes"),
                                 crc32=c.non_negative(t, "crc32", "tokenizer.tables.crc32"))
    return Manifest(raw=raw, blocks=blocks, tensors=tensors, weights_nbytes=weights_nbytes,
                    tokenizer_nbytes=c.non_negative(tok, "nbytes", "tokenizer.nbytes"),
                    tokenizer_crc32=c.non_negative(tok, "crc32", "tokenizer.crc32"), tokenizer_tables=tables)


def _parse_block(c: _Checker, b: Any, field: str, weights_size: int) -> BlockEntry:
    name = c.get(b, "name", str, f"{field}.name")
    kind = c.get(b, "kind", str, f"{field}.kind")
    if kind not in BLOCK_KINDS:
        raise c.fail(f"{field}.kind = {kind!r}: expected one of {', '.join(BLOCK_KINDS)}")
    layer = b.get("layer")
    if layer is not None and (not isinstance(layer, int) or isinstance(layer, bool) or layer < 0):
        raise c.fail(f"{field}.layer = {_short(layer)}: expected an integer >= 0 or null")
    offset = c.non_negative(b, "offset", f"{field}.offset")
    nbytes = c.non_negative(b, "nbytes", f"{field}.nbytes")
    data_nbytes = c.non_negative(b, "data_nbytes", f"{field}.data_nbytes")
    crc = c.non_negative(b, "crc32", f"{field}.crc32")
    if offset % BLOCK_ALIGNMENT or nbytes % BLOCK_ALIGNMENT:
        raise c.fail(f"block {name}: offset {offset} and size {nbytes} must be multiples of {BLOCK_ALIGNMENT}")
    if offset + nbytes > weights_size:
        raise c.fail(f"block {name} (bytes {offset}..{offset + nbytes}) runs past the end of {WEIGHTS_FILE} "
                     f"({weights_size} bytes)")
    if data_nbytes > nbytes:
        raise c.fail(f"block {name}: data_nbytes {data_nbytes} exceeds its size {nbytes}")
    names = c.get(b, "tensors", list, f"{field}.tensors")
    arena = None
    if b.get("arena") is not None:
        arena = _parse_arena(c, b["arena"], f"{field}.arena", name, data_nbytes)
        if kind == "ffn" and not is_one_copy([p.name for p in arena.parts], [p.fmt for p in arena.parts],
                                             [p.offset for p in arena.parts], arena.d_model):
            raise c.fail(f"{field}.arena: the FFN block's arena must hold gate and up in one format at offsets 0 "
                         "and row_bytes, then down at 2 x row_bytes (the layer's one copy of its FFN)")
    return BlockEntry(name=name, kind=kind, layer=layer, offset=offset, nbytes=nbytes, data_nbytes=data_nbytes,
                      crc32=crc, tensors=tuple(str(n) for n in names), arena=arena)


def _parse_arena(c: _Checker, a: Any, field: str, block: str, data_nbytes: int) -> ArenaEntry:
    from edgeflash.kernels.formats import get_format

    layer = c.non_negative(a, "layer", f"{field}.layer")
    n = c.non_negative(a, "n_neurons", f"{field}.n_neurons")
    d_model = c.non_negative(a, "d_model", f"{field}.d_model")
    stride = c.non_negative(a, "stride", f"{field}.stride")
    offset = c.non_negative(a, "offset", f"{field}.offset")
    if offset % TENSOR_ALIGNMENT:
        raise c.fail(f"{field}.offset = {offset}: expected a multiple of {TENSOR_ALIGNMENT}")
    if offset + n * stride > data_nbytes:
        raise c.fail(f"the neuron arena of block {block} ({n} x {stride} bytes at {offset}) runs past the end of "
                     f"the block's data ({data_nbytes} bytes)")
    parts = []
    for i, p in enumerate(c.get(a, "parts", list, f"{field}.parts")):
        pf = f"{field}.parts[{i}]"
        fmt = c.get(p, "format", str, f"{pf}.format")
        if fmt not in FORMATS:
            raise c.fail(f"{pf}.format = {fmt!r}: not a known weight format")
        part = ArenaPart(name=c.get(p, "name", str, f"{pf}.name"), fmt=fmt,
                         offset=c.non_negative(p, "offset", f"{pf}.offset"),
                         nbytes=c.non_negative(p, "nbytes", f"{pf}.nbytes"))
        try:
            need = get_format(fmt).row_bytes(d_model)
        except ValueError as e:
            raise c.fail(f"{pf}: {e}") from None
        if part.nbytes != need or part.offset + part.nbytes > stride:
            raise c.fail(f"{pf} ({part.nbytes} bytes at {part.offset}) does not fit a {fmt} row of {d_model} "
                         f"values ({need} bytes) inside the stride {stride}")
        parts.append(part)
    if sorted(p.name for p in parts) != ["down", "gate", "up"]:
        raise c.fail(f"{field}.parts must be gate, up and down, got {[p.name for p in parts]}")
    try:
        order = unpack_array(c.get(a, "order", (list, dict), f"{field}.order"), f"{field}.order")
    except ValueError as e:
        raise c.fail(str(e)) from None
    if order.shape != (n,) or (n and not np.issubdtype(order.dtype, np.integer)) or \
            not np.array_equal(np.sort(order), np.arange(n)):
        raise c.fail(f"{field}.order must be a permutation of 0..{n - 1}")
    return ArenaEntry(layer=layer, n_neurons=n, d_model=d_model, stride=stride, offset=offset, parts=tuple(parts),
                      order=order.astype(np.int32))


def _parse_tensor(c: _Checker, t: Any, field: str, blocks: dict[str, BlockEntry]) -> TensorEntry:
    from edgeflash.kernels.formats import get_format

    name = c.get(t, "name", str, f"{field}.name")
    block_name = c.get(t, "block", str, f"{field}.block")
    if block_name not in blocks:
        raise c.fail(f"tensor {name}: block {block_name!r} is not in the block table")
    block = blocks[block_name]
    fmt = c.get(t, "format", str, f"{field}.format")
    if fmt not in FORMATS:
        raise c.fail(f"tensor {name}: format {fmt!r} is not a known weight format")
    shape = tuple(c.get(t, "shape", list, f"{field}.shape"))
    if not shape or not all(isinstance(d, int) and not isinstance(d, bool) and d > 0 for d in shape):
        raise c.fail(f"tensor {name}: shape {list(shape)} must be a non-empty list of positive integers")
    offset = c.non_negative(t, "offset", f"{field}.offset")
    nbytes = c.non_negative(t, "nbytes", f"{field}.nbytes")
    rows = int(np.prod(shape[:-1])) if len(shape) > 1 else 1
    try:
        need = rows * get_format(fmt).row_bytes(shape[-1])
    except ValueError as e:
        raise c.fail(f"tensor {name}: {e}") from None
    if nbytes != need:
        raise c.fail(f"tensor {name}: nbytes = {nbytes} but shape {list(shape)} in {fmt} takes {need}")
    if offset % TENSOR_ALIGNMENT:
        raise c.fail(f"tensor {name}: offset {offset} is not a multiple of {TENSOR_ALIGNMENT}")
    if offset + nbytes > block.data_nbytes:
        raise c.fail(f"tensor {name} (bytes {offset}..{offset + nbytes} of block {block_name}) runs past the end "
                     f"of the block's data ({block.data_nbytes} bytes)")
    if name not in block.tensors:
        raise c.fail(f"tensor {name} says it is in block {block_name}, whose tensor list does not name it")
    return TensorEntry(name=name, block=block_name, offset=offset, nbytes=nbytes, fmt=fmt, shape=shape,
                       crc32=c.non_negative(t, "crc32", f"{field}.crc32"), role=str(t.get("role", "")))


def _check_no_overlap(c: _Checker, blocks: dict[str, BlockEntry], tensors: dict[str, TensorEntry]) -> None:
    for block in blocks.values():
        spans = [(tensors[n].offset, tensors[n].offset + tensors[n].nbytes, n) for n in block.tensors
                 if n in tensors]
        missing = [n for n in block.tensors if n not in tensors]
        if missing:
            raise c.fail(f"block {block.name} lists tensor {missing[0]}, which is not in the tensor table")
        if block.arena is not None:
            spans.append((block.arena.offset, block.arena.offset + block.arena.nbytes, "neuron arena"))
        spans.sort()
        for (_, end, a), (start, _, b) in itertools.pairwise(spans):
            if start < end:
                raise c.fail(f"block {block.name}: {a} and {b} overlap")
