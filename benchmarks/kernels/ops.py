"""Kernel timings beyond GEMV bandwidth: small-batch GEMM (prefill chunks, token trees), decode
attention, sparse FFN against the dense FFN, and call overhead. Median of repeated calls through
the C++ entry points (what the engine uses); the machine may be shared, so compare within a run.

    python benchmarks/kernels/ops.py [--threads 1]
GEMV bandwidth per format is `python -m edgeflash.kernels.bench`.
"""

from __future__ import annotations

import argparse
import os

import edgeflash.kernels as K
import numpy as np
from edgeflash.kernels import _native
from edgeflash.kernels.bench import _median_time, random_weights


def small_gemm(rng: np.random.Generator) -> None:
    print("small-batch GEMM (us per call, GFLOP/s)")
    for fmt, rows, cols in [("q4_1", 1536, 576), ("q4_0", 2048, 640), ("q8_0", 576, 576), ("q6_k", 640, 2048)]:
        w = random_weights(fmt, rows, cols, rng)
        cells = []
        for n in (1, 4, 64):
            x = rng.standard_normal((n, cols), dtype=np.float32)
            y = np.empty((n, rows), np.float32)
            t = _median_time(lambda: _native.matmul(w, fmt, rows, cols, 0, x, n, y, False))
            cells.append(f"n={n}: {t * 1e6:7.1f} us {2 * rows * cols * n / t / 1e9:6.1f}")
        print(f"  {fmt} {rows}x{cols}   " + "   ".join(cells))


def attention(rng: np.random.Generator) -> None:
    print("decode attention, one query token (us per call)")
    for n_kv, heads, hd, ctx, fmt, name in [(1, 4, 256, 512, "f16", "Gemma 3"), (1, 4, 256, 2048, "f16", "Gemma 3"),
                                            (3, 9, 64, 512, "f16", "SmolLM2"), (3, 9, 64, 512, "q8_0", "SmolLM2"),
                                            (3, 9, 64, 2048, "f16", "SmolLM2"), (3, 9, 64, 2048, "kivi2", "SmolLM2")]:
        cache = K.new_kv_cache(n_kv, ctx, hd, fmt, wraps=False)
        k, v, sp = cache[:3]
        # kivi2 keeps keys unrotated: it needs its `sealed` mark and the RoPE to rotate them back on read
        extra = {"sealed": cache[3], "rope": (hd, 10000.0)} if fmt == "kivi2" else {}
        for p0 in range(0, ctx, 256):
            pos = np.arange(p0, p0 + 256)
            kv = rng.standard_normal((2, 256, n_kv, hd)).astype(np.float32)
            K.kv_write(k, v, sp, kv[0], kv[1], pos, pos, **extra)
        q = rng.standard_normal((1, heads, hd)).astype(np.float32)
        out = np.empty_like(q)
        t = _median_time(lambda: K.attention(q, k, v, sp, [ctx - 1], scale=0.1, out=out, **extra))
        print(f"  {name} shape ({n_kv} KV heads, {heads} heads, head_dim {hd}), {ctx} positions, {fmt} cache: {t * 1e6:7.1f} us")


def sparse_ffn(rng: np.random.Generator) -> None:
    d_model, d_ff = 640, 2048
    print(f"sparse FFN, one token, d_model {d_model}, d_ff {d_ff} (us per call)")
    g = rng.standard_normal((d_ff, d_model)).astype(np.float32) * 0.05
    dn = rng.standard_normal((d_model, d_ff)).astype(np.float32) * 0.05
    x = rng.standard_normal((1, d_model)).astype(np.float32)
    out = np.empty((1, d_model), np.float32)
    for fmt in ("q8_0", "q4_0"):
        arena = K.pack_bundles(g, g, dn, fmt, fmt, fmt)
        cells = []
        for n_act in (2048, 1024, 512):
            slots = np.sort(rng.choice(d_ff, n_act, replace=False)).astype(np.int32)
            t = _median_time(lambda: _native.ffn_sparse(arena, d_ff, d_model, fmt, fmt, fmt, arena.shape[1], x, 1, slots,
                                                        "gelu_tanh", None, out, False))
            cells.append(f"{n_act} active {t * 1e6:6.1f}")
        gq, dq = K.quantize(g, fmt), K.quantize(dn, fmt)
        y, h = np.empty((1, d_ff), np.float32), np.empty((1, d_ff), np.float32)
        t = _median_time(lambda: (_native.matmul(gq, fmt, d_ff, d_model, 0, x, 1, y, False),
                                  _native.matmul(gq, fmt, d_ff, d_model, 0, x, 1, y, False),
                                  _native.matmul(dq, fmt, d_model, d_ff, 0, h, 1, out, False)))
        print(f"  {fmt} bundles: " + ", ".join(cells) + f";  dense FFN (3 GEMVs) {t * 1e6:6.1f}")


def overhead(rng: np.random.Generator) -> None:
    w = random_weights("q8_0", 8, 64, rng)
    x = rng.standard_normal((1, 64), dtype=np.float32)
    y = np.empty((1, 8), np.float32)
    native = _median_time(lambda: _native.matmul(w, "q8_0", 8, 64, 0, x, 1, y, False))
    wrapped = _median_time(lambda: K.matmul(w, "q8_0", x, out=y))
    big = random_weights("q8_0", 576, 576, rng)
    xb = rng.standard_normal((1, 576), dtype=np.float32)
    yb = np.empty((1, 576), np.float32)
    t576 = _median_time(lambda: _native.matmul(big, "q8_0", 576, 576, 0, xb, 1, yb, False))
    print(f"call overhead: 8x64 GEMV {native * 1e6:.2f} us native, {wrapped * 1e6:.2f} us through the Python wrapper; "
          f"576x576 q8_0 GEMV {t576 * 1e6:.1f} us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    args = p.parse_args(argv)
    K.set_num_threads(args.threads)
    print(f"level {K.current_isa()}, threads {args.threads}, load average {os.getloadavg()[0]:.1f}")
    rng = np.random.default_rng(0)
    small_gemm(rng)
    attention(rng)
    sparse_ffn(rng)
    overhead(rng)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
