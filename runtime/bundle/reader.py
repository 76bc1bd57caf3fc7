"""Open a bundle: validate its manifest, verify checksums, and hand out zero-copy views.

Two ways to read weights:
- `Bundle.tensor(name)` / `load_bundle(path)`: views into a read-only memory map of weights.bin
  (the reference runtime, tools);
- `Bundle.read_block_into(name, buffer)`: one positioned read of a whole block into a caller's
  buffer, then `tensor_in(buffer, name)` / `arena_in(buffer, layer)` views into that buffer.
  This is the path a memory-budgeted runtime streams through (blocks are 4 KiB aligned and
  padded, so the same reads work with O_DIRECT and aligned buffers).
"""

from __future__ import annotations

import json
import mmap
import os
import zlib
from array import array
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import IntegrityError, ModelFormatError
from edgeflash.runtime.bundle.arena import DENSE_NAMES, ArenaTensor, arena_tensor_name
from edgeflash.runtime.bundle.layout import MANIFEST_FILE, TOKENIZER_FILE, TOKENIZER_TABLES_FILE, WEIGHTS_FILE
from edgeflash.runtime.bundle.manifest import ArenaEntry, BlockEntry, Manifest, TensorEntry, parse_manifest
from edgeflash.runtime.bundle.packed import is_packed, unpack_array
from edgeflash.runtime.spec import ModelSpec
from edgeflash.runtime.tensors import Tensor


class Bundle:
    """An opened bundle directory. Construct with `Bundle.open(path)`."""

    def __init__(self, path: Path, manifest: Manifest, weights_map: mmap.mmap | None):
        self.path = path
        self.manifest = manifest
        self.spec = ModelSpec.from_dict(manifest.raw["model"]["spec"])
        self._map = weights_map

    # -- opening ----------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: str | Path, verify: bool = True) -> Bundle:
        """Validate the manifest (always) and every block checksum (when `verify`)."""
        path = Path(path)
        manifest_path = path / MANIFEST_FILE
        weights_path = path / WEIGHTS_FILE
        try:
            raw = json.loads(manifest_path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise ModelFormatError(f"{path}: not an edgeflash bundle (no {MANIFEST_FILE})") from None
        except (ValueError, UnicodeDecodeError) as e:
            raise ModelFormatError(f"{manifest_path}: not valid JSON ({e})") from None
        if not weights_path.is_file():
            raise ModelFormatError(f"{path}: the bundle has no {WEIGHTS_FILE}")
        size = weights_path.stat().st_size
        manifest = parse_manifest(raw, manifest_path, size)
        _compact_calibration(raw, manifest, manifest_path)
        weights_map = None
        if size:
            with open(weights_path, "rb") as f:
                weights_map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        bundle = cls(path, manifest, weights_map)
        if verify:
            bundle.verify()
        return bundle

    def close(self) -> None:
        # Views handed out keep the map alive (numpy holds a reference), so closing is just dropping ours.
        self._map = None

    # -- tables -------------------------------------------------------------------------------------

    @property
    def blocks(self) -> dict[str, BlockEntry]:
        return self.manifest.blocks

    @property
    def tensors(self) -> dict[str, TensorEntry]:
        return self.manifest.tensors

    @property
    def weights_path(self) -> Path:
        return self.path / WEIGHTS_FILE

    def block(self, name: str) -> BlockEntry:
        try:
            return self.blocks[name]
        except KeyError:
            raise KeyError(f"bundle {self.path} has no block {name!r}") from None

    def arena_block(self, layer: int) -> BlockEntry:
        """The block holding a layer's neuron arena: its `ffn` block (format 3: the FFN's one copy)
        or its `neurons` block (formats 1-2, `keep`); bundles exported with --no-neuron-arena have none."""
        for kind in ("ffn", "neurons"):
            block = self.blocks.get(f"layer.{layer}.{kind}")
            if block is not None and block.arena is not None:
                return block
        raise KeyError(f"bundle {self.path} has no neuron arena for layer {layer}")

    def ffn_arenas(self) -> dict[str, ArenaTensor]:
        """Per layer whose FFN is stored only as its arena, that arena as a tensor (`blk.N.ffn_arena`)."""
        out = {}
        for block in self.blocks.values():
            if block.kind == "ffn" and block.arena is not None:
                a = block.arena
                out[arena_tensor_name(a.layer)] = ArenaTensor(
                    arena_tensor_name(a.layer), a.part("gate").fmt, a.n_neurons, a.d_model,
                    _arena_view(a, self._region(block.offset, block.nbytes)), a.order, a.part("down").fmt)
        return out

    # -- integrity ----------------------------------------------------------------------------------

    def verify(self, names: Iterable[str] | None = None) -> None:
        """Check the CRC-32 of the given blocks (all by default) and of the tokenizer's files."""
        for name in names if names is not None else self.blocks:
            block = self.block(name)
            self._check_block(block, self._region(block.offset, block.nbytes))
        self._checked_file(TOKENIZER_FILE, self.manifest.tokenizer_nbytes, self.manifest.tokenizer_crc32)
        tables = self.manifest.tokenizer_tables
        if tables is not None:
            self._checked_file(TOKENIZER_TABLES_FILE, tables.nbytes, tables.crc32)

    def verify_by_reading(self, chunk_bytes: int = 8 << 20) -> None:
        """`verify()` through positioned reads of a few MB at a time instead of the memory map, the
        pages dropped from the cache as they are checked: a bundle larger than the memory left can
        be verified (an export checks what it wrote this way)."""
        buf = bytearray(chunk_bytes)
        fd = os.open(self.weights_path, os.O_RDONLY)
        try:
            for block in self.blocks.values():
                crc, done = 0, 0
                while done < block.nbytes:
                    n = os.preadv(fd, [memoryview(buf)[:min(chunk_bytes, block.nbytes - done)]], block.offset + done)
                    if n <= 0:
                        raise ModelFormatError(f"{self.weights_path}: file ended inside block {block.name}")
                    crc = zlib.crc32(memoryview(buf)[:n], crc)
                    done += n
                os.posix_fadvise(fd, block.offset, block.nbytes, os.POSIX_FADV_DONTNEED)
                if crc != block.crc32:
                    raise IntegrityError(f"{self.weights_path}: checksum mismatch in block {block.name} (bytes "
                                         f"{block.offset}..{block.offset + block.nbytes}): CRC-32 {crc:08x}, manifest "
                                         f"says {block.crc32:08x}; the file is corrupted")
        finally:
            os.close(fd)
        self.verify(names=[])  # the tokenizer's files

    def _checked_file(self, name: str, nbytes: int, crc32: int) -> bytes:
        """One of the bundle's small files, checked against the size and CRC-32 the manifest gives."""
        path = self.path / name
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise ModelFormatError(f"{self.path}: the bundle has no {name}") from None
        if len(data) != nbytes or zlib.crc32(data) != crc32:
            raise IntegrityError(f"{path}: checksum mismatch ({name} was modified or truncated)")
        return data

    def verify_tensor(self, name: str, data: Any) -> None:
        """Check bytes read for one tensor (e.g. only the norms at the head of an FFN block)
        against the tensor's own CRC-32."""
        entry = self.tensors[name]
        view = memoryview(data).cast("B")
        if len(view) != entry.nbytes or zlib.crc32(view) != entry.crc32:
            raise IntegrityError(f"{self.weights_path}: checksum mismatch in tensor {name} (block {entry.block}); "
                                 "the file is corrupted")

    def _check_block(self, block: BlockEntry, data: Any) -> None:
        crc = zlib.crc32(data)
        if crc != block.crc32:
            raise IntegrityError(f"{self.weights_path}: checksum mismatch in block {block.name} (bytes "
                                 f"{block.offset}..{block.offset + block.nbytes}): CRC-32 {crc:08x}, manifest says "
                                 f"{block.crc32:08x}; the file is corrupted")

    def _region(self, offset: int, nbytes: int) -> memoryview:
        if self._map is None:
            raise ModelFormatError(f"{self.weights_path}: the bundle is closed or has no weights")
        return memoryview(self._map)[offset:offset + nbytes]

    # -- memory-mapped views ------------------------------------------------------------------------

    def block_view(self, name: str) -> np.ndarray:
        """Read-only uint8 view of a whole block (padding included) in the memory map."""
        block = self.block(name)
        return np.frombuffer(self._region(block.offset, block.nbytes), dtype=np.uint8)

    def tensor(self, name: str) -> Tensor:
        """A tensor as a read-only zero-copy view of the memory map."""
        entry = self.tensors[name]
        block = self.blocks[entry.block]
        return _tensor_view(entry, self._region(block.offset, block.nbytes))

    def arena(self, layer: int) -> tuple[ArenaEntry, np.ndarray]:
        """(description, read-only uint8 [n_neurons, stride] view) of a layer's neuron arena."""
        block = self.arena_block(layer)
        return block.arena, _arena_view(block.arena, self._region(block.offset, block.nbytes))

    # -- positioned reads into caller buffers -------------------------------------------------------

    def read_block_into(self, name: str, buffer: Any, *, fd: int | None = None, verify: bool = False) -> int:
        """Read a whole block (padded size) into `buffer` (any writable buffer of at least
        `blocks[name].nbytes` bytes) with positioned reads; return the bytes read.

        `fd` lets the caller pass its own descriptor (e.g. opened with O_DIRECT; the buffer must
        then be aligned as the device requires). `verify` checks the block's CRC-32 after reading."""
        block = self.block(name)
        view = memoryview(buffer).cast("B")
        if view.readonly:
            raise ValueError("read_block_into needs a writable buffer")
        if len(view) < block.nbytes:
            raise ValueError(f"buffer holds {len(view)} bytes, block {name} needs {block.nbytes}")
        own_fd = fd is None
        fd = os.open(self.weights_path, os.O_RDONLY) if own_fd else fd
        try:
            done = 0
            while done < block.nbytes:
                n = os.preadv(fd, [view[done:block.nbytes]], block.offset + done)
                if n <= 0:
                    raise ModelFormatError(f"{self.weights_path}: file ended inside block {name} (read {done} of "
                                           f"{block.nbytes} bytes); the bundle was truncated")
                done += n
        finally:
            if own_fd:
                os.close(fd)
        if verify:
            self._check_block(block, view[:block.nbytes])
        return done

    def tensor_in(self, buffer: Any, name: str) -> Tensor:
        """A tensor as a view into a buffer that holds its block (as filled by read_block_into)."""
        entry = self.tensors[name]
        return _tensor_view(entry, memoryview(buffer).cast("B"))

    def arena_in(self, buffer: Any, layer: int) -> np.ndarray:
        """uint8 [n_neurons, stride] view of a layer's arena inside a buffer holding its block."""
        return _arena_view(self.arena_block(layer).arena, memoryview(buffer).cast("B"))

    # -- the rest -----------------------------------------------------------------------------------

    def tokenizer(self):
        from edgeflash.runtime.tokenizer.tokenizer import TABLES_FORMAT, Tokenizer

        tables = self.manifest.tokenizer_tables
        if tables is not None and tables.format == TABLES_FORMAT:
            return Tokenizer.from_tables(self._checked_file(TOKENIZER_TABLES_FILE, tables.nbytes, tables.crc32))
        path = self.path / TOKENIZER_FILE  # no tables, or another version's: build them
        try:
            return Tokenizer.from_dict(json.loads(path.read_text(encoding="utf-8")))
        except FileNotFoundError:
            raise ModelFormatError(f"{self.path}: the bundle has no {TOKENIZER_FILE}") from None
        except (ValueError, KeyError, TypeError) as e:
            raise ModelFormatError(f"{path}: not a valid tokenizer ({e})") from None


def _tensor_view(entry: TensorEntry, block_bytes: memoryview) -> Tensor:
    raw = np.frombuffer(block_bytes, dtype=np.uint8, count=entry.nbytes, offset=entry.offset)
    return Tensor(entry.name, entry.fmt, entry.shape, raw.reshape(entry.rows, -1))


def _arena_view(arena: ArenaEntry, block_bytes: memoryview) -> np.ndarray:
    raw = np.frombuffer(block_bytes, dtype=np.uint8, count=arena.nbytes, offset=arena.offset)
    return raw.reshape(arena.n_neurons, arena.stride)


def _compact_calibration(raw: dict[str, Any], manifest: Manifest, where: Path) -> None:
    """Per-neuron and per-token calibration arrays (and arena orders) as `array.array`s, from
    packed arrays (format 2) or JSON lists (format 1): as Python numbers they would cost ~36 bytes
    a value, several MB of a device's budget for SmolLM2's 46k neurons."""
    calibration = raw.get("calibration") or {}
    for section, typecodes in (("neurons", {"frequency": "f", "order": "i"}),
                               ("token_frequencies", {"ids": "i", "counts": "q", "frequencies": "f"})):
        part = calibration.get(section)
        if not isinstance(part, dict):
            continue
        for key, code in typecodes.items():
            if key in part:
                part[key] = _compacted(part[key], code, f"calibration.{section}.{key}", where)
    for block in raw["blocks"]:  # parse_manifest has read and checked every arena order already
        if block.get("arena"):
            block["arena"]["order"] = array("i", manifest.blocks[block["name"]].arena.order.tobytes())


def _compacted(values: Any, code: str, field: str, where: Path) -> Any:
    """A packed array or a list (of lists) of numbers as array(code), one per row for 2-D."""
    if is_packed(values):
        try:
            a = unpack_array(values, field).astype(code, copy=False)  # numpy reads array typecodes alike
        except ValueError as e:
            raise ModelFormatError(f"{where}: {e}") from None
        return [array(code, row.tobytes()) for row in a] if a.ndim == 2 else array(code, a.ravel().tobytes())
    if isinstance(values, list) and values and is_packed(values[0]):  # one packed array per row
        return [_compacted(row, code, f"{field}[{i}]", where) for i, row in enumerate(values)]
    try:
        if isinstance(values, list) and values and isinstance(values[0], list):
            return [array(code, row) for row in values]
        if isinstance(values, list):
            return array(code, values)
    except (TypeError, OverflowError):
        pass  # not plain numbers of that type: parse_manifest already judged the manifest
    return values


def load_bundle(path: str | Path, verify: bool = True):
    """A bundle directory as a ModelSource (kind "bundle"): tensors are zero-copy views of a
    read-only memory map of weights.bin; `info["manifest"]` is the parsed manifest and
    `info["bundle"]` the Bundle (block table, arenas, direct reads)."""
    from edgeflash.runtime.source import ModelSource, expected_tensor_names

    bundle = Bundle.open(path, verify=verify)
    raw = bundle.manifest.raw
    tensors = {name: bundle.tensor(name) for name in bundle.tensors}
    arenas = bundle.ffn_arenas()
    tensors.update(arenas)
    source = ModelSource(path=Path(path), kind="bundle", spec=bundle.spec, tokenizer=bundle.tokenizer(),
                         tensors=tensors,
                         info={"name": raw["model"].get("name") or Path(path).name, "manifest": raw,
                               "bundle": bundle, "file_bytes": bundle.manifest.weights_nbytes})
    # A layer whose FFN is its arena has no dense gate/up/down tensors.
    held = {name.split(".")[1] for name in arenas}  # layer numbers
    source.require([n for n in expected_tensor_names(bundle.spec)
                    if not (n.startswith("blk.") and n.split(".", 2)[2] in DENSE_NAMES and n.split(".")[1] in held)])
    return source
