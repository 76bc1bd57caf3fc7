"""GGUF files: metadata and raw tensor blocks.

Parsing follows the GGUF v2/v3 layout with the `gguf` package's type tables and dequantizers.
The header is read with our own small parser because `gguf.GGUFReader` needs ~8 s to open a
file with a 262k-token vocabulary (it builds a numpy view for every string); the test suite
checks that both read the same metadata and tensor table.
"""

from __future__ import annotations

import mmap
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.kernels.formats import FORMAT_BY_GGML_TYPE
from edgeflash.runtime.tensors import Tensor

if TYPE_CHECKING:
    from edgeflash.runtime.source import ModelSource

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32

# GGUF metadata value types -> struct codes for scalars.
_SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
_NUMPY = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
          7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
_STRING, _ARRAY = 8, 9


@dataclass(frozen=True)
class TensorInfo:
    name: str
    fmt: str
    shape: tuple[int, ...]  # numpy order: [rows, cols]
    offset: int  # absolute byte offset in the file
    nbytes: int


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; running off the end is a truncated file."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise ModelFormatError(f"{self.path}: truncated GGUF file: {what} at byte {self.pos} runs past "
                                   f"the end of the file ({len(self.buf)} bytes)")

    def unpack(self, code: str, what: str) -> Any:
        size = struct.calcsize("<" + code)
        self.need(size, what)
        value = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += size
        return value

    def string(self, what: str) -> str:
        n = self.unpack("Q", what)
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], f"value of {key}")
        if vtype == _STRING:
            return self.string(f"value of {key}")
        if vtype == _ARRAY:
            etype = self.unpack("I", f"array type of {key}")
            count = self.unpack("Q", f"array length of {key}")
            if etype in _NUMPY:
                dtype = np.dtype(_NUMPY[etype])
                self.need(count * dtype.itemsize, f"array {key}")
                arr = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos)
                self.pos += count * dtype.itemsize
                return arr.tolist()
            return [self.value(etype, key) for _ in range(count)]
        raise ModelFormatError(f"{self.path}: metadata key {key!r} has unknown value type {vtype}")


class GGUFFile:
    """An opened GGUF file: `metadata` (plain Python values), `tensors` (name -> TensorInfo) and
    zero-copy access to each tensor's raw blocks through a read-only memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        if not self.path.is_file():
            raise ModelFormatError(f"{self.path}: no such file")
        self.file_size = self.path.stat().st_size
        if self.file_size < 24:
            raise ModelFormatError(f"{self.path}: not a GGUF file (only {self.file_size} bytes)")
        with open(self.path, "rb") as f:
            self._map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        cur = _Cursor(memoryview(self._map), self.path)
        magic = bytes(cur.buf[:4])
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"{self.path}: not a GGUF file (starts with {magic!r}, expected b'GGUF')")
        cur.pos = 4
        self.version = cur.unpack("I", "version")
        if self.version not in (2, 3):
            raise UnsupportedModelError(f"{self.path}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors = cur.unpack("Q", "tensor count")
        n_kv = cur.unpack("Q", "metadata count")
        self.metadata: dict[str, Any] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key")
            self.metadata[key] = cur.value(cur.unpack("I", f"type of {key}"), key)
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        alignment = int(self.metadata.get("general.alignment", DEFAULT_ALIGNMENT))
        data_start = -(-cur.pos // alignment) * alignment
        self.tensors: dict[str, TensorInfo] = {}
        for name, fmt, shape, rel_offset, nbytes in infos:
            offset = data_start + rel_offset
            if offset + nbytes > self.file_size:
                raise ModelFormatError(
                    f"{self.path}: truncated GGUF file: tensor {name} needs bytes {offset}..{offset + nbytes} "
                    f"but the file has {self.file_size}")
            self.tensors[name] = TensorInfo(name, fmt, shape, offset, nbytes)

    def _tensor_info(self, cur: _Cursor) -> tuple[str, str, tuple[int, ...], int, int]:
        name = cur.string("tensor name")
        n_dims = cur.unpack("I", f"dimensions of {name}")
        if not 1 <= n_dims <= 4:
            raise ModelFormatError(f"{self.path}: tensor {name} has {n_dims} dimensions (expected 1-4)")
        ne = [cur.unpack("Q", f"shape of {name}") for _ in range(n_dims)]
        ggml_type = cur.unpack("I", f"type of {name}")
        rel_offset = cur.unpack("Q", f"offset of {name}")
        fmt = FORMAT_BY_GGML_TYPE.get(ggml_type)
        if fmt is None:
            raise UnsupportedModelError(f"{self.path}: tensor {name} has unknown GGML tensor type {ggml_type}")
        if ne[0] % fmt.block_elems:
            raise ModelFormatError(f"{self.path}: tensor {name} has rows of {ne[0]} values, not a multiple of "
                                   f"the {fmt.name} block size {fmt.block_elems}")
        rows = int(np.prod(ne[1:])) if n_dims > 1 else 1
        nbytes = rows * fmt.row_bytes(ne[0])
        return name, fmt.name, tuple(reversed(ne)), rel_offset, nbytes

    def drop_large_metadata(self, max_items: int = 1024) -> None:
        """Replace long arrays (vocabularies, merges) by their length, to free their memory."""
        for key, value in self.metadata.items():
            if isinstance(value, list) and len(value) > max_items:
                self.metadata[key] = f"<{len(value)} items>"

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str):
            raise ModelFormatError(f"{self.path}: metadata has no general.architecture")
        return arch

    def tensor(self, name: str) -> Tensor:
        """The tensor's raw blocks as a read-only uint8 `[rows, row_bytes]` view of the file."""
        info = self.tensors[name]
        rows = int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1
        raw = np.frombuffer(self._map, dtype=np.uint8, count=info.nbytes, offset=info.offset)
        return Tensor(name, info.fmt, info.shape, raw.reshape(rows, -1))

    def release(self, name: str) -> None:
        """Drop a tensor's pages from this process's memory (they are re-read if used again).
        For tensors the loader copied in rewritten form: the file's pages, touched while
        rewriting, would otherwise stay resident next to the copy."""
        info = self.tensors[name]
        page = mmap.PAGESIZE
        start = -(-info.offset // page) * page  # pages wholly inside the tensor: neighbours keep theirs
        end = (info.offset + info.nbytes) // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values."""
    return GGUFFile(path).metadata


def load_gguf(path: str | Path) -> ModelSource:
    """A GGUF file as a ModelSource: spec from metadata, tokenizer from metadata, tensors
    zero-copy from the memory map (fixed to the canonical layout where a family needs it)."""
    from edgeflash.runtime.families import family_for_gguf_arch
    from edgeflash.runtime.source import ModelSource, expected_tensor_names
    from edgeflash.runtime.tokenizer import Tokenizer

    gguf_file = GGUFFile(path)
    where = str(gguf_file.path)
    arch = gguf_file.architecture
    family = family_for_gguf_arch(arch, where)
    spec = family.spec_from_gguf(gguf_file.metadata, set(gguf_file.tensors), where)
    try:
        tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
    except ValueError as e:
        raise UnsupportedModelError(f"{where}: {e}") from None
    gguf_file.drop_large_metadata()  # the vocabulary now lives in the tokenizer
    tensors, rewritten = {}, []
    for name in gguf_file.tensors:
        raw = gguf_file.tensor(name)
        tensors[name] = family.fix_gguf_tensor(raw, spec, arch)
        if tensors[name] is not raw:
            rewritten.append(name)  # its bytes in memory differ from the file's
            gguf_file.release(name)
    source = ModelSource(path=gguf_file.path, kind="gguf", spec=spec, tokenizer=tokenizer, tensors=tensors,
                         info={"name": gguf_file.metadata.get("general.name") or gguf_file.path.stem,
                               "file_bytes": gguf_file.file_size, "gguf": gguf_file,
                               "rewritten_tensors": rewritten})
    source.require(expected_tensor_names(spec))
    return source
