"""Read `.safetensors` files with numpy only (8-byte header length, JSON header, raw data)."""

from __future__ import annotations

import json
import mmap
import struct
from pathlib import Path

import numpy as np
from edgeflash.base.errors import ModelFormatError, UnsupportedModelError

# safetensors dtype -> (edgeflash format name, bytes per element)
_DTYPES = {"F32": ("f32", 4), "F16": ("f16", 2), "BF16": ("bf16", 2)}


def read_safetensors(path: Path) -> dict[str, tuple[str, tuple[int, ...], np.ndarray]]:
    """name -> (format, shape, raw uint8 bytes as a read-only view of the file)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        if len(head) < 8:
            raise ModelFormatError(f"{path}: not a safetensors file (only {size} bytes)")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > size - 8 or header_len > 100_000_000:
            raise ModelFormatError(f"{path}: not a safetensors file (header length {header_len}, file {size} bytes)")
        try:
            header = json.loads(f.read(header_len))
        except ValueError as e:
            raise ModelFormatError(f"{path}: safetensors header is not valid JSON ({e})") from None
        mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
    base = 8 + header_len
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        dtype = entry.get("dtype")
        if dtype not in _DTYPES:
            raise UnsupportedModelError(f"{path}: tensor {name} has dtype {dtype}; supported: {', '.join(_DTYPES)}")
        fmt, itemsize = _DTYPES[dtype]
        start, end = entry["data_offsets"]
        shape = tuple(int(d) for d in entry["shape"])
        if end - start != int(np.prod(shape, dtype=np.int64)) * itemsize or base + end > size:
            raise ModelFormatError(f"{path}: tensor {name} data range {start}..{end} does not fit shape {shape} "
                                   f"or runs past the end of the file")
        out[name] = (fmt, shape, np.frombuffer(mapped, dtype=np.uint8, count=end - start, offset=base + start))
    return out
