"""Packed arrays in manifest.json: exact round trips, and a clear error for each kind of damage."""

from __future__ import annotations

import numpy as np
import pytest
from edgeflash.runtime.bundle.packed import is_packed, pack_array, unpack_array


@pytest.mark.parametrize("dtype", ["int32", "int64", "float32"])
@pytest.mark.parametrize("shape", [(0,), (7,), (3, 5)])
def test_round_trip_is_exact(dtype, shape):
    rng = np.random.default_rng(0)
    values = (rng.standard_normal(shape) * 1e6).astype(dtype)
    packed = pack_array(values, dtype)
    assert is_packed(packed) and packed["shape"] == list(shape)
    back = unpack_array(packed, "x")
    assert back.dtype == np.dtype(dtype) and back.shape == shape
    assert np.array_equal(back, values)
    back[...] = 0  # a private, writable copy


def test_plain_lists_still_read():
    assert np.array_equal(unpack_array([[1, 2], [3, 4]], "x"), np.array([[1, 2], [3, 4]]))


@pytest.mark.parametrize("edit,fragment", [
    (lambda p: p.update(dtype="float16"), r"calib\.order\.dtype = 'float16': expected one of"),
    (lambda p: p.update(shape=[2, -1]), r"calib\.order\.shape = \[2, -1\]: expected a list of integers"),
    (lambda p: p.update(shape=[4]), r"calib\.order: 24 bytes do not hold int32 values of shape \[4\]"),
    (lambda p: p.update(base64="!!"), r"calib\.order\.base64: not valid base64"),
    (lambda p: p.pop("shape"), r"calib\.order: expected a list or a packed array"),
])
def test_damage_is_named(edit, fragment):
    packed = pack_array([5, 4, 3, 2, 1, 0], "int32")
    edit(packed)
    with pytest.raises(ValueError, match=fragment):
        unpack_array(packed, "calib.order")


def test_unknown_dtype_is_refused_when_packing():
    with pytest.raises(ValueError, match="not float16"):
        pack_array([1.0], "float16")
