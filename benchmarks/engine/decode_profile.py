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
  python benchmarks/engine/decode_profile.py --models qwen2.5-coder-1.5b --requantize q4_0,q3_k --rounds 5

--requantize loads each model once per listed format (`edgeflash.load(requantize=...)`, "none" for
the file's formats) in the same process, runs their rounds interleaved and prints each one's decode
time as a ratio to the first's: a load on the machine that comes and goes falls on all of them.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from roofline import weight_bytes_per_token  # noqa: E402

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


class Profile:
    """One model (with one `requantize` choice) loaded, measured a round at a time."""

    def __init__(self, alias: str, threads: int, requantize: str | None):
        import edgeflash as ef
        from edgeflash.export.corpus import heldout_windows

        self.alias, self.requantize = alias, requantize
        self.model = ef.load(alias, threads=threads, context_length=1024, requantize=requantize)
        self.engine = self.model.engine
        text = heldout_windows(1, chars_per_window=6 * PROMPT_TOKENS, offset_chars=50_000)[0]
        self.ids = self.model.encode(text)[:PROMPT_TOKENS]
        # what a token reads (an untied embedding gives one row), before gemv_pass converts its own copies
        self.weight_bytes = sum(weight_bytes_per_token(self.engine).values())
        self.run_gemv = gemv_pass(self.engine)
        self.samples: dict[str, list[float]] = {"generate": [], "forward": [], "gemv": []}
        self.spent: list[float] = []
        forward = self.engine.forward

        def timed_forward(tokens, **kw):  # the same calls generate makes, timed inside the same run
            t0 = time.perf_counter()
            out = forward(tokens, **kw)
            if len(tokens) == 1:
                self.spent.append(time.perf_counter() - t0)
            return out

        self.engine.forward = timed_forward

    def round(self) -> None:
        model, engine, spent, samples, run_gemv = self.model, self.engine, self.spent, self.samples, self.run_gemv
        ids = self.ids
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

    def result(self, bandwidth: float) -> dict:
        t = {k: statistics.median(v) for k, v in self.samples.items()}
        return {"model": self.alias, "requantize": self.requantize or "none", "weight_bytes": self.weight_bytes,
                **{f"{k}_ms": v * 1e3 for k, v in t.items()},
                "roofline_ms": self.weight_bytes / bandwidth * 1e3, "loadavg": os.getloadavg()[0]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["smollm2-135m", "gemma3-270m"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requantize", default="none",
                        help="comma-separated requantize formats to load each model with ('none': the file's "
                             "formats), rounds interleaved (default: none)")
    args = parser.parse_args()
    import edgeflash.kernels as kernels
    from edgeflash.kernels.bench import read_bandwidth

    kernels.set_num_threads(args.threads)
    bandwidth = read_bandwidth(args.threads) * 1e9
    print(f"memory read bandwidth, {args.threads} threads: {bandwidth / 1e9:.1f} GB/s")
    print("| model | requantize | weights MB | roofline ms/token | generate ms/token (tok/s) | decode vs first "
          "| C++ forward ms | GEMV only ms | other ops ms | Python ms | forward at % of roofline | load |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    choices = [None if q == "none" else q for q in args.requantize.split(",")]
    for alias in args.models:
        profiles = [Profile(alias, args.threads, q) for q in choices]
        for _ in range(args.rounds):
            for p in profiles:
                p.round()
        first = None
        for p in profiles:
            r = p.result(bandwidth)
            first = first or r
            print(f"| {alias} | {r['requantize']} | {r['weight_bytes'] / 1e6:.1f} | {r['roofline_ms']:.2f} | "
                  f"{r['generate_ms']:.2f} ({1e3 / r['generate_ms']:.0f}) | "
                  f"{first['generate_ms'] / r['generate_ms']:.2f}x | {r['forward_ms']:.2f} | "
                  f"{r['gemv_ms']:.2f} | {r['forward_ms'] - r['gemv_ms']:.2f} | "
                  f"{r['generate_ms'] - r['forward_ms']:.2f} | {r['roofline_ms'] / r['forward_ms']:.0%} | "
                  f"{r['loadavg']:.1f} |", flush=True)
            if len(profiles) > 1:
                rounds = ", ".join(f"{a / b:.2f}" for a, b in zip(profiles[0].samples["generate"],
                                                                   p.samples["generate"], strict=True))
                print(f"|   per-round decode vs first: {rounds} |", flush=True)


if __name__ == "__main__":
    main()
