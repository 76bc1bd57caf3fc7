"""Decode speed under a memory budget with the resident matrices in the file's row layout or laid
out in panels in place (the default; docs/kernels.md), side by side in one process, taking turns.

Each round loads the model under the budget twice, once with its resident matrices kept in rows and
once laid out, and times single-token decode steps after a chat prompt (the median of `--steps`).
Both must give the same logits. Prints the medians and the rows / panels time ratio per round.

  python benchmarks/memory/resident_layout.py                      # 4 models, budget 1.5x the file
  python benchmarks/memory/resident_layout.py --models qwen2.5-coder-1.5b --budget 0.5 --rounds 3
  python benchmarks/memory/resident_layout.py --record             # append to benchmarks/results
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
from record import append_result, new_run_id  # noqa: E402

MODELS = ("smollm2-135m", "gemma3-270m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
QUESTION = "Explain the difference between a list and a tuple in Python."


def measure(alias: str, budget: int, panels: bool, steps: int) -> tuple[float, np.ndarray, int]:
    """(median seconds a decode step, the prompt's last logits, bytes laid out in place)."""
    import edgeflash as ef
    from edgeflash.runtime import budgeted

    install = budgeted.BudgetedWeights.install

    def chosen_layout(self, engine):
        self.panels = self.panels and panels
        return install(self, engine)

    budgeted.BudgetedWeights.install = chosen_layout
    try:
        m = ef.load(alias, memory_budget=budget, context_length=512, kv_cache="q8_0")
    finally:
        budgeted.BudgetedWeights.install = install
    ids = m.chat_prompt([{"role": "user", "content": QUESTION}])
    m.engine.reset()
    logits = m.engine.forward(ids)[-1].copy()
    times = []
    for _ in range(steps):
        t0 = time.perf_counter()
        m.engine.forward([ids[-1]])
        times.append(time.perf_counter() - t0)
        m.engine.truncate(len(ids))
    return statistics.median(times), logits, int(m.engine.stats()["laid_out_in_place_bytes"])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS))
    ap.add_argument("--budget", type=float, default=1.5, help="memory budget as a fraction of the model file")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=10, help="decode steps timed per load")
    ap.add_argument("--record", action="store_true", help="append the medians to benchmarks/results")
    args = ap.parse_args()
    from edgeflash.base.models import resolve_model

    run = new_run_id()
    print("| model | budget | rows ms/token | panels ms/token | rows / panels | laid out in place |")
    print("|---|---|---|---|---|---|")
    for alias in args.models:
        budget = int(args.budget * Path(resolve_model(alias)).stat().st_size)
        rows, panels, laid_out = [], [], 0
        for _ in range(args.rounds):
            r, rows_logits, _ = measure(alias, budget, False, args.steps)
            p, panel_logits, laid_out = measure(alias, budget, True, args.steps)
            if not np.array_equal(rows_logits, panel_logits):
                diff = float(np.abs(rows_logits - panel_logits).max())
                print(f"note: {alias}: rows and panels logits differ by up to {diff:.3g}")
            rows.append(r)
            panels.append(p)
        ratios = [a / b for a, b in zip(rows, panels)]
        print(f"| {alias} | {args.budget:g}x | {statistics.median(rows) * 1e3:.1f} | {statistics.median(panels) * 1e3:.1f} | "
              f"{statistics.median(ratios):.2f}x ({', '.join(f'{x:.2f}' for x in ratios)}) | {laid_out / 2**20:.0f} MiB |",
              flush=True)
        if args.record:
            for config, values in (("rows", rows), ("panels", panels)):
                append_result("resident-layout", {
                    "run": run, "model": alias, "budget": f"{args.budget:g}x", "budget_mb": round(budget / 1e6),
                    "config": config, "metric": "decode_ms_per_token", "value": round(statistics.median(values) * 1e3, 2),
                    "low": round(min(values) * 1e3, 2), "high": round(max(values) * 1e3, 2), "unit": "ms",
                    "rounds": args.rounds, "command": "python benchmarks/memory/resident_layout.py " + " ".join(sys.argv[1:])})


if __name__ == "__main__":
    main()
