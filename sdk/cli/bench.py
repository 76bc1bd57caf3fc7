"""`edgeflash bench`: benchmarks, never part of the test run. Side by side in one run, as ratios:
this machine class is shared and noisy."""

from __future__ import annotations

import argparse
import json
import os
import shlex
import statistics
import subprocess
import sys
import time
from pathlib import Path

from edgeflash.base.errors import UserError
from edgeflash.cli.args import non_negative_int, positive_int

HELP = "benchmark the kernels, the engine, or edgeflash against llama.cpp and ExecuTorch"
DESCRIPTION = """Benchmarks (not tests). Subjects:
  kernels      GEMV GB/s per weight format vs memory bandwidth and torch (edgeflash.kernels.bench)
  side-by-side edgeflash (GGUF and q4_0 bundle) and llama.cpp on the four models: decode and 512-token
               prefill tok/s, ratios, peak RSS, perplexity on the same token ids
               (benchmarks/engine/side_by_side.py; llama.cpp from the benchmark environment)
  engine       prefill/decode tok/s, time to first token and peak RSS of edgeflash on a model
  roofline     per decoded token: weight bytes read (by role), measured read bandwidth, time in
               GEMV vs attention vs the rest, % of the bandwidth roofline; GGUF and q4_0 bundle
               (benchmarks/engine/roofline.py; --pass "--export" writes missing bundles first)
  peers        edgeflash side by side with llama.cpp, ExecuTorch and transformers
               (needs the benchmark environment: bash benchmarks/peers/setup-env.sh)
  memory       budgeted runs: flash vs hybrid vs naive at 50% and 25% budgets (benchmarks/memory/)
  speculative  speculative decoding speedups per drafter (benchmarks/speculative/)

examples:
  edgeflash bench engine -m smollm2-135m --repeat 5
  edgeflash bench kernels --threads 1,2
  edgeflash bench roofline -m qwen2.5-coder-0.5b -m gemma3-270m
  edgeflash bench peers --rounds 3 --pass "--models smollm2-135m"
"""
REPO = Path(__file__).resolve().parents[2]  # a source checkout: sdk/cli/bench.py -> repo


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help=HELP, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("subject", nargs="?", default="engine",
                   choices=["engine", "roofline", "side-by-side", "kernels", "peers", "memory", "speculative"])
    p.add_argument("-m", "--model", action="append", default=None,
                   help="model(s) for `engine` (default: smollm2-135m and gemma3-270m) and `roofline` "
                        "(default: the four benchmark models)")
    p.add_argument("-t", "--threads", type=positive_int, default=2)
    p.add_argument("--prompt-tokens", type=positive_int, default=400)
    p.add_argument("-n", "--max-tokens", type=positive_int, default=128)
    p.add_argument("--repeat", type=positive_int, default=3)
    p.add_argument("--activations", choices=["q8x2", "q8", "f32"], default=None,
                   help="engine: one activation mode (default: both q8x2 and q8)")
    p.add_argument("--rounds", type=non_negative_int, default=3, help="peers: interleaved rounds (default: %(default)s)")
    p.add_argument("--kv-cache", action="append", default=None, choices=["f16", "q8_0", "kivi2"],
                   help="engine: KV cache format(s), side by side (default: f16)")
    p.add_argument("--json", action="store_true", help="engine: print results as JSON")
    p.add_argument("--pass", dest="passthrough", default="", metavar="ARGS",
                   help='options handed to the subject\'s own script, e.g. --pass "--models gemma3-270m"')
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.subject == "kernels":
        from edgeflash.kernels.bench import main as kernels_bench

        return kernels_bench(shlex.split(args.passthrough) or ["--threads", "1,2"])
    if args.subject == "engine":
        return engine_bench(args)
    return run_script(args)


def engine_bench(args: argparse.Namespace) -> int:
    import edgeflash as ef
    from edgeflash.export.corpus import heldout_windows

    models = args.model or ["smollm2-135m", "gemma3-270m"]
    modes = [args.activations] if args.activations else ["q8x2", "q8"]
    text = heldout_windows(1, chars_per_window=8 * args.prompt_tokens, offset_chars=50_000)[0]
    kv_formats = args.kv_cache or ["f16"]
    rows = []
    for alias, mode, kv in ((a, md, kv) for a in models for md in modes for kv in kv_formats):
        m = ef.load(alias, threads=args.threads, activations=mode, context_length=2048, kv_cache=kv)
        ids = m.encode(text)[:args.prompt_tokens]
        m.generate("Hello", max_tokens=2)  # warm-up
        runs = []
        for _ in range(args.repeat):
            m.engine.reset()
            runs.append(m.generate(ids, max_tokens=args.max_tokens).stats)
        rows.append({"model": alias, "activations": mode, "kv_cache": kv, "prompt_tokens": len(ids),
                     "prefill_tok_s": statistics.median(r["prefill_tok_s"] for r in runs),
                     "decode_tok_s": statistics.median(r["decode_tok_s"] for r in runs),
                     "best_decode_tok_s": max(r["decode_tok_s"] for r in runs),
                     "ttft_s": statistics.median(r["ttft_s"] for r in runs),
                     "peak_rss_mib": round(max(r["peak_rss_bytes"] for r in runs) / 2**20, 1),
                     "loadavg": round(os.getloadavg()[0], 2)})
        del m
    if args.json:
        print(json.dumps(rows))
        return 0
    print(f"{'model':<14} {'act':<5} {'kv':<6} {'prompt':>6} {'prefill tok/s':>14} {'decode tok/s':>13} "
          f"{'(best)':>8} {'vs ' + kv_formats[0]:>8} {'TTFT s':>7} {'peak RSS MiB':>13} {'load':>5}")
    first = {(r["model"], r["activations"]): r["decode_tok_s"] for r in rows
             if r["kv_cache"] == kv_formats[0]}
    for r in rows:
        ratio = r["decode_tok_s"] / first[(r["model"], r["activations"])]
        print(f"{r['model']:<14} {r['activations']:<5} {r['kv_cache']:<6} {r['prompt_tokens']:>6} "
              f"{r['prefill_tok_s']:>14.1f} {r['decode_tok_s']:>13.1f} {r['best_decode_tok_s']:>8.1f} "
              f"{ratio:>7.2f}x "
              f"{r['ttft_s']:>7.3f} {r['peak_rss_mib']:>13.1f} {r['loadavg']:>5}")
    return 0


SCRIPTS = {"peers": "benchmarks/peers/run_all.py", "memory": "benchmarks/memory/compare.py",
           "speculative": "benchmarks/speculative/compare.py", "roofline": "benchmarks/engine/roofline.py",
           "side-by-side": "benchmarks/engine/side_by_side.py"}


def run_script(args: argparse.Namespace) -> int:
    script = REPO / SCRIPTS[args.subject]
    if not script.is_file():
        raise UserError(f"`edgeflash bench {args.subject}` runs {SCRIPTS[args.subject]} from a source checkout; "
                        f"it is not in {REPO}")
    python = sys.executable
    extra = []
    if args.subject == "peers":
        bench_python = REPO / ".venv-bench" / "bin" / "python"
        if not bench_python.exists():
            raise UserError("the peer benchmark needs its own environment (llama.cpp builds from source, about "
                            "15 minutes): run `bash benchmarks/peers/setup-env.sh` first")
        python = str(bench_python)
        extra = ["--rounds", str(args.rounds), "--threads", str(args.threads)]
    if args.subject == "side-by-side":
        extra = ["--rounds", str(args.rounds), "--threads", str(args.threads)]
        if args.model:
            extra += ["--models", *args.model]
    if args.subject == "roofline":
        extra = ["--threads", str(args.threads), "--rounds", str(args.rounds),
                 "--tokens", str(min(args.max_tokens, 64))]
        for model in args.model or []:
            extra += ["-m", model]
    t0 = time.perf_counter()
    done = subprocess.run([python, str(script), *extra, *shlex.split(args.passthrough)], cwd=REPO)
    sys.stderr.write(f"[{args.subject} benchmark: {time.perf_counter() - t0:.0f} s]\n")
    return done.returncode
