"""GGUF's own tables, shared by the reader (`gguf`) and the field checks (`validate`): the
metadata value types and how a layer's tensors are named."""

from __future__ import annotations

import re

import numpy as np

# Metadata value type -> struct code (scalars) and numpy type (array elements).
SCALAR_CODES = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}
NUMPY_TYPES = {0: np.uint8, 1: np.int8, 2: np.uint16, 3: np.int16, 4: np.uint32, 5: np.int32, 6: np.float32,
               7: np.bool_, 10: np.uint64, 11: np.int64, 12: np.float64}
TYPE_NAMES = {0: "uint8", 1: "int8", 2: "uint16", 3: "int16", 4: "uint32", 5: "int32", 6: "float32", 7: "bool",
              8: "string", 9: "array", 10: "uint64", 11: "int64", 12: "float64"}
STRING_TYPE, ARRAY_TYPE, BOOL_TYPE = 8, 9, 7
INTEGER_TYPES = frozenset((0, 1, 2, 3, 4, 5, 10, 11))
FLOAT_TYPES = frozenset((6, 12))

BLOCK_PREFIX = re.compile(r"blk\.(0|[1-9][0-9]{0,5})\.")  # a layer's tensors: blk.N.<name>


def type_name(vtype: int) -> str:
    return TYPE_NAMES.get(vtype, f"unknown type {vtype}")
