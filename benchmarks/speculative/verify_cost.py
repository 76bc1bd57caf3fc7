"""What a verification pass costs by its width, against a plain one-token step, in one process: the
fact that bounds every speculation speedup on a CPU (each node of a tree is a row of every matrix
product, and past a few rows the products are bound by arithmetic, not by reading the weights).

    python benchmarks/speculative/verify_cost.py                          # Qwen2.5-Coder-1.5B, q8x2 and q8
    python benchmarks/speculative/verify_cost.py --model qwen2.5-coder-0.5b --widths 2 4 8 --record
    python benchmarks/speculative/verify_cost.py --budget 0.25 --activations q8x2   # weights streamed

A chain of `w` nodes is verified the way the speculative decoder does it (`forward_tree`, greedy
argmax only) after 64 cached tokens; widths and activation modes take turns round by round, so a
slow moment of a shared machine hits them alike. With `--budget F` the model runs under a memory
budget of F times its file, so the pass and the plain step both read what the budget streams. `--record` appends to
benchmarks/results/speculative.jsonl (metric verify_cost_ratio, one record per width).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import edgeflash as ef
from edgeflash.base.models import resolve_model
from edgeflash.kernels import current_isa
from edgeflash.runtime.speculative.tree import DraftTree

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
from record import append_results, new_run_id

CACHED = 64
TEXT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n    a, b = 0, 1\n" * 12


def pass_seconds(engine, ids: list[int], width: int) -> float:
    """Seconds of one pass of `width` chain nodes (1: a plain step), the cache left as it was."""
    tokens = ids[CACHED:CACHED + width]
    start = time.perf_counter()
    if width == 1:
        engine.forward(tokens)
        elapsed = time.perf_counter() - start
        engine.truncate(CACHED)
        return elapsed
    chain = DraftTree.root(tokens[0])
    chain.add_chain(0, tokens[1:], width)
    engine.forward_tree(chain.tokens, chain.depths(), chain.ancestor_mask(), argmax_only=True)
    return time.perf_counter() - start


def file_bytes(path: Path) -> int:
    """A model's size on disk: a GGUF file, or every file of a bundle folder."""
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--activations", nargs="+", default=["q8x2", "q8"], choices=["q8x2", "q8"])
    p.add_argument("--widths", nargs="+", type=int, default=[2, 3, 4, 5, 6, 8, 12, 16])
    p.add_argument("--rounds", type=int, default=7)
    p.add_argument("--budget", type=float, default=None, metavar="F",
                   help="run under a memory budget of F times the model file (e.g. 0.25); default: none")
    p.add_argument("--record", action="store_true")
    args = p.parse_args()

    budget = None if args.budget is None else int(args.budget * file_bytes(resolve_model(args.model)))
    models = {a: ef.load(args.model, kv_cache="q8_0", context_length=1024, activations=a, memory_budget=budget)
              for a in args.activations}
    ids = models[args.activations[0]].encode(TEXT)
    if len(ids) < CACHED + max(args.widths):
        raise SystemExit(f"the sample text gives {len(ids)} tokens, fewer than {CACHED + max(args.widths)}")
    widths = [1] + sorted(set(args.widths) - {1})
    times = {(a, w): [] for a in models for w in widths}
    for m in models.values():
        m.engine.reset()
        m.engine.forward(ids[:CACHED])
        pass_seconds(m.engine, ids, max(widths))  # warm: scratch buffers at their largest
    for _ in range(args.rounds):
        for a, m in models.items():
            for w in widths:
                times[a, w].append(pass_seconds(m.engine, ids, w))

    where = "no budget" if budget is None else f"a budget of {args.budget:g} of the file ({budget / 2**20:.0f} MiB)"
    print(f"{args.model}, {where}: a pass of w chain nodes over a plain step, median of {args.rounds} rounds")
    print("| activations | plain step ms | " + " | ".join(f"w={w}" for w in widths[1:]) + " |")
    print("|---|---|" + "---|" * (len(widths) - 1))
    run, records = new_run_id(), []
    command = "python benchmarks/speculative/verify_cost.py " + " ".join(sys.argv[1:])
    for a in models:
        plain = statistics.median(times[a, 1])
        ratios = {w: statistics.median(times[a, w]) / plain for w in widths[1:]}
        print(f"| {a} | {plain * 1e3:.1f} | " + " | ".join(f"{r:.2f}" for r in ratios.values()) + " |")
        at = "" if budget is None else f", budget {args.budget:g}"
        records += [{"run": run, "model": args.model, "config": f"{a} activations{at}, width {w}",
                     "metric": "verify_cost_ratio", "value": round(r, 3), "unit": "x", "rounds": args.rounds,
                     "command": command.strip(),
                     "notes": f"plain step {plain * 1e3:.1f} ms, {current_isa()} kernels"}
                    for w, r in ratios.items()]
    if args.record:
        append_results("speculative", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
