"""Decode and 512-token prefill of a bundle's FFN arena (format 3) next to the same model's dense
paths, side by side in one run: the bundle on this checkout's engine, the same bundle on another
checkout's engine (--other-python: e.g. one whose engine runs the arena through the sparse-FFN
kernel), a format-2 bundle with dense FFN matrices (--dense-bundle) and the GGUF. Each run in its
own process, interleaved over rounds; medians and ratios to this checkout's arena run.

  python benchmarks/engine/arena_paths.py --model qwen2.5-coder-0.5b \\
      --dense-bundle bench-out/bundles-f2/qwen2.5-coder-0.5b-q4_0 --other-python ../main/.venv/bin/python

Records: benchmarks/results/arena-paths.jsonl.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "results"))

WORKER = r"""
import json, sys, time
import numpy as np
import edgeflash as ef
path, threads, prompt_tokens, decode_tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
m = ef.load(path, threads=threads, activations="q8", context_length=2048)
e = m.engine
ids = (m.encode("def quicksort(items):\n    " * 200) * 4)[:prompt_tokens]
e.forward(ids[:8]); e.reset()
t0 = time.perf_counter(); logits = e.forward(ids); prefill = time.perf_counter() - t0
tok = int(np.argmax(logits[-1])); t0 = time.perf_counter()
for _ in range(decode_tokens):
    tok = int(np.argmax(e.forward([tok])[-1]))
decode = time.perf_counter() - t0
print(json.dumps({"prefill_tok_s": prompt_tokens / prefill, "decode_tok_s": decode_tokens / decode}))
"""


def run(python: str, path: Path, args) -> dict | None:
    done = subprocess.run([python, "-c", WORKER, str(path), str(args.threads), str(args.prompt_tokens),
                           str(args.decode_tokens)], capture_output=True, text=True, timeout=1800, check=False)
    if done.returncode != 0:
        print(f"[{path} failed: {done.stderr.strip().splitlines()[-1:]}]", file=sys.stderr)
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    from bench_models import bundle_dir, gguf_path

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--model", required=True)
    p.add_argument("--dense-bundle", type=Path, help="a format-2 bundle of the same model (dense FFN matrices)")
    p.add_argument("--other-python", help="the Python of another checkout, to run the same arena bundle on")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=64)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    arena = bundle_dir(args.model)
    configs = {"arena bundle": (sys.executable, arena)}
    if args.other_python:
        configs["arena bundle, other checkout"] = (args.other_python, arena)
    if args.dense_bundle:
        configs["dense bundle (format 2)"] = (sys.executable, args.dense_bundle)
    configs["gguf"] = (sys.executable, gguf_path(args.model))
    got: dict[str, list[dict]] = {c: [] for c in configs}
    for r in range(args.rounds):
        for c, (python, path) in configs.items():
            res = run(python, path, args)
            if res:
                got[c].append(res)
                print(f"round {r + 1} {c:30s} decode {res['decode_tok_s']:6.1f} tok/s  prefill "
                      f"{res['prefill_tok_s']:6.1f} tok/s", flush=True)
    base = {k: statistics.median(x[k] for x in got["arena bundle"]) for k in ("decode_tok_s", "prefill_tok_s")}
    records = []
    cmd = "python benchmarks/engine/arena_paths.py " + " ".join(argv if argv is not None else sys.argv[1:])
    print(f"\n{args.model}, {args.threads} threads, medians of {args.rounds} rounds (ratio to the arena bundle here)")
    for c, rs in got.items():
        if not rs:
            continue
        row = []
        for k in ("decode_tok_s", "prefill_tok_s"):
            v = statistics.median(x[k] for x in rs)
            row.append(f"{k.split('_')[0]} {v:6.1f} tok/s ({v / base[k]:.2f}x)")
            records.append({"model": args.model, "config": c, "metric": k, "value": round(v, 2), "unit": "tok/s",
                            "low": round(min(x[k] for x in rs), 2), "high": round(max(x[k] for x in rs), 2),
                            "rounds": len(rs), "command": cmd})
        print(f"  {c:30s} " + "  ".join(row))
    if not args.no_save:
        from record import append_results, new_run_id

        run_id = new_run_id()
        append_results("arena-paths", [{"run": run_id, **r} for r in records])
        print("records appended to benchmarks/results/arena-paths.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
