"""Where a decode token's time goes, and how close it is to the memory-bandwidth roofline.

For each model, in one process and interleaved over rounds (the machine is shared):
  generate   a decoded token through `Model.generate` (sampling, stop checks, detokenizing, stats)
  forward    the `engine.forward([token])` calls inside that same generation, timed one by one:
             the whole C++ pass (every layer and the head) and its binding
  gemv       the model's weight matrices multiplied in forward order by the same GEMV kernels,
             nothing else (the working set streams from DRAM as in a real pass)
so  python overhead = generate - forward,  other ops (attention, norms, RoPE, activation
quantization, thread hand-offs) = forward - gemv. The roofline is the weight bytes a token reads
divided by the measured read bandwidth: the fastest a token can be with every weight read once.

  python benchmarks/engine/decode_profile.py                     # both models, 2 threads
  python benchmarks/engine/decode_profile.py --models smollm2-135m --rounds 5
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
from collections.abc import Callable

import numpy as np

PROMPT_TOKENS = 256
DECODE_TOKENS = 64


def gemv_pass(engine) -> Callable[[], None]:
    """A closure that runs every weight matrix of the model once."""
    from edgeflash.kernels import _native
    from edgeflash.runtime.native_engine import LAYER_SLOTS, MATRIX_SLOTS

    spec, tensors = engine.spec, engine.source.tensors
    matrices = [t for t, slot in LAYER_SLOTS.items() if slot in MATRIX_SLOTS]
    names = [f"blk.{i}.{n}" for i in range(spec.n_layers) for n in matrices if f"blk.{i}.{n}" in tensors]
    names.append("output.weight" if "output.weight" in tensors else "token_embd.weight")
    mats = [engine._matrix(tensors[n]) for n in names]
    xs = {cols: np.random.default_rng(0).standard_normal((1, cols), dtype=np.float32) for _, _, _, cols in mats}
    ys = {rows: np.empty((1, rows), np.float32) for _, _, rows, _ in mats}

    def run() -> None:
        for raw, fmt, rows, cols in mats:
            _native.matmul(raw, fmt, rows, cols, 0, xs[cols], 1, ys[rows], False)

    return run


def profile(alias: str, threads: int, rounds: int, bandwidth: float) -> dict:
    import edgeflash as ef
    from edgeflash.export.corpus import heldout_windows

    model = ef.load(alias, threads=threads, context_length=1024)
    engine = model.engine
    ids = model.encode(heldout_windows(1, chars_per_window=6 * PROMPT_TOKENS, offset_chars=50_000)[0])[:PROMPT_TOKENS]
    run_gemv = gemv_pass(engine)
    samples = {"generate": [], "forward": [], "gemv": []}
    forward = engine.forward
    spent: list[float] = []

    def timed_forward(tokens, **kw):  # the same calls generate makes, timed inside the same run
        t0 = time.perf_counter()
        out = forward(tokens, **kw)
        if len(tokens) == 1:
            spent.append(time.perf_counter() - t0)
        return out

    engine.forward = timed_forward
    for _ in range(rounds):
        engine.reset()
        spent.clear()
        stats = model.generate(ids, max_tokens=DECODE_TOKENS).stats
        per_token = 1.0 / stats["decode_tok_s"]
        samples["generate"].append(per_token)
        # decode_tok_s spans first to last token: the forward calls in between, per token
        samples["forward"].append(sum(spent[:-1]) / max(1, len(spent) - 1) if len(spent) > 1 else per_token)
        run_gemv()  # warm
        times = []
        for _ in range(8):
            t0 = time.perf_counter()
            run_gemv()
            times.append(time.perf_counter() - t0)
        samples["gemv"].append(statistics.median(times))
    t = {k: statistics.median(v) for k, v in samples.items()}
    return {"model": alias, "weight_bytes": engine.weight_bytes, **{f"{k}_ms": v * 1e3 for k, v in t.items()},
            "roofline_ms": engine.weight_bytes / bandwidth * 1e3, "loadavg": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    import edgeflash.kernels as kernels
    from edgeflash.kernels.bench import read_bandwidth

    kernels.set_num_threads(args.threads)
    bandwidth = read_bandwidth(args.threads) * 1e9
    print(f"memory read bandwidth, {args.threads} threads: {bandwidth / 1e9:.1f} GB/s")
    print("| model | weights MB | roofline ms/token | generate ms/token (tok/s) | C++ forward ms | GEMV only ms "
          "| other ops ms | Python ms | forward at % of roofline | load |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for alias in args.models:
        r = profile(alias, args.threads, args.rounds, bandwidth)
        print(f"| {alias} | {r['weight_bytes'] / 1e6:.1f} | {r['roofline_ms']:.2f} | {r['generate_ms']:.2f} "
              f"({1e3 / r['generate_ms']:.0f}) | {r['forward_ms']:.2f} | {r['gemv_ms']:.2f} | "
              f"{r['forward_ms'] - r['gemv_ms']:.2f} | {r['generate_ms'] - r['forward_ms']:.2f} | "
              f"{r['roofline_ms'] / r['forward_ms']:.0%} | {r['loadavg']:.1f} |", flush=True)


if __name__ == "__main__":
    main()
