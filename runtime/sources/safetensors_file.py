"""Read `.safetensors` files with numpy only (8-byte header length, JSON header, raw data).

The header is untrusted: its size is bounded, its JSON nesting limited, and every entry's
dtype, shape and data range checked, the ranges tiling the data section with no byte shared
and none left over (the format's own rule), before any tensor is viewed.
"""

from __future__ import annotations

import mmap
import os
import struct
from pathlib import Path

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError
from edgeflash.base.printable import printable, quoted
from edgeflash.base.regular_files import open_regular, parse_json

# safetensors dtype -> (edgeflash format name, bytes per element)
_DTYPES = {"F32": ("f32", 4), "F16": ("f16", 2), "BF16": ("bf16", 2)}
MAX_HEADER_BYTES = 100_000_000


def read_safetensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """name -> (format, shape, raw uint8 bytes as a read-only view of the file)."""
    shown = printable(path)
    fd = open_regular(path, "safetensors file")
    try:
        size = os.fstat(fd).st_size
        head = os.pread(fd, 8, 0)
        if len(head) < 8:
            raise ModelFormatError(f"{shown}: not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8 or header_len > MAX_HEADER_BYTES:
            raise ModelFormatError(f"{shown}: not a safetensors file (header length {header_len}, file {size} bytes)")
        try:
            header = parse_json(os.pread(fd, header_len, 8))
        except ValueError as e:
            raise ModelFormatError(f"{shown}: safetensors header is not valid JSON ({printable(e)})") from None
        if not isinstance(header, dict):
            raise ModelFormatError(f"{shown}: safetensors header is a JSON {type(header).__name__}; expected an object")
        mapped = mmap.mmap(fd, 0, access=mmap.ACCESS_READ) if size > 8 + header_len else None
    finally:
        os.close(fd)
    base = 8 + header_len
    entries = []
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        entries.append(_entry(shown, name, entry, size - base))
    expected = 0
    for name, fmt, shape, start, end in sorted(entries, key=lambda e: (e[3], e[4])):
        if start != expected:
            what = "overlaps the tensor before it" if start < expected else "leaves bytes before it that belong to no tensor"
            raise ModelFormatError(f"{shown}: tensor {quoted(name)} (bytes {start}..{end}) {what}")
        expected = end
    if expected != size - base:
        raise ModelFormatError(f"{shown}: the tensors cover {expected} bytes of the {size - base}-byte data section")
    return {name: (fmt, shape, np.frombuffer(mapped, dtype=np.uint8, count=end - start, offset=base + start)
                   if end > start else np.zeros(0, np.uint8))
            for name, fmt, shape, start, end in entries}


def _entry(shown: str, name: str, entry: object, data_bytes: int) -> tuple[str, str, tuple[int, ...], int, int]:
    if not isinstance(entry, dict):
        raise ModelFormatError(f"{shown}: tensor {quoted(name)} is described by {printable(repr(entry), 60)}; expected "
                               "an object with dtype, shape and data_offsets")
    dtype = entry.get("dtype")
    if dtype not in _DTYPES:
        raise UnsupportedModelError(f"{shown}: tensor {quoted(name)} has dtype {printable(repr(dtype), 40)}; "
                                    f"supported: {', '.join(_DTYPES)}")
    fmt, itemsize = _DTYPES[dtype]
    shape, offsets = entry.get("shape"), entry.get("data_offsets")
    if not isinstance(shape, list) or len(shape) > 8 or not all(type(d) is int and d >= 0 for d in shape):
        raise ModelFormatError(f"{shown}: tensor {quoted(name)} has shape {printable(repr(shape), 60)}; expected a "
                               "list of at most 8 integers >= 0")
    if (not isinstance(offsets, list) or len(offsets) != 2 or not all(type(o) is int for o in offsets)
            or not 0 <= offsets[0] <= offsets[1] <= data_bytes):
        raise ModelFormatError(f"{shown}: tensor {quoted(name)} has data_offsets {printable(repr(offsets), 60)}; "
                               f"expected [start, end] with 0 <= start <= end <= {data_bytes}")
    count = 1
    for d in shape:
        count *= d
    start, end = offsets
    if end - start != count * itemsize:
        raise ModelFormatError(f"{shown}: tensor {quoted(name)} data range {start}..{end} does not fit shape "
                               f"{tuple(shape)} of {dtype}")
    return name, fmt, tuple(shape), start, end
