"""Long numeric arrays inside manifest.json, packed: `{"dtype", "shape", "base64"}`.

Per-neuron calibration and arena orders run to ~100k numbers. As JSON lists, parsing them makes a
Python object per number; freed after compaction, they leave the interpreter's small-object
arenas fragmented, which measured 2.8 MiB of RSS for SmolLM2 (2.2 MiB for Gemma 3) that a device's
memory budget then has to pay for. Packed, each array is one string: little-endian values,
base64, `shape` in numpy order. Readers still take plain lists (bundles of format version 1).
"""

from __future__ import annotations

import base64
import binascii
import math
from typing import Any

import numpy as np

DTYPES = ("int32", "int64", "float32")


def pack_array(values: Any, dtype: str) -> dict[str, Any]:
    """`values` (array-like, any rank) as a packed-array JSON object of `dtype`."""
    if dtype not in DTYPES:
        raise ValueError(f"packed arrays are {', '.join(DTYPES)}, not {dtype}")
    a = np.ascontiguousarray(values, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "shape": list(a.shape), "base64": base64.b64encode(a.tobytes()).decode("ascii")}


def is_packed(value: Any) -> bool:
    return isinstance(value, dict) and set(value) == {"dtype", "shape", "base64"}


def unpack_array(value: Any, field: str) -> np.ndarray:
    """A packed-array object (or a plain JSON list) as a numpy array; ValueError naming `field`
    and what is wrong when it is neither."""
    if isinstance(value, list):
        return np.asarray(value)
    if not is_packed(value):
        raise ValueError(f"{field}: expected a list or a packed array {{dtype, shape, base64}}")
    dtype, shape = value["dtype"], value["shape"]
    if dtype not in DTYPES:
        raise ValueError(f"{field}.dtype = {dtype!r}: expected one of {', '.join(DTYPES)}")
    if not isinstance(shape, list) or not all(isinstance(n, int) and not isinstance(n, bool) and n >= 0
                                              for n in shape):
        raise ValueError(f"{field}.shape = {shape!r}: expected a list of integers >= 0")
    try:
        raw = base64.b64decode(value["base64"], validate=True)
    except (binascii.Error, TypeError, ValueError):
        raise ValueError(f"{field}.base64: not valid base64") from None
    item = np.dtype(dtype).newbyteorder("<")
    if len(raw) != math.prod(shape) * item.itemsize:
        raise ValueError(f"{field}: {len(raw)} bytes do not hold {dtype} values of shape {shape}")
    return np.frombuffer(raw, dtype=item).astype(dtype).reshape(shape)
