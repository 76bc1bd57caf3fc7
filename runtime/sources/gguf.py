"""GGUF files: metadata and raw tensor blocks, read without trusting a byte of them.

Parsing follows the GGUF v2/v3 layout with the `gguf` package's type tables and dequantizers.
The header is read with our own small parser because `gguf.GGUFReader` needs ~8 s to open a
file with a 262k-token vocabulary (it builds a numpy view for every string); the test suite
checks that both read the same metadata and tensor table.

Every count and length is checked against the bytes left before anything is allocated for it,
nested arrays are read without recursion and only so deep, and the tensor table must describe
the data section exactly: each tensor aligned, inside the file, and the tensors laid end to end
(padded to the alignment) with no byte shared and none left over. A tensor whose type, shape or
offset was changed, or two tensors pointing at the same bytes, therefore fail here instead of
running on bytes that belong to something else. Checks that need the metadata's meaning (shapes
against the hyperparameters) live in `validate`.
"""

from __future__ import annotations

import hashlib
import json
import mmap
import os
import struct
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.base.printable import printable, quoted
from edgeflash.base.regular_files import open_regular
from edgeflash.kernels.formats import FORMAT_BY_GGML_TYPE
from edgeflash.runtime.sources.gguf_types import (
    ARRAY_TYPE,
    BLOCK_PREFIX,
    INTEGER_TYPES,
    NUMPY_TYPES,
    SCALAR_CODES,
    STRING_TYPE,
    type_name,
)
from edgeflash.runtime.sources.validate import (
    check_gguf_metadata,
    check_spec_against_file,
    check_tensor_shapes,
)
from edgeflash.runtime.tensors import Tensor

if TYPE_CHECKING:
    from edgeflash.runtime.source import ModelSource

GGUF_MAGIC = b"GGUF"
DEFAULT_ALIGNMENT = 32
MAX_ALIGNMENT = 1 << 20
MAX_ARRAY_DEPTH = 8  # an array of arrays of ... this many levels (real files use 1)
MAX_ARRAY_ITEMS = 1 << 23  # elements of one metadata array (a 262k vocabulary is 1 << 18)
MAX_METADATA_ITEMS = 1 << 24  # elements of all metadata arrays together
MAX_KEY_BYTES = (1 << 16) - 1
MAX_TENSOR_NAME_BYTES = 256
MAX_DIMS = 4

_SCALAR, _NUMPY, _STRING, _ARRAY = SCALAR_CODES, NUMPY_TYPES, STRING_TYPE, ARRAY_TYPE
_MIN_VALUE_BYTES = {**{t: np.dtype(d).itemsize for t, d in _NUMPY.items()}, _STRING: 8, _ARRAY: 12}
_MIN_KV_BYTES = 8 + 4 + 1  # key length, value type, the smallest value
_MIN_TENSOR_INFO_BYTES = 8 + 4 + 8 + 4 + 8  # name length, dims, one dim, type, offset


@dataclass(frozen=True)
class TensorInfo:
    name: str
    fmt: str
    shape: tuple[int, ...]  # numpy order: [rows, cols]; GGML's trailing dimensions of 1 dropped
    offset: int  # absolute byte offset in the file
    nbytes: int


def align_up(n: int, alignment: int) -> int:
    return -(-n // alignment) * alignment


class _Cursor:
    """Bounds-checked little-endian reads from a buffer; running off the end is a truncated file."""

    def __init__(self, buf: memoryview, path: Path):
        self.buf, self.pos, self.path = buf, 0, path
        self.items = 0  # metadata array elements read so far
        self.last_array_type = -1  # element type of the last array value read

    def fail(self, message: str) -> ModelFormatError:
        return ModelFormatError(f"{printable(self.path)}: {message}")

    def need(self, n: int, what: str) -> None:
        if self.pos + n > len(self.buf):
            raise self.fail(f"truncated GGUF file: {what} at byte {self.pos} needs {n} bytes, but the file ends at "
                            f"byte {len(self.buf)}")

    def unpack(self, code: str, what: str) -> Any:
        size = struct.calcsize("<" + code)
        self.need(size, what)
        value = struct.unpack_from("<" + code, self.buf, self.pos)[0]
        self.pos += size
        return value

    def raw_string(self, what: str, limit: int | None = None) -> bytes:
        n = self.unpack("Q", f"length of {what}")
        if limit is not None and n > limit:
            raise self.fail(f"{what} at byte {self.pos - 8} is {n} bytes long; at most {limit} are allowed")
        self.need(n, what)
        raw = bytes(self.buf[self.pos:self.pos + n])
        self.pos += n
        return raw

    def string(self, what: str, limit: int | None = None) -> str:
        at = self.pos
        raw = self.raw_string(what, limit)
        try:
            return raw.decode("utf-8")
        except UnicodeDecodeError:
            raise self.fail(f"{what} at byte {at} is not UTF-8 text: {quoted(raw, 60)}") from None

    def value(self, vtype: int, key: str) -> Any:
        if vtype in _SCALAR:
            return self.unpack(_SCALAR[vtype], f"value of {key}")
        if vtype == _STRING:
            return self.string(f"value of {key}")
        if vtype == _ARRAY:
            return self._array(key)
        raise self.fail(f"metadata key {quoted(key)} has value type {vtype}; expected 0-12")

    def _strings(self, items: list[str], count: int, key: str) -> None:
        """`count` strings of an array, appended to `items`. A tight loop: a vocabulary has hundreds
        of thousands, and temporaries made between them would stay behind in the heap."""
        buf, pos, end, unpack_from = self.buf, self.pos, len(self.buf), struct.unpack_from
        append = items.append
        for index in range(count):
            if pos + 8 > end:
                break
            n = unpack_from("<Q", buf, pos)[0]
            if pos + 8 + n > end:
                break
            try:
                append(str(buf[pos + 8:pos + 8 + n], "utf-8"))
            except UnicodeDecodeError:
                self.pos = pos
                raise self.fail(f"element {index} of {quoted(key)} at byte {pos} is not UTF-8 text: "
                                f"{quoted(bytes(buf[pos + 8:pos + 8 + min(n, 60)]), 60)}") from None
            pos += 8 + n
        else:
            self.pos = pos
            return
        self.pos = pos
        self.need(8 if pos + 8 > end else 8 + unpack_from("<Q", buf, pos)[0], f"element {index} of {key}")

    def _array_header(self, key: str, depth: int) -> tuple[int, int]:
        if depth > MAX_ARRAY_DEPTH:
            raise self.fail(f"metadata key {quoted(key)} nests arrays more than {MAX_ARRAY_DEPTH} levels deep")
        etype = self.unpack("I", f"array type of {key}")
        count = self.unpack("Q", f"array length of {key}")
        if etype not in _MIN_VALUE_BYTES:
            raise self.fail(f"metadata key {quoted(key)} is an array of value type {etype}; expected 0-12")
        if count > MAX_ARRAY_ITEMS:
            raise self.fail(f"metadata key {quoted(key)} is an array of {count} elements; at most {MAX_ARRAY_ITEMS} "
                            "are allowed")
        left = len(self.buf) - self.pos
        if count * _MIN_VALUE_BYTES[etype] > left:
            raise self.fail(f"truncated GGUF file: metadata key {quoted(key)} is an array of {count} "
                            f"{type_name(etype)} values, more than the {left} bytes left in the file can hold")
        self.items += count
        if self.items > MAX_METADATA_ITEMS:
            raise self.fail(f"the metadata arrays hold more than {MAX_METADATA_ITEMS} elements in all")
        return etype, count

    def _array(self, key: str) -> list[Any]:
        """An array value, nested arrays included, read with an explicit stack (no recursion)."""
        etype, count = self._array_header(key, 1)
        self.last_array_type = etype
        if etype != _ARRAY:
            return self._elements(etype, count, key)
        root: list[Any] = []
        stack = [(root, count)]  # (list being filled, arrays still to read into it)
        while stack:
            items, left = stack[-1]
            if left == 0:
                stack.pop()
                continue
            stack[-1] = (items, left - 1)
            child_type, child_count = self._array_header(key, len(stack) + 1)
            if child_type == _ARRAY:
                child: list[Any] = []
                items.append(child)
                stack.append((child, child_count))
            else:
                items.append(self._elements(child_type, child_count, key))
        return root

    def _elements(self, etype: int, count: int, key: str) -> list[Any]:
        """`count` scalars or strings (the header checked that the file can hold them)."""
        if etype in _NUMPY:
            dtype = np.dtype(_NUMPY[etype]).newbyteorder("<")
            values = np.frombuffer(self.buf, dtype=dtype, count=count, offset=self.pos).tolist()
            self.pos += count * dtype.itemsize
            return values
        items: list[str] = []
        self._strings(items, count, key)
        return items


class GGUFFile:
    """An opened GGUF file: `metadata` (plain Python values), `value_types` (each key's GGUF type;
    `array_types` the element type of array values), `tensors` (name -> TensorInfo) and zero-copy
    access to each tensor's raw blocks through a read-only memory map."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        shown = printable(self.path)
        fd = open_regular(self.path, "model file")
        try:
            self.file_size = os.fstat(fd).st_size
            if self.file_size < 24:
                raise ModelFormatError(f"{shown}: not a GGUF file (only {self.file_size} bytes)")
            self._map = mmap.mmap(fd, 0, access=mmap.ACCESS_READ)
        finally:
            os.close(fd)
        cur = _Cursor(memoryview(self._map), self.path)
        magic = bytes(cur.buf[:4])
        if magic != GGUF_MAGIC:
            raise ModelFormatError(f"{shown}: not a GGUF file (starts with {printable(repr(magic))}, expected b'GGUF')")
        cur.pos = 4
        self.version = cur.unpack("I", "version")
        if self.version not in (2, 3):
            raise UnsupportedModelError(f"{shown}: GGUF version {self.version} is not supported (2 or 3)")
        n_tensors = cur.unpack("Q", "tensor count")
        n_kv = cur.unpack("Q", "metadata count")
        left = self.file_size - cur.pos
        if n_kv * _MIN_KV_BYTES > left or n_tensors * _MIN_TENSOR_INFO_BYTES > left:
            raise cur.fail(f"the header lists {n_kv} metadata keys and {n_tensors} tensors, more than the "
                           f"{self.file_size} bytes of the file can hold")
        self.metadata: dict[str, Any] = {}
        self.value_types: dict[str, int] = {}
        self.array_types: dict[str, int] = {}
        for _ in range(n_kv):
            key = cur.string("metadata key", MAX_KEY_BYTES)
            if key in self.metadata:
                raise cur.fail(f"metadata key {quoted(key)} appears twice")
            vtype = cur.unpack("I", f"type of {key}")
            self.metadata[key] = cur.value(vtype, key)
            self.value_types[key] = vtype
            if vtype == _ARRAY:
                self.array_types[key] = cur.last_array_type
        self.metadata_end = cur.pos  # header and metadata end here; the tensor table follows
        infos = [self._tensor_info(cur) for _ in range(n_tensors)]
        self.alignment = self._alignment()
        self.data_start = align_up(cur.pos, self.alignment)
        self.tensors: dict[str, TensorInfo] = {}
        for name, fmt, shape, rel_offset, nbytes in infos:
            if name in self.tensors:
                raise cur.fail(f"tensor {quoted(name)} appears twice in the tensor table")
            if rel_offset % self.alignment:
                raise cur.fail(f"tensor {quoted(name)} starts at byte {rel_offset} of the data section, which is not a "
                               f"multiple of the alignment {self.alignment}")
            offset = self.data_start + rel_offset
            if offset + nbytes > self.file_size:
                raise cur.fail(f"truncated GGUF file: tensor {quoted(name)} needs bytes {offset}..{offset + nbytes} "
                               f"but the file has {self.file_size}")
            self.tensors[name] = TensorInfo(name, fmt, shape, offset, nbytes)
        self._check_layout(cur)
        # Every header value now lives in Python objects; the header's pages (a 151k-token
        # vocabulary and its merges are 6-8 MB) would otherwise count against a budget for as long as
        # the file is open. They are re-read from the file if ever touched again.
        self._drop_pages(0, self.data_start)

    def _tensor_info(self, cur: _Cursor) -> tuple[str, str, tuple[int, ...], int, int]:
        name = cur.string("tensor name", MAX_TENSOR_NAME_BYTES)
        shown = quoted(name)
        if not name:
            raise cur.fail(f"a tensor has an empty name (at byte {cur.pos - 8})")
        n_dims = cur.unpack("I", f"dimensions of {name}")
        if not 1 <= n_dims <= MAX_DIMS:
            raise cur.fail(f"tensor {shown} has {n_dims} dimensions (expected 1-{MAX_DIMS})")
        ne = [cur.unpack("Q", f"shape of {name}") for _ in range(n_dims)]
        ggml_type = cur.unpack("I", f"type of {name}")
        rel_offset = cur.unpack("Q", f"offset of {name}")
        fmt = FORMAT_BY_GGML_TYPE.get(ggml_type)
        if fmt is None:
            raise UnsupportedModelError(f"{printable(self.path)}: tensor {shown} has unknown GGML tensor type "
                                        f"{ggml_type}")
        if min(ne) < 1:
            raise cur.fail(f"tensor {shown} has shape {ne} (GGML order): every dimension must be at least 1")
        if ne[0] % fmt.block_elems:
            raise cur.fail(f"tensor {shown} has rows of {ne[0]} values, not a multiple of the {fmt.name} block size "
                           f"{fmt.block_elems}")
        rows = 1
        for d in ne[1:]:
            rows *= d
        nbytes = rows * fmt.row_bytes(ne[0])  # Python ints: no overflow, compared with the file size below
        if nbytes > self.file_size:
            raise cur.fail(f"tensor {shown} of shape {ne} (GGML order, {fmt.name}) would take {nbytes} bytes, more "
                           f"than the whole file ({self.file_size})")
        while len(ne) > 1 and ne[-1] == 1:  # [cols, rows, 1] is the matrix [cols, rows]
            ne.pop()
        return name, fmt.name, tuple(reversed(ne)), rel_offset, nbytes

    def _alignment(self) -> int:
        if "general.alignment" not in self.metadata:
            return DEFAULT_ALIGNMENT
        value, vtype = self.metadata["general.alignment"], self.value_types["general.alignment"]
        if vtype not in INTEGER_TYPES or not 8 <= value <= MAX_ALIGNMENT or value & (value - 1):
            raise ModelFormatError(f"{printable(self.path)}: general.alignment = {printable(repr(value), 60)} "
                                   f"({type_name(vtype)}): expected an integer power of two in 8..{MAX_ALIGNMENT}")
        return value

    def _check_layout(self, cur: _Cursor) -> None:
        """The tensors tile the data section: each starts where the one before it ends (padded to
        the alignment), from the section's first byte to the file's last."""
        expected, previous = 0, None
        for info in sorted(self.tensors.values(), key=lambda t: t.offset):
            start = info.offset - self.data_start
            if start < expected:
                raise cur.fail(f"tensor {quoted(info.name)} (bytes {start}..{start + info.nbytes} of the data section) "
                               f"overlaps tensor {quoted(previous.name)}, which ends at byte "
                               f"{previous.offset - self.data_start + previous.nbytes}: each tensor needs bytes of "
                               "its own")
            if start > expected:
                where = f"after tensor {quoted(previous.name)}" if previous else "at the start of the data section"
                raise cur.fail(f"{start - expected} bytes {where} belong to no tensor (the next, {quoted(info.name)}, "
                               f"starts at byte {start}): a tensor's type or shape does not match the bytes stored "
                               "for it")
            expected, previous = align_up(start + info.nbytes, self.alignment), info
        if previous is None:
            return
        end = previous.offset + previous.nbytes
        if self.file_size > align_up(end, self.alignment):
            raise cur.fail(f"{self.file_size - end} bytes after the last tensor ({quoted(previous.name)}, which ends at "
                           f"byte {end}) belong to no tensor: a tensor's type or shape does not match the bytes "
                           "stored for it")

    def block_count_of_tensors(self) -> int:
        """1 + the largest N of the `blk.N.` tensors (0 without any)."""
        found = [int(m.group(1)) for name in self.tensors if (m := BLOCK_PREFIX.match(name))]
        return max(found) + 1 if found else 0

    def drop_large_metadata(self, max_items: int = 1024) -> None:
        """Replace long arrays (vocabularies, merges) by their length, to free their memory."""
        for key, value in self.metadata.items():
            if isinstance(value, list) and len(value) > max_items:
                self.metadata[key] = f"<{len(value)} items>"

    @property
    def architecture(self) -> str:
        arch = self.metadata.get("general.architecture")
        if not isinstance(arch, str) or not arch:
            raise ModelFormatError(f"{printable(self.path)}: metadata has no general.architecture string")
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
        self._drop_pages(info.offset, info.offset + info.nbytes)

    def _drop_pages(self, begin: int, end: int) -> None:
        """Unmap the pages wholly inside bytes [begin, end): neighbours keep theirs."""
        page = mmap.PAGESIZE
        start = -(-begin // page) * page
        end = end // page * page
        if end > start and hasattr(mmap, "MADV_DONTNEED"):
            self._map.madvise(mmap.MADV_DONTNEED, start, end - start)


def read_metadata(path: str | Path) -> dict[str, Any]:
    """All key/value metadata of a GGUF file as plain Python values."""
    return GGUFFile(path).metadata


def tokenizer_fingerprint(metadata: dict[str, Any]) -> str:
    """A digest of every `tokenizer.*` value but chat templates: two files with the same one
    encode and decode alike (a model's chat template is applied by its own runs only)."""
    digest = hashlib.sha256()
    for key in sorted(k for k in metadata if k.startswith("tokenizer.") and not k.startswith("tokenizer.chat_template")):
        value = metadata[key]
        digest.update(json.dumps([key, type(value).__name__, value], default=repr).encode() + b"\n")
    return digest.hexdigest()


def load_gguf(path: str | Path, tokenizer_of: ModelSource | None = None) -> ModelSource:
    """A GGUF file as a ModelSource: spec from metadata, tokenizer from metadata, tensors
    zero-copy from the memory map (fixed to the canonical layout where a family needs it).
    Every field is checked (`validate`) before the spec, the tokenizer or a tensor is built.
    `tokenizer_of`: an opened model whose tokenizer is used when this file's tokenizer metadata
    is the same (building a 151k-token tokenizer only to drop it leaves megabytes of heap behind)."""
    from edgeflash.runtime.families import family_for_gguf_arch
    from edgeflash.runtime.source import ModelSource, expected_tensor_names
    from edgeflash.runtime.tokenizer import Tokenizer

    gguf_file = GGUFFile(path)
    where = printable(gguf_file.path)
    arch = gguf_file.architecture
    family = family_for_gguf_arch(arch, where)
    check_gguf_metadata(gguf_file, where)
    spec = family.spec_from_gguf(gguf_file.metadata, set(gguf_file.tensors), where)
    check_spec_against_file(spec, gguf_file, where)
    check_tensor_shapes(spec, {name: info.shape for name, info in gguf_file.tensors.items()}, where)
    fingerprint = tokenizer_fingerprint(gguf_file.metadata)
    if tokenizer_of is not None and tokenizer_of.info.get("tokenizer_fingerprint") == fingerprint:
        tokenizer = tokenizer_of.tokenizer
    else:
        try:
            tokenizer = Tokenizer.from_gguf_metadata(gguf_file.metadata)
        except ValueError as e:
            raise UnsupportedModelError(f"{where}: {printable(e, 400)}") from None
    gguf_file.drop_large_metadata()  # the vocabulary now lives in the tokenizer
    tensors, rewritten = {}, []
    for name in gguf_file.tensors:
        raw = gguf_file.tensor(name)
        tensors[name] = family.fix_gguf_tensor(raw, spec, arch)
        if tensors[name] is not raw:
            rewritten.append(name)  # its bytes in memory differ from the file's
            gguf_file.release(name)
    source = ModelSource(path=gguf_file.path, kind="gguf", spec=spec, tokenizer=tokenizer, tensors=tensors,
                         # The name is shown in banners and warnings: kept as visible text only.
                         info={"name": printable(gguf_file.metadata.get("general.name") or gguf_file.path.stem),
                               "file_bytes": gguf_file.file_size, "gguf": gguf_file,
                               "rewritten_tensors": rewritten, "tokenizer_fingerprint": fingerprint})
    source.require(expected_tensor_names(spec))
    return source
