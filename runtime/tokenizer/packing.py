"""One bytes object holding a tree of small values and large buffers, in this process only.

A tokenizer is built in two stages. Building makes many short-lived Python objects (the spec's
lists and dicts, numpy scratch arrays) while the caller's model metadata -- hundreds of
thousands of small objects -- is alive too. CPython's small-object allocator hands memory back
to the OS only in whole 1 MiB arenas, so every long-lived object created among those
temporaries keeps an arena, mostly empty, resident after they are freed. Hence: build, `pack`
the result into one bytes object (its memory comes from malloc, not from those arenas), drop
everything else, and only then `unpack` it into the objects the tokenizer keeps, all created
together in one burst.

Layout: 8-byte little-endian header length, the header (JSON of the tree with each buffer
replaced by a reference), then the buffers, each starting at a multiple of 8.
"""

from __future__ import annotations

import json
import struct
from array import array
from typing import Any

_BYTES = "$bytes"  # {"$bytes": [offset, length]}
_ARRAY = "$array"  # {"$array": [typecode, offset, length in bytes]}
_ALIGN = 8


def pack(tree: Any) -> bytes:
    """`tree`: dicts (str keys), lists, JSON scalars, and `bytes` / `array.array` leaves. Dicts
    must not use the keys "$bytes" or "$array" (keep foreign data in a JSON string leaf)."""
    buffers: list[bytes | memoryview] = []
    header = json.dumps(_references(tree, buffers), separators=(",", ":")).encode()
    header += b" " * (-(8 + len(header)) % _ALIGN)  # JSON ignores trailing spaces
    return b"".join([struct.pack("<Q", len(header)), header, *buffers])


def _references(node: Any, buffers: list[bytes | memoryview]) -> Any:
    """`node` with its buffers appended to `buffers` (each padded to _ALIGN) and replaced by
    references. (A plain recursive function: a nested one would be a reference cycle that
    keeps the buffers alive until the garbage collector runs.)"""
    if isinstance(node, (bytes, array)):
        data = node if isinstance(node, bytes) else memoryview(node).cast("B")  # no copy until the join
        start = sum(len(buffer) for buffer in buffers)
        buffers.append(data)
        if len(data) % _ALIGN:
            buffers.append(bytes(-len(data) % _ALIGN))
        return {_BYTES: [start, len(data)]} if isinstance(node, bytes) else {_ARRAY: [node.typecode, start, len(data)]}
    if isinstance(node, dict):
        return {key: _references(value, buffers) for key, value in node.items()}
    if isinstance(node, (list, tuple)):
        return [_references(value, buffers) for value in node]
    return node


def unpack(data: bytes) -> Any:
    """The tree `pack` was given, made of new objects: bytes and arrays are copies."""
    (header_length,) = struct.unpack_from("<Q", data)
    base = 8 + header_length
    view = memoryview(data)

    def restore(node: dict[str, Any]) -> Any:
        if _BYTES in node:
            start, length = node[_BYTES]
            return bytes(view[base + start:base + start + length])
        if _ARRAY in node:
            typecode, start, length = node[_ARRAY]
            values = array(typecode)
            values.frombytes(view[base + start:base + start + length])
            return values
        return node

    try:
        return json.loads(view[8:base].tobytes(), object_hook=restore)
    finally:
        view.release()
