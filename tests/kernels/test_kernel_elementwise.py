"""RMSNorm, RoPE, gated activations, softmax, argmax and top-k against numpy."""

from __future__ import annotations

import edgeflash.kernels as K
import numpy as np
import pytest


@pytest.mark.parametrize("d", [1, 7, 640, 1001])
def test_rms_norm(d, isa, rng):
    x = rng.standard_normal((3, d)).astype(np.float32) * 3
    w = rng.standard_normal(d).astype(np.float32)
    want = x / np.sqrt(np.mean(x.astype(np.float64) ** 2, axis=1, keepdims=True) + 1e-6) * w
    np.testing.assert_allclose(K.rms_norm(x, w, 1e-6), want, rtol=1e-5, atol=1e-6)
    y = x.copy()
    assert K.rms_norm(y, w, 1e-6, out=y) is y
    np.testing.assert_allclose(y, want, rtol=1e-5, atol=1e-6)


def _rotate_half_rope(x, pos, rot, base, ff=None, scale=1.0):
    inv = base ** (-np.arange(0, rot, 2, dtype=np.float64) / rot)
    if ff is not None:
        inv = inv / ff
    ang = np.outer(pos / scale, inv)  # [n, rot/2]
    cos, sin = np.cos(ang)[:, None, :], np.sin(ang)[:, None, :]
    out = x.astype(np.float64).copy()
    x0, x1 = out[..., : rot // 2].copy(), out[..., rot // 2: rot].copy()
    out[..., : rot // 2] = x0 * cos - x1 * sin
    out[..., rot // 2: rot] = x0 * sin + x1 * cos
    return out


@pytest.mark.parametrize("rot,ff,scale", [(64, False, 1.0), (32, True, 1.0), (16, False, 8.0)])
def test_rope(rot, ff, scale, isa, rng):
    x = rng.standard_normal((4, 3, 64)).astype(np.float32)
    pos = np.array([0, 1, 511, 8191])
    factors = np.linspace(1, 8, rot // 2).astype(np.float32) if ff else None
    want = _rotate_half_rope(x, pos, rot, 10000.0, factors, scale)
    got = K.rope(x.copy(), pos, rot_dim=rot, theta_base=10000.0, freq_factors=factors, scale=scale)
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-5)


@pytest.mark.parametrize("act", ["silu", "gelu_tanh"])
def test_gated_act(act, isa, rng):
    g = rng.standard_normal(1000).astype(np.float32) * 5
    u = rng.standard_normal(1000).astype(np.float32)
    g64 = g.astype(np.float64)
    a = g64 / (1 + np.exp(-g64)) if act == "silu" else 0.5 * g64 * (1 + np.tanh(np.sqrt(2 / np.pi) * (g64 + 0.044715 * g64**3)))
    np.testing.assert_allclose(K.gated_act(g, u, act), a * u, rtol=1e-5, atol=1e-6)


def test_softmax_argmax_topk(isa, rng):
    x = np.round(rng.standard_normal((3, 1000)) * 4).astype(np.float32) / 4  # many ties
    e = np.exp(x - x.max(axis=1, keepdims=True))
    np.testing.assert_allclose(K.softmax(x), e / e.sum(axis=1, keepdims=True), rtol=1e-5, atol=1e-7)
    np.testing.assert_array_equal(K.argmax(x), np.argmax(x, axis=1))
    vals, idx = K.topk(x, 10)
    for r in range(3):
        order = sorted(range(1000), key=lambda i: (-x[r, i], i))[:10]
        np.testing.assert_array_equal(idx[r], order)
        np.testing.assert_array_equal(vals[r], x[r, order])


def test_argmax_topk_over_a_vocabulary(rng, threads):
    logits = rng.standard_normal(262144).astype(np.float32)
    logits[200000] = logits[100] = 9.0
    assert K.argmax(logits) == 100
    v, i = K.topk(logits, 3)
    assert list(i[:2]) == [100, 200000] and v[0] == 9.0
