"""A GGUF file as the fuzzer sees it: the header's parts as raw bytes it can rewrite one by one,
and the tensor data copied from the original file with patches on top.

This reader is the fuzzer's own and trusts its input (it only ever opens the real, unmutated
model); mutations then edit the parts, and `write` lays them out again. Metadata values that
are not touched keep their original bytes, so a 262k-token vocabulary is never re-encoded.
"""

from __future__ import annotations

import copy
import os
import struct
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from edgeflash.kernels.formats import FORMAT_BY_GGML_TYPE

# GGUF metadata value types.
UINT8, INT8, UINT16, INT16, UINT32, INT32, FLOAT32, BOOL, STRING, ARRAY, UINT64, INT64, FLOAT64 = range(13)
SCALAR_CODES = {UINT8: "B", INT8: "b", UINT16: "H", INT16: "h", UINT32: "I", INT32: "i", FLOAT32: "f",
                BOOL: "?", UINT64: "Q", INT64: "q", FLOAT64: "d"}
INT_TYPES = (UINT8, INT8, UINT16, INT16, UINT32, INT32, UINT64, INT64)
FLOAT_TYPES = (FLOAT32, FLOAT64)


def encode_string(text: str | bytes) -> bytes:
    raw = text.encode() if isinstance(text, str) else text
    return struct.pack("<Q", len(raw)) + raw


def encode_scalar(vtype: int, value: Any) -> bytes:
    return struct.pack("<" + SCALAR_CODES[vtype], value)


def encode_value(vtype: int, value: Any) -> bytes:
    """The bytes of a value of `vtype` (without the type field). Arrays: value = (etype, items)."""
    if vtype in SCALAR_CODES:
        return encode_scalar(vtype, value)
    if vtype == STRING:
        return encode_string(value)
    if vtype == ARRAY:
        etype, items = value
        return struct.pack("<IQ", etype, len(items)) + b"".join(encode_value(etype, item) for item in items)
    raise ValueError(f"no encoding for value type {vtype}")


@dataclass
class KV:
    key: bytes
    vtype: int
    payload: bytes  # the value's bytes as they follow the type field

    def value(self) -> Any:
        """The decoded value of a scalar or string (arrays: None)."""
        if self.vtype in SCALAR_CODES:
            return struct.unpack_from("<" + SCALAR_CODES[self.vtype], self.payload)[0]
        if self.vtype == STRING:
            return self.payload[8:].decode("utf-8", errors="replace")
        return None

    def array_header(self) -> tuple[int, int]:
        """(element type, count) of an array value."""
        return struct.unpack_from("<IQ", self.payload)

    def encode(self) -> bytes:
        return encode_string(self.key) + struct.pack("<I", self.vtype) + self.payload

    @classmethod
    def make(cls, key: str | bytes, vtype: int, value: Any) -> KV:
        return cls(key.encode() if isinstance(key, str) else key, vtype, encode_value(vtype, value))


@dataclass
class TensorEntry:
    name: bytes
    dims: list[int]  # GGML order: dims[0] is the row length
    ggml_type: int
    offset: int  # relative to the start of the data section
    n_dims: int | None = None  # None: len(dims); set to write a count that disagrees

    @property
    def nbytes(self) -> int:
        fmt = FORMAT_BY_GGML_TYPE[self.ggml_type]
        rows = 1
        for d in self.dims[1:]:
            rows *= d
        return rows * fmt.row_bytes(self.dims[0])

    def encode(self) -> bytes:
        n_dims = len(self.dims) if self.n_dims is None else self.n_dims
        return (encode_string(self.name) + struct.pack("<I", n_dims & 0xFFFFFFFF)
                + b"".join(struct.pack("<Q", d & 0xFFFFFFFFFFFFFFFF) for d in self.dims)
                + struct.pack("<IQ", self.ggml_type & 0xFFFFFFFF, self.offset & 0xFFFFFFFFFFFFFFFF))


@dataclass
class GGUFImage:
    source: Path
    version: int
    kvs: list[KV]
    tensors: list[TensorEntry]
    data_start: int  # where the data section starts in `source`
    data_size: int
    alignment: int  # the alignment the data section is laid out with when written
    magic: bytes = b"GGUF"
    n_tensors: int | None = None  # None: len(tensors)
    n_kv: int | None = None  # None: len(kvs)
    header_padding: int = 0  # extra zero bytes between the header and the data section
    patches: list[tuple[int, bytes]] = field(default_factory=list)  # (offset in the data section, bytes)
    append: bytes = b""
    truncate: int | None = None  # cut the written file to this many bytes

    @classmethod
    def read(cls, path: Path) -> GGUFImage:
        data = Path(path).read_bytes()
        pos = 0

        def take(code: str) -> Any:
            nonlocal pos
            value = struct.unpack_from("<" + code, data, pos)[0]
            pos += struct.calcsize("<" + code)
            return value

        def take_string() -> bytes:
            nonlocal pos
            n = take("Q")
            pos += n
            return data[pos - n:pos]

        def skip_value(vtype: int) -> None:
            nonlocal pos
            if vtype in SCALAR_CODES:
                pos += struct.calcsize("<" + SCALAR_CODES[vtype])
            elif vtype == STRING:
                take_string()
            else:
                etype, count = take("I"), take("Q")
                if etype in SCALAR_CODES:
                    pos += count * struct.calcsize("<" + SCALAR_CODES[etype])
                else:
                    for _ in range(count):
                        skip_value(etype)

        if data[:4] != b"GGUF":
            raise ValueError(f"{path} is not a GGUF file")
        pos = 4
        version, n_tensors, n_kv = take("I"), take("Q"), take("Q")
        kvs = []
        for _ in range(n_kv):
            key = take_string()
            vtype = take("I")
            start = pos
            skip_value(vtype)
            kvs.append(KV(key, vtype, data[start:pos]))
        tensors = []
        for _ in range(n_tensors):
            name = take_string()
            n_dims = take("I")
            dims = [take("Q") for _ in range(n_dims)]
            tensors.append(TensorEntry(name, dims, take("I"), take("Q")))
        alignment = 32
        for kv in kvs:
            if kv.key == b"general.alignment":
                alignment = kv.value()
        data_start = -(-pos // alignment) * alignment
        return cls(Path(path), version, kvs, tensors, data_start, len(data) - data_start, alignment)

    def clone(self) -> GGUFImage:
        twin = copy.copy(self)
        twin.kvs = list(self.kvs)  # KV and TensorEntry objects are replaced, never edited in place
        twin.tensors = list(self.tensors)
        twin.patches = list(self.patches)
        return twin

    # -- lookups ------------------------------------------------------------------------------------

    def kv_index(self, key: str) -> int | None:
        raw = key.encode()
        return next((i for i, kv in enumerate(self.kvs) if kv.key == raw), None)

    def kv(self, key: str) -> KV | None:
        index = self.kv_index(key)
        return None if index is None else self.kvs[index]

    def tensor_index(self, name: str) -> int:
        raw = name.encode()
        return next(i for i, t in enumerate(self.tensors) if t.name == raw)

    @property
    def architecture(self) -> str:
        return self.kv("general.architecture").value()

    # -- writing ------------------------------------------------------------------------------------

    def header(self) -> bytes:
        n_tensors = len(self.tensors) if self.n_tensors is None else self.n_tensors
        n_kv = len(self.kvs) if self.n_kv is None else self.n_kv
        parts = [self.magic, struct.pack("<IQQ", self.version & 0xFFFFFFFF, n_tensors & 0xFFFFFFFFFFFFFFFF,
                                         n_kv & 0xFFFFFFFFFFFFFFFF)]
        parts += [kv.encode() for kv in self.kvs]
        parts += [t.encode() for t in self.tensors]
        return b"".join(parts)

    def write(self, out: Path) -> Path:
        """Lay the file out: header, zero padding to `alignment`, the data section, patches."""
        header = self.header()
        data_at = -(-len(header) // self.alignment) * self.alignment + self.header_padding
        with open(self.source, "rb") as src, open(out, "wb") as dst:
            dst.write(header + bytes(data_at - len(header)))
            dst.flush()  # the copy below writes at the descriptor's position
            copied, remaining = 0, self.data_size
            while remaining:
                n = os.sendfile(dst.fileno(), src.fileno(), self.data_start + copied, remaining)
                if n == 0:
                    break
                copied, remaining = copied + n, remaining - n
            for offset, raw in self.patches:
                dst.seek(data_at + offset)
                dst.write(raw)
            dst.seek(0, os.SEEK_END)
            dst.write(self.append)
            if self.truncate is not None:
                dst.truncate(self.truncate)
        return out


def write_gguf(out: Path, kvs: list[KV], tensors: list[tuple[str, list[int], int, bytes]],
               alignment: int = 32) -> Path:
    """A new GGUF file from metadata and (name, GGML dims, GGML type, bytes) tensors, each padded
    to `alignment` as llama.cpp writes them."""
    entries, blobs, offset = [], [], 0
    for name, dims, ggml_type, raw in tensors:
        entries.append(TensorEntry(name.encode(), list(dims), ggml_type, offset))
        padded = raw + bytes(-len(raw) % alignment)
        blobs.append(padded)
        offset += len(padded)
    image = GGUFImage(Path(out), 3, kvs, entries, 0, 0, alignment)
    header = image.header()
    with open(out, "wb") as f:
        f.write(header + bytes(-len(header) % alignment))
        f.writelines(blobs)
    return Path(out)
