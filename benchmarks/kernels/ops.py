"""Kernel timings beyond GEMV bandwidth: small-batch GEMM (prefill chunks, token trees), decode
and prompt attention, sparse FFN against the dense FFN, and call overhead. Median of repeated calls
through the C++ entry points (what the engine uses); the machine may be shared, so compare within a
run.

    python benchmarks/kernels/ops.py [--threads 1] [--record]
GEMV bandwidth per format is `python -m edgeflash.kernels.bench`. `--record` appends the timings to
benchmarks/results/kernels-ops.jsonl (the table in docs/kernels.md).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

import edgeflash.kernels as K
import numpy as np
from edgeflash.kernels import _native
from edgeflash.kernels.bench import _median_time, random_weights

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
from record import append_result, new_run_id

ROWS: list[tuple[str, str, float, float | None]] = []  # (operation, shape / setting, seconds, GFLOP/s)


def measured(op: str, setting: str, seconds: float, flop: float | None = None) -> float | None:
    """Keeps one timing for --record; returns its GFLOP/s (None without a flop count)."""
    gflops = flop / seconds / 1e9 if flop else None
    ROWS.append((op, setting, seconds, gflops))
    return gflops


def small_gemm(rng: np.random.Generator) -> None:
    print("small-batch GEMM (us per call, GFLOP/s)")
    for fmt, rows, cols in [("q4_1", 1536, 576), ("q4_0", 2048, 640), ("q8_0", 576, 576), ("q6_k", 640, 2048)]:
        w = random_weights(fmt, rows, cols, rng)
        cells = []
        for n in (1, 4, 64):
            x = rng.standard_normal((n, cols), dtype=np.float32)
            y = np.empty((n, rows), np.float32)
            t = _median_time(lambda: _native.matmul(w, fmt, rows, cols, 0, x, n, y, False))
            gflops = measured("small-batch GEMM", f"{fmt} {rows}x{cols}, n={n}", t, 2 * rows * cols * n)
            cells.append(f"n={n}: {t * 1e6:7.1f} us {gflops:6.1f}")
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
        setting = f"{name} shape ({n_kv} KV heads, {heads} heads, head_dim {hd}), {ctx} positions, {fmt} cache"
        measured("decode attention, one query token", setting, t)
        print(f"  {setting}: {t * 1e6:7.1f} us")


def prompt_attention(rng: np.random.Generator) -> None:
    """The last 128-token chunk of a 512-token prompt (the engine's prefill batch) against its 512
    positions, causal: what a prompt's attention costs per layer beside its matrix products."""
    op = "prompt attention, 128 query tokens after 384 positions"
    print(f"{op} (us per call, GFLOP/s of the visible scores and values)")
    n_q, ctx = 128, 512
    for n_kv, heads, hd, name in [(2, 12, 128, "Qwen2.5-Coder-1.5B"), (2, 14, 64, "Qwen2.5-Coder-0.5B")]:
        k, v, sp = K.new_kv_cache(n_kv, ctx, hd, "f16", wraps=False)
        pos = np.arange(ctx)
        kv = rng.standard_normal((2, ctx, n_kv, hd)).astype(np.float32)
        K.kv_write(k, v, sp, kv[0], kv[1], pos, pos)
        q = rng.standard_normal((n_q, heads, hd)).astype(np.float32)
        out = np.empty_like(q)
        q_pos = np.arange(ctx - n_q, ctx)
        t = _median_time(lambda: K.attention(q, k, v, sp, q_pos, scale=hd ** -0.5, out=out))
        visible = float(np.sum(q_pos + 1))  # query i sees positions 0..q_pos[i]
        setting = f"{name} shape ({n_kv} KV heads, {heads} heads, head_dim {hd}), f16 cache"
        gflops = measured(op, setting, t, 4 * visible * heads * hd)  # q.k and p.v: 2 flops each
        print(f"  {setting}: {t * 1e6:8.1f} us {gflops:6.1f}")


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
            measured(f"sparse FFN, one token, d_model {d_model}, d_ff {d_ff}", f"{fmt} bundles, {n_act} active", t)
            cells.append(f"{n_act} active {t * 1e6:6.1f}")
        gq, dq = K.quantize(g, fmt), K.quantize(dn, fmt)
        y, h = np.empty((1, d_ff), np.float32), np.empty((1, d_ff), np.float32)
        t = _median_time(lambda: (_native.matmul(gq, fmt, d_ff, d_model, 0, x, 1, y, False),
                                  _native.matmul(gq, fmt, d_ff, d_model, 0, x, 1, y, False),
                                  _native.matmul(dq, fmt, d_model, d_ff, 0, h, 1, out, False)))
        measured(f"sparse FFN, one token, d_model {d_model}, d_ff {d_ff}", f"{fmt}, dense FFN (3 GEMVs)", t)
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
    measured("call overhead", "8x64 GEMV, native", native)
    measured("call overhead", "8x64 GEMV, Python wrapper", wrapped)
    measured("call overhead", "576x576 q8_0 GEMV", t576)
    print(f"call overhead: 8x64 GEMV {native * 1e6:.2f} us native, {wrapped * 1e6:.2f} us through the Python wrapper; "
          f"576x576 q8_0 GEMV {t576 * 1e6:.1f} us")


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--record", action="store_true", help="append the timings to benchmarks/results/kernels-ops.jsonl")
    args = p.parse_args(argv)
    K.set_num_threads(args.threads)
    conditions = f"level {K.current_isa()}, threads {args.threads}, load average {os.getloadavg()[0]:.1f}"
    print(conditions)
    rng = np.random.default_rng(0)
    small_gemm(rng)
    attention(rng)
    prompt_attention(rng)
    sparse_ffn(rng)
    overhead(rng)
    if args.record:
        run, command = new_run_id(), "python benchmarks/kernels/ops.py " + " ".join(argv if argv is not None else sys.argv[1:])
        append_result("kernels-ops", {"run": run, "metric": "conditions", "value": conditions, "command": command.strip()})
        for op, setting, seconds, gflops in ROWS:
            base = {"run": run, "model": op, "config": setting, "command": command.strip()}
            append_result("kernels-ops", {**base, "metric": "us_per_call", "value": round(seconds * 1e6, 2), "unit": "us"})
            if gflops is not None:
                append_result("kernels-ops", {**base, "metric": "gflop_s", "value": round(gflops, 1), "unit": "GFLOP/s"})
        print(f"{len(ROWS)} timings appended to benchmarks/results/kernels-ops.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
