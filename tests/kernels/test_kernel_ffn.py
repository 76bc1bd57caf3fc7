"""Sparse FFN on a neuron-bundle arena against a dense numpy FFN on the same neurons."""

from __future__ import annotations

import edgeflash.kernels as K
import numpy as np
import pytest


def _act(g, kind):
    if kind == "silu":
        return g / (1 + np.exp(-g))
    return 0.5 * g * (1 + np.tanh(np.sqrt(2 / np.pi) * (g + 0.044715 * g**3)))


@pytest.mark.parametrize("fmts", [("q8_0", "q8_0", "q8_0"), ("q4_0", "q4_1", "q5_0"), ("f16", "f32", "f16"),
                                  ("q4_lut", "q4_lut", "q8_0")])
@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_ffn_sparse_matches_dense_numpy(fmts, act, isa, threads, rng):
    d_model, d_ff, n_tok = 128, 300, 5
    gate = rng.standard_normal((d_ff, d_model)).astype(np.float32) * 0.1
    up = rng.standard_normal((d_ff, d_model)).astype(np.float32) * 0.1
    down = rng.standard_normal((d_model, d_ff)).astype(np.float32) * 0.1
    arena = K.pack_bundles(gate, up, down, *fmts, stride=K.bundle_bytes(d_model, *fmts) + 8)
    # the matrices as the arena holds them
    gq, uq, dq = (K.dequantize(np.ascontiguousarray(arena[:, o:o + K.row_bytes(f, d_model)]), f, d_model)
                  for o, f in zip(np.cumsum([0] + [K.row_bytes(f, d_model) for f in fmts[:2]]), fmts))
    slots = rng.choice(d_ff, size=120, replace=False).astype(np.int32)
    x = rng.standard_normal((n_tok, d_model)).astype(np.float32)
    h = _act(x @ gq[slots].T.astype(np.float64), act) * (x @ uq[slots].T)
    want = h @ dq[slots]
    mag = np.abs(h) @ np.abs(dq[slots]) + 1e-9
    got = K.ffn_sparse(arena, x, slots, d_model=d_model, gate_fmt=fmts[0], up_fmt=fmts[1], down_fmt=fmts[2], act=act)
    quantized = K.format_info(fmts[0]).quantized
    assert np.max(np.abs(got - want) / mag) < (5e-2 if quantized else 1e-5)

    # thresholds: skipping neurons whose |act(gate . x)| is small == keeping only the others
    mags = np.abs(_act(x[0] @ gq[slots].T.astype(np.float64), act))
    thr = np.full(1, np.median(mags), dtype=np.float32)
    keep = slots[mags >= thr[0]]
    sparse = K.ffn_sparse(arena, x[:1], slots, d_model=d_model, gate_fmt=fmts[0], up_fmt=fmts[1], down_fmt=fmts[2],
                          act=act, thresholds=thr)
    h1 = _act(x[:1] @ gq[keep].T.astype(np.float64), act) * (x[:1] @ uq[keep].T)
    want1 = h1 @ dq[keep]
    mag1 = np.abs(h1) @ np.abs(dq[keep]) + 1e-9
    # borderline neurons may flip under Q8 activations; compare loosely against the exact subset
    assert np.max(np.abs(sparse - want1) / mag1) < (0.2 if quantized else 1e-5)


def test_ffn_sparse_accumulates_into_out(rng):
    d_model = 64
    gate, up = (rng.standard_normal((10, d_model)).astype(np.float32) for _ in range(2))
    down = rng.standard_normal((d_model, 10)).astype(np.float32)
    arena = K.pack_bundles(gate, up, down, "f32", "f32", "f32")
    x = rng.standard_normal((2, d_model)).astype(np.float32)
    kw = dict(d_model=d_model, gate_fmt="f32", up_fmt="f32", down_fmt="f32")
    first = K.ffn_sparse(arena, x, [0, 1, 2], **kw)
    out = first.copy()
    K.ffn_sparse(arena, x, [3, 4], out=out, accumulate=True, **kw)
    np.testing.assert_allclose(out, K.ffn_sparse(arena, x, [0, 1, 2, 3, 4], **kw), rtol=1e-5, atol=1e-5)
    np.testing.assert_array_equal(K.ffn_sparse(arena, x, np.zeros(0, np.int32), **kw), 0.0)


@pytest.mark.parametrize("fmt", ["q5_0", "q4_0", "q8_0", "q4_1", "f16", "q4_lut"])
def test_matmul_columns_matches_numpy_and_is_batch_invariant(fmt, isa, threads, rng):
    """A bundle's down columns (row r = neuron r's column): y = h @ W, against the dequantized
    matrix; each token's row the same alone as in a batch of any size."""
    rows, cols, n = 300, 96, 20  # 3 blocks of 32: uneven splits; from 16 tokens rows are decoded once
    w = K.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, fmt)
    dense = K.dequantize(w, fmt, cols).astype(np.float64)
    h = rng.standard_normal((n, rows)).astype(np.float32)
    got = K.matmul_columns(w, fmt, h)
    mag = np.abs(h) @ np.abs(dense) + 1e-9
    assert np.max(np.abs(got - h @ dense) / mag) < 1e-5
    for t in range(n):
        assert np.array_equal(K.matmul_columns(w, fmt, h[t]), got[t])
    assert np.array_equal(K.matmul_columns(w, fmt, h[2:6]), got[2:6])
    assert np.array_equal(K.matmul_columns(w, fmt, h[1:18]), got[1:18])


@pytest.mark.parametrize("acts, tol", [("q8", 2e-2), ("q8x2", 2e-4)])
def test_matmul_columns_int8_coefficients(acts, tol, isa, threads, rng):
    """q8_0 columns with int8 coefficients: close to the float product (the int8 rounding of
    h x block scale per 32 rows), each token the same alone as in a batch; other formats refused."""
    rows, cols, n = 320, 96, 9
    w = K.quantize(rng.standard_normal((rows, cols)).astype(np.float32) * 0.1, "q8_0")
    dense = K.dequantize(w, "q8_0", cols).astype(np.float64)
    h = rng.standard_normal((n, rows)).astype(np.float32)
    got = K.matmul_columns(w, "q8_0", h, acts=acts)
    mag = np.abs(h) @ np.abs(dense) + 1e-9
    assert np.max(np.abs(got - h @ dense) / mag) < tol
    assert not np.array_equal(got, K.matmul_columns(w, "q8_0", h))  # not the float product
    for t in (0, n - 1):
        assert np.array_equal(K.matmul_columns(w, "q8_0", h[t], acts=acts), got[t])
    with pytest.raises(ValueError, match="int8"):
        K.matmul_columns(K.quantize(np.ones((64, 32), np.float32), "q4_0"), "q4_0", np.ones(64, np.float32), acts="q8")
    with pytest.raises(ValueError, match="acts"):
        K.matmul_columns(w, "q8_0", h, acts="int4")
