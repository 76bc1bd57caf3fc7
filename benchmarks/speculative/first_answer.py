"""The first speculative answer of a run, with and without what earlier runs learned, side by side.

  python benchmarks/speculative/first_answer.py                  # Qwen2.5-Coder-1.5B, auto, no budget and 25%
  python benchmarks/speculative/first_answer.py --budgets 0.25 --questions 4 --no-record

A command-line run is one answer, so what a process learns about speculation (pass and draft costs,
a draft model's calibration) would be lost with it; runtime/speculative/learned.py keeps it on disk.
Per MT-Bench question, two new processes each decode it plainly and then with speculation (the
first speculative answer of that process): one starts from nothing learned (an empty state
folder), the other from what the earlier processes of this benchmark left (primed by one run on a
question that is not asked). Speedup = speculative decode tok/s over the same process's plain
decode tok/s; which of the two runs first alternates by question. Greedy; every output is checked
against plain decoding. Results are appended to benchmarks/results/speculative.jsonl (metric
first_answer_speedup, config "fresh" or "learned").
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import label, mtbench_questions
from record import append_results, new_run_id

RUN = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    model, budget, tokens, kind, context, question = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4], \\
        int(sys.argv[5]), sys.stdin.read()
    opts = {"kv_cache": "q8_0"}
    if budget != "none":
        opts.update(memory_budget=int(budget), context_length=context)
    plain = ef.load(model, **opts)
    ids = plain.chat_prompt([{"role": "user", "content": question}])
    p = plain.generate(ids, max_tokens=tokens)
    spec = plain if budget == "none" else ef.load(model, **opts, speculative=kind)
    spec.engine.reset()
    s = spec.generate(ids, max_tokens=tokens, speculative=kind)
    print(json.dumps({"plain_tok_s": p.stats["decode_tok_s"], "spec_tok_s": s.stats["decode_tok_s"],
                      "same": s.tokens == p.tokens, "tokens": len(s.tokens),
                      "plain_steps": s.stats.get("spec_plain_steps"), "passes": s.stats.get("spec_passes")}))
""")


def run_once(model: str, budget: str, args, question: str, state: Path) -> dict:
    env = {**os.environ, "EDGEFLASH_SPECULATIVE_STATE": str(state)}
    proc = subprocess.run([sys.executable, "-c", RUN, model, budget, str(args.tokens), args.drafter,
                           str(args.context)], input=question, capture_output=True, text=True, cwd="/", env=env,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{model} at {budget}: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--drafter", default="auto", help="the speculative= kind (default auto)")
    p.add_argument("--budgets", nargs="+", default=["none", "0.25"], help="none and/or fractions of the model file")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=512, help="context length of the budgeted runs (KV cache)")
    p.add_argument("--no-record", action="store_true", help="print only; append nothing to benchmarks/results")
    args = p.parse_args()
    from edgeflash.base.models import resolve_model

    questions = mtbench_questions(args.questions + 1)
    priming, asked = questions[-1], questions[:-1]
    size = resolve_model(args.model).stat().st_size
    run_id, command = new_run_id(), "python " + " ".join([str(Path(sys.argv[0]).relative_to(REPO))
                                                          if Path(sys.argv[0]).is_absolute() else sys.argv[0],
                                                          *sys.argv[1:]])
    print("| budget | state | speedup median | worst | plain steps (median) | identical |")
    print("|---|---|---|---|---|---|")
    for budget in args.budgets:
        b = "none" if budget == "none" else str(int(size * float(budget)))
        with tempfile.TemporaryDirectory() as tmp:
            learned = Path(tmp) / "learned"
            run_once(args.model, b, args, priming, learned)
            results: dict[str, list[dict]] = {"fresh": [], "learned": []}
            for i, question in enumerate(asked):
                order = ("fresh", "learned") if i % 2 == 0 else ("learned", "fresh")
                for state in order:
                    folder = learned if state == "learned" else Path(tmp) / f"fresh-{i}"
                    results[state].append(run_once(args.model, b, args, question, folder))
        records = []
        for state, rows in results.items():
            ratios = [r["spec_tok_s"] / r["plain_tok_s"] for r in rows if r["spec_tok_s"] and r["plain_tok_s"]]
            same = sum(r["same"] for r in rows)
            steps = statistics.median(r["plain_steps"] or 0 for r in rows)
            print(f"| {label(budget)} | {state} | {statistics.median(ratios):.2f}x | {min(ratios):.2f}x | {steps:g} | "
                  f"{same}/{len(rows)} |")
            common = {"run": run_id, "model": args.model, "budget": label(budget), "command": command,
                      "config": f"MT-Bench x{len(rows)}, {args.drafter}, {state}"}
            if b != "none":
                common["budget_mb"] = round(int(b) / 1e6)
            records += [
                {**common, "metric": "first_answer_speedup", "value": round(statistics.median(ratios), 3),
                 "low": round(min(ratios), 3), "high": round(max(ratios), 3), "unit": "x", "rounds": len(ratios),
                 "notes": f"greedy, {args.tokens} new tokens, q8_0 KV cache; the first speculative answer of a new "
                          f"process over its plain decoding; median {steps:g} plain steps in it"},
                {**common, "metric": "identical_outputs", "value": same == len(rows),
                 "notes": f"{same}/{len(rows)} answers identical to plain decoding"},
            ]
        if not args.no_record:
            append_results("speculative", records)


if __name__ == "__main__":
    main()
