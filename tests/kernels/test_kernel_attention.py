"""Attention over f16 / q8_0 KV caches against a numpy implementation of the stated rule."""

from __future__ import annotations

import edgeflash.kernels as K
import numpy as np
import pytest


def _numpy_attention(q, kf, vf, slot_pos, q_pos, scale, window, mask, softcap):
    n_q, n_heads, hd = q.shape
    n_kv = kf.shape[0]
    group = n_heads // n_kv
    out = np.zeros_like(q, dtype=np.float64)
    for i in range(n_q):
        vis = (slot_pos >= 0) & (slot_pos <= q_pos[i])
        if window:
            vis &= q_pos[i] - slot_pos < window
        if mask is not None:
            vis &= mask[i]
        if not vis.any():
            continue
        for h in range(n_heads):
            s = (kf[h // group, vis] @ q[i, h].astype(np.float64)) * scale
            if softcap:
                s = softcap * np.tanh(s / softcap)
            p = np.exp(s - s.max())
            out[i, h] = (p / p.sum()) @ vf[h // group, vis]
    return out


def _cache_floats(k, fmt, hd):
    if fmt == "f16":
        return k.astype(np.float64)
    n_kv, cap, _ = k.shape
    return K.dequantize(k.reshape(n_kv * cap, -1), "q8_0", hd).reshape(n_kv, cap, hd).astype(np.float64)


@pytest.mark.parametrize("fmt", ["f16", "q8_0"])
@pytest.mark.parametrize("n_kv,n_heads,hd,cap,n_q,window,use_mask,softcap", [
    (1, 4, 256, 300, 1, 0, False, 0.0),     # Gemma 3 decode
    (1, 4, 256, 300, 4, 512, True, 0.0),    # tree verify inside a sliding window layer
    (3, 9, 64, 100, 5, 0, True, 0.0),       # SmolLM2 GQA, 5 verified tokens
    (2, 2, 128, 70, 3, 9, False, 50.0),     # window edge, softcap
])
def test_attention_matches_numpy(fmt, n_kv, n_heads, hd, cap, n_q, window, use_mask, softcap, isa, threads, rng):
    k, v, slot_pos = K.new_kv_cache(n_kv, cap, hd, fmt)
    n_pos = cap + cap // 2  # written as a ring buffer: the oldest positions are overwritten
    for p0 in range(0, n_pos, 16):
        pos = np.arange(p0, min(p0 + 16, n_pos))
        kv = rng.standard_normal((2, len(pos), n_kv, hd)).astype(np.float32)
        K.kv_write(k, v, slot_pos, kv[0], kv[1], pos % cap, pos)
    assert sorted(slot_pos) == list(range(n_pos - cap, n_pos))
    slot_pos[::13] = -1  # holes
    q_pos = np.array([n_pos - 1 - 2 * (n_q - 1 - i) for i in range(n_q)], dtype=np.int32)
    if n_q > 2:
        q_pos[1] = n_pos - cap - 3  # older than every cached key: sees nothing
    mask = rng.random((n_q, cap)) > 0.3 if use_mask else None
    q = rng.standard_normal((n_q, n_heads, hd)).astype(np.float32)
    scale = hd ** -0.5
    got = K.attention(q, k, v, slot_pos, q_pos, scale=scale, window=window, mask=mask, softcap=softcap)
    want = _numpy_attention(q, _cache_floats(k, fmt, hd), _cache_floats(v, fmt, hd), slot_pos, q_pos, scale, window,
                            mask, softcap)
    np.testing.assert_allclose(got, want, rtol=0, atol=2e-5)
    if n_q > 2:
        assert not got[1].any()


def test_kv_write_converts_to_the_cache_format(rng):
    k, v, sp = K.new_kv_cache(2, 8, 64, "q8_0")
    x = rng.standard_normal((3, 2, 64)).astype(np.float32)
    K.kv_write(k, v, sp, x, -x, [5, 0, 7], [10, 11, 12])
    assert list(sp) == [11, -1, -1, -1, -1, 10, -1, 12]
    back = K.dequantize(k.reshape(16, -1), "q8_0", 64).reshape(2, 8, 64)
    np.testing.assert_allclose(back[:, 5], x[0], atol=np.abs(x).max() / 127)
    kh, vh, sph = K.new_kv_cache(2, 8, 64, "f16")
    K.kv_write(kh, vh, sph, x, -x, [1, 2, 3], [0, 1, 2])
    np.testing.assert_array_equal(vh[:, 2], (-x[1]).astype(np.float16))
