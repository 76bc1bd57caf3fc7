"""The kivi2 KV cache (KIVI's 2-bit keys per channel, values per token, the newest positions and
the first block in q8_0) against a numpy implementation of the same quantization: what attention
reads must match it bit for bit, and attention over the cache must equal f16 attention over
those values."""

from __future__ import annotations

import edgeflash.kernels as K
import numpy as np
import pytest

G, W = K.KIVI["group"], K.KIVI["max_write"]
KEY_BITS, KEY_BITS_MAX = K.KIVI["key_bits"], K.KIVI["key_bits_max"]
# Candidate steps per bit count (multiples of the RMS) and a Gaussian's squared error per bit count.
STEP_MULTS = np.array([[1.0] * 7, [1.2, 1.4, 1.5, 1.6, 1.7, 1.8, 2.0],
                       [0.75, 0.875, 1.0, 1.125, 1.25, 1.5, 1.75], [0.45, 0.5, 0.55, 0.6, 0.65, 0.7, 0.8],
                       [0.26, 0.3, 0.32, 0.34, 0.36, 0.4, 0.46]], np.float32)
ERROR = np.array([1.0, 0.3634, 0.1175, 0.03744, 0.01154], np.float32)


def _quantize_groups(x: np.ndarray) -> np.ndarray:
    """Asymmetric 2-bit round-to-nearest along the last axis (groups of G): scale and minimum are
    rounded to f16 first and the codes fit to them; returns the f16 values attention reads."""
    lo, hi = x.min(-1, keepdims=True), x.max(-1, keepdims=True)
    d = ((hi - lo) / np.float32(3)).astype(np.float16).astype(np.float32)
    m = lo.astype(np.float16).astype(np.float32)
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    q = np.clip(np.rint((x - m) * inv), 0, 3).astype(np.float32)
    return (m + d * q).astype(np.float16)


def _hadamard(x: np.ndarray) -> np.ndarray:
    """The orthonormal Walsh-Hadamard transform along the last axis (G values), in float32 with
    the kernel's butterfly order."""
    x = x.astype(np.float32).copy()
    length = 1
    while length < G:
        for i in range(0, G, 2 * length):
            a, b = x[..., i:i + length].copy(), x[..., i + length:i + 2 * length].copy()
            x[..., i:i + length], x[..., i + length:i + 2 * length] = a + b, a - b
        length *= 2
    return x * np.float32(1 / np.sqrt(G))


def _ordered_sum(x: np.ndarray) -> np.ndarray:
    """Sum along the last axis one value after the other (the kernel's float order)."""
    s = np.zeros(x.shape[:-1], np.float32)
    for t in range(x.shape[-1]):
        s = s + x[..., t]
    return s


def _f16(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float16).astype(np.float32)


def _codes(y: np.ndarray, d: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """The codes 0..2^bits-1 of the levels (code - offset) * d nearest y (bits [..., 1] per channel)."""
    inv = np.where(d > 0, np.float32(1) / np.where(d > 0, d, np.float32(1)), np.float32(0)).astype(np.float32)
    top = (2 ** bits - 1).astype(np.float32)
    return np.clip(np.floor(y * inv) + ((2 ** bits) // 2).astype(np.float32), 0, top).astype(np.float32)


def _allocate_bits(x: np.ndarray, t0: int) -> np.ndarray:
    """x [..., hd, G]: a head's first stored block of unrotated keys -> bits per channel: one bit at
    a time to the channel where it cuts (mean square over positions t0..) * ERROR[b] most, the first
    such channel on ties, at most KEY_BITS_MAX, KEY_BITS on average."""
    xs = x[..., t0:].astype(np.float64)
    sq = np.zeros(xs.shape[:-1])
    for t in range(xs.shape[-1]):  # the kernel's order, in double
        sq = sq + xs[..., t] * xs[..., t]
    mean_square = (sq / np.float64(xs.shape[-1])).astype(np.float32)
    hd = x.shape[-2]
    bits = np.zeros(mean_square.shape, np.int64).reshape(-1, hd)
    for row, v in zip(bits, mean_square.reshape(-1, hd)):
        for _ in range(KEY_BITS * hd):
            capped = np.minimum(row, KEY_BITS_MAX - 1)
            gain = np.where(row < KEY_BITS_MAX, v * (ERROR[capped] - ERROR[capped + 1]), np.float32(-np.inf))
            row[int(np.argmax(gain))] += 1
    return bits.reshape(mean_square.shape)


def _quantize_key_channels(x: np.ndarray, bits: np.ndarray) -> np.ndarray:
    """x [..., G]: one key channel over a block's positions, bits [...] its code bits -> what the
    store gives back: an f16 mean, the Hadamard transform of the rest on the levels
    (code - (2^bits - 1) / 2) * step with the f16 step among multiples of its RMS of least squared
    error (0 bits: the mean alone), transformed back."""
    b = bits[..., None]
    m = _f16(_ordered_sum(x) / np.float32(G))[..., None]
    y = _hadamard(x - m)
    rms = np.sqrt(_ordered_sum(y * y) / np.float32(G))[..., None]
    d, best = np.where(b > 0, _f16(rms), np.float32(0)), np.full(rms.shape, np.inf, np.float32)
    offset = ((2 ** b - 1) / 2).astype(np.float32)
    for i in range(STEP_MULTS.shape[1]):
        td = _f16(STEP_MULTS[b, i] * rms)
        r = y - (_codes(y, td, b) - offset) * td
        err = _ordered_sum(r * r)[..., None]
        better = (err < best) & (b > 0)
        d, best = np.where(better, td, d), np.where(better, err, best)
    return _hadamard((_codes(y, d, b) - offset) * d) + m


def _q8(x: np.ndarray) -> np.ndarray:
    """x [..., hd] through a q8_0 row (the ring and the sink), as float32."""
    hd = x.shape[-1]
    rows = x.reshape(-1, hd)
    return K.dequantize(K.quantize(rows, "q8_0"), "q8_0", hd).reshape(x.shape).astype(np.float32)


def _angles(positions: np.ndarray, rope: tuple[int, float]) -> tuple[np.ndarray, np.ndarray]:
    """float32 cos and sin [len(positions), rot_dim / 2] of NeoX RoPE, computed in double."""
    rot_dim, theta = rope
    inv_freq = np.float64(np.float32(theta)) ** (-2.0 * np.arange(rot_dim // 2) / rot_dim)
    a = positions.astype(np.float64)[:, None] * inv_freq[None, :]
    return np.cos(a).astype(np.float32), np.sin(a).astype(np.float32)


def _keys_through_store(k16: np.ndarray, first: int, rope: tuple[int, float] | None) -> np.ndarray:
    """k16 [n, n_kv, hd] float32: the keys of positions first.. (whole blocks) -> what a read gives."""
    n, n_kv, hd = k16.shape
    half = rope[0] // 2 if rope else 0
    x = k16.copy()
    if half:  # unrotated before quantizing
        c, s = _angles(np.arange(first, first + n), rope)
        x0, x1 = x[..., :half].copy(), x[..., half:2 * half].copy()
        x[..., :half] = x0 * c[:, None] + x1 * s[:, None]
        x[..., half:2 * half] = x1 * c[:, None] - x0 * s[:, None]
    blocks = x.reshape(n // G, G, n_kv, hd).transpose(0, 2, 3, 1)  # [blocks, n_kv, hd, G]
    bits = _allocate_bits(blocks[0], 1 if first == 0 else 0)  # [n_kv, hd], from the first stored block
    y = _quantize_key_channels(blocks, np.broadcast_to(bits, blocks.shape[:-1]))
    y = y.transpose(0, 3, 1, 2).reshape(n, n_kv, hd)
    if half:  # rotated back: a block start's angles composed with the offset's
        cb, sb = _angles(np.arange(first, first + n, G).repeat(G), rope)
        ct, st = _angles(np.tile(np.arange(G), n // G), rope)
        cp, sp = cb * ct - sb * st, sb * ct + cb * st
        y0, y1 = y[..., :half].copy(), y[..., half:2 * half].copy()
        y[..., :half] = y0 * cp[:, None] - y1 * sp[:, None]
        y[..., half:2 * half] = y0 * sp[:, None] + y1 * cp[:, None]
    return y.astype(np.float16)


def _expected(keys: np.ndarray, values: np.ndarray, cap: int, batch: int,
              rope: tuple[int, float] | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray, int]:
    """keys, values: [P, n_kv, hd] float32 written at positions 0..P-1, `batch` per call -> the
    slots' f32 keys and values [n_kv, cap, hd], slot_pos and the sealed position."""
    P, n_kv, hd = keys.shape
    # Blocks ending R or more before a run's first position are sealed when the run is written
    # (a run: W positions of one call); block 0 goes to the q8_0 sink unless the cache wraps.
    last_run = max(p0 + r for p0 in range(0, P, batch) for r in range(0, min(batch, P - p0), W))
    sealed = max(0, (last_run - K.kivi_recent(cap)) // G * G)
    first = 0 if P > cap else G  # the first position of the 2-bit store
    kr, vr = _q8(keys), _q8(values)
    kq, vq = kr.astype(np.float16), vr.astype(np.float16)
    if sealed > first:
        n = sealed - first
        kq[first:sealed] = _keys_through_store(kr[first:sealed], first, rope)
        vq[first:sealed] = _quantize_groups(vr[first:sealed].reshape(n, n_kv, hd // G, G)).reshape(
            n, n_kv, hd)
    kf, vf = np.zeros((n_kv, cap, hd), np.float32), np.zeros((n_kv, cap, hd), np.float32)
    slot_pos = np.full(cap, -1, np.int32)
    for p in range(max(0, P - cap), P):
        kf[:, p % cap], vf[:, p % cap], slot_pos[p % cap] = kq[p], vq[p], p
    return kf, vf, slot_pos, sealed


def _fill(n_kv: int, cap: int, hd: int, P: int, batch: int, rng: np.random.Generator,
          rope: tuple[int, float] | None = None):
    cache = K.new_kv_cache(n_kv, cap, hd, "kivi2", wraps=P > cap)
    # Keys with outlier channels (as real models have: the reason keys are quantized per channel).
    outliers = np.where(np.arange(hd) % 17 == 3, 20.0, 1.0).astype(np.float32)
    keys = rng.standard_normal((P, n_kv, hd)).astype(np.float32) * outliers
    values = rng.standard_normal((P, n_kv, hd)).astype(np.float32)
    for p0 in range(0, P, batch):
        pos = np.arange(p0, min(P, p0 + batch), dtype=np.int32)
        K.kv_write(cache[0], cache[1], cache[2], keys[pos], values[pos], pos % cap, pos, sealed=cache[3],
                   rope=rope)
    return cache, keys, values


@pytest.mark.parametrize("n_kv,cap,hd,P,batch,rope", [
    (1, 256, 256, 240, 64, (128, 10000.0)),  # Gemma-like head_dim, prefill chunks, no wrap, partial RoPE
    (3, 192, 64, 400, 7, (64, 1e6)),         # GQA, a ring buffer that wraps (a sliding layer)
    (2, 96, 128, 50, 1, (128, 1e4)),         # decode one at a time, nothing old enough to seal yet
    (2, 256, 32, 256, 16, None),             # exactly full, keys without RoPE
    (1, 320, 64, 300, 1, (64, 1e5)),         # decode one at a time
])
def test_kivi2_reads_match_numpy_exactly(isa, n_kv, cap, hd, P, batch, rope, rng):
    cache, keys, values = _fill(n_kv, cap, hd, P, batch, rng, rope)
    kf, vf, slot_pos, sealed = _expected(keys, values, cap, batch, rope)
    assert sealed > G or P < 2 * G + K.kivi_recent(cap)  # the cases reach the 2-bit store where they can
    assert int(cache[3][0]) == sealed
    np.testing.assert_array_equal(cache[2], slot_pos)
    got_k, got_v = K.kv_read(*cache[:3], hd, sealed=cache[3], rope=rope)
    np.testing.assert_array_equal(got_k, kf)
    np.testing.assert_array_equal(got_v, vf)


def test_kivi2_keys_before_rope_lose_less_than_after(rng):
    """Keys that carry RoPE: quantized unrotated (what kivi2 does when told the rotation) they come
    back closer than quantized as written."""
    n_kv, cap, hd, P, rope = 2, 512, 64, 512, (64, 10000.0)
    base = rng.standard_normal((1, n_kv, hd)).astype(np.float32) * 3  # a per-channel offset, as in real keys
    raw = base + rng.standard_normal((P, n_kv, hd)).astype(np.float32) * 0.5
    c, s = _angles(np.arange(P), rope)
    keys = raw.copy()
    keys[..., :32] = raw[..., :32] * c[:, None] - raw[..., 32:] * s[:, None]
    keys[..., 32:] = raw[..., :32] * s[:, None] + raw[..., 32:] * c[:, None]
    errors = []
    for r in (rope, None):
        cache = K.new_kv_cache(n_kv, cap, hd, "kivi2", wraps=False)
        pos = np.arange(P, dtype=np.int32)
        for p0 in range(0, P, 32):
            K.kv_write(*cache[:3], keys[p0:p0 + 32], keys[p0:p0 + 32], pos[p0:p0 + 32], pos[p0:p0 + 32],
                       sealed=cache[3], rope=r)
        got, _ = K.kv_read(*cache[:3], hd, sealed=cache[3], rope=r)
        sealed = int(cache[3][0])
        errors.append(float(np.mean((got[:, G:sealed] - keys[G:sealed].transpose(1, 0, 2)) ** 2)))
    assert errors[0] < 0.5 * errors[1], errors


def test_kivi2_key_bits_go_to_the_large_channels_and_beat_even_2_bits(rng):
    """Keys whose channels differ in size by 100x: each head's bits (a byte per channel at the start
    of its part of K) average KEY_BITS, the largest channels get the most, and the keys come back
    with less squared error than 2 bits in every channel would give."""
    n_kv, cap, hd, P = 2, 512, 64, 512
    scale = np.geomspace(0.1, 10.0, hd).astype(np.float32)[rng.permutation(hd)]
    keys = rng.standard_normal((P, n_kv, hd)).astype(np.float32) * scale
    cache = K.new_kv_cache(n_kv, cap, hd, "kivi2", wraps=False)
    pos = np.arange(P, dtype=np.int32)
    for p0 in range(0, P, 32):
        run = slice(p0, p0 + 32)
        K.kv_write(*cache[:3], keys[run], keys[run], pos[run], pos[run], sealed=cache[3])
    bits = cache[0][:, :hd].astype(np.int64)
    assert (bits.sum(axis=1) == KEY_BITS * hd).all() and bits.max() <= KEY_BITS_MAX
    big, small = np.argsort(scale)[-8:], np.argsort(scale)[:8]
    assert (bits[:, big] > bits[:, small]).all()
    got, _ = K.kv_read(*cache[:3], hd, sealed=cache[3])
    sealed = int(cache[3][0])
    kr = _q8(keys[G:sealed])
    blocks = kr.reshape(-1, G, n_kv, hd).transpose(0, 2, 3, 1)
    even = _quantize_key_channels(blocks, np.full(blocks.shape[:-1], 2))
    even = even.transpose(0, 3, 1, 2).reshape(-1, n_kv, hd)
    err = float(np.mean((got[:, G:sealed] - keys[G:sealed].transpose(1, 0, 2)) ** 2))
    err_even = float(np.mean((even - keys[G:sealed]) ** 2))
    assert err < 0.5 * err_even, (err, err_even)


@pytest.mark.parametrize("n_kv,n_heads,cap,hd,P,n_q,window", [
    (1, 4, 256, 256, 230, 3, 0),
    (2, 6, 224, 64, 400, 5, 150),  # wrapped ring with a sliding window
])
def test_kivi2_attention_is_f16_attention_over_its_values(isa, threads, n_kv, n_heads, cap, hd, P, n_q, window,
                                                          rng):
    rope = (hd, 10000.0)
    cache, _, _ = _fill(n_kv, cap, hd, P, 64, rng, rope)
    kf, vf = K.kv_read(*cache[:3], hd, sealed=cache[3], rope=rope)
    k16, v16 = kf.astype(np.float16), vf.astype(np.float16)
    q = rng.standard_normal((n_q, n_heads, hd)).astype(np.float32)
    q_pos = np.arange(P - n_q, P, dtype=np.int32)
    scale = 1.0 / np.sqrt(hd)
    got = K.attention(q, cache[0], cache[1], cache[2], q_pos, scale=scale, window=window, sealed=cache[3],
                      rope=rope)
    want = K.attention(q, k16, v16, cache[2].copy(), q_pos, scale=scale, window=window)
    np.testing.assert_array_equal(got, want)


def test_kivi2_memory_is_under_0_3x_f16_at_long_contexts():
    # Per position: keys 2 bits on average + an f16 mean and step per 32 (3 bits), values 2 bits +
    # an f16 scale and minimum per 32 (3 bits); per KV head a byte of key bits per channel, the ring
    # of R + G + W - 1 q8_0 rows (34 bytes per 32 values) and, in a cache that does not wrap, the
    # sink's G rows instead of a 2-bit block.
    q8 = 34 / 64  # of f16's bytes
    for cap, hd in [(2048, 64), (4096, 128), (576, 256)]:
        f16 = K.kv_cache_bytes("f16", 2, cap, hd)
        ring = min(K.kivi_recent(cap) + G + W - 1, cap) / cap * q8
        bits_map = 1 / (4 * cap)  # hd bytes per head against f16's 4 * cap * hd
        assert K.kv_cache_bytes("kivi2", 2, cap, hd) / f16 == pytest.approx((3 + 3) / 32 + ring + bits_map)
        no_wrap = K.kv_cache_bytes("kivi2", 2, cap, hd, wraps=False) / f16
        assert no_wrap == pytest.approx((3 + 3) / 32 * (cap - G) / cap + ring + G / cap * q8 + bits_map)
    assert K.kv_cache_bytes("kivi2", 2, 2048, 64, wraps=False) < 0.3 * K.kv_cache_bytes("f16", 2, 2048, 64)
    sliding = K.kv_cache_bytes("kivi2", 1, 576, 256)  # a sliding-window layer's ring buffer
    assert sliding < 0.32 * K.kv_cache_bytes("f16", 1, 576, 256)


def test_kivi2_recent_window_is_an_eighth_of_the_capacity_within_bounds():
    lo, hi = K.KIVI["recent_min"], K.KIVI["recent_max"]
    assert [K.kivi_recent(c) for c in (256, 576, 1024, 2048, 4096, 32768)] == [lo, lo, 128, hi, hi, hi]


def test_kivi2_rejects_what_it_cannot_hold():
    k, v, sp, sealed = K.new_kv_cache(1, 256, 64, "kivi2")
    x = np.zeros((1, 1, 64), np.float32)
    with pytest.raises(ValueError, match="in slot 5, got slot 6"):
        K.kv_write(k, v, sp, x, x, [6], [5], sealed=sealed)
    with pytest.raises(ValueError, match="never written"):  # a gap: block 0 cannot be sealed
        R = K.kivi_recent(256)
        K.kv_write(k, v, sp, x, x, [R + G], [R + G], sealed=sealed)
    k2, v2, sp2, sealed2 = K.new_kv_cache(1, 128, 64, "kivi2", wraps=False)
    with pytest.raises(ValueError, match="without a ring buffer"):
        K.kv_write(k2, v2, sp2, x, x, [0], [128], sealed=sealed2)
    with pytest.raises(ValueError, match="multiple of 32"):
        K.new_kv_cache(1, 100, 64, "kivi2")
    with pytest.raises(ValueError, match="multiple of 32"):
        K.new_kv_cache(1, 128, 48, "kivi2")
