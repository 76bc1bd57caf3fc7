"""How well a draft model guesses the target, and what a draft token costs, by the format its
matrices take at load: the draft's top-1 over its shortlist against the target's own greedy answers
to MT-Bench questions (teacher-forced), and the median seconds of a one-token draft forward
against a plain target step, the engines taking turns token by token in one process.

    python benchmarks/speculative/draft_agreement.py                       # Qwen2.5-Coder-1.5B and its 0.5B
    python benchmarks/speculative/draft_agreement.py --formats none q4_0 q3_k --questions 8 --record

`none` keeps the draft model's matrices as its file holds them. `--record` appends to
benchmarks/results/speculative.jsonl (metrics top1_agreement and draft_step_ratio).
"""

from __future__ import annotations

import argparse
import statistics
import sys
import time
from pathlib import Path

import edgeflash as ef

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import mtbench_questions
from record import append_results, new_run_id

WARM_TOKENS, TIMED_TOKENS, ROUNDS = 64, 32, 5


def step_seconds(engines: dict, ids: list[int]) -> dict:
    """Median seconds of a one-token forward of each engine after WARM_TOKENS of context. The
    engines take turns token by token, so a slow moment of a shared machine hits them alike."""
    times: dict = {name: [] for name in engines}
    for _ in range(ROUNDS):
        for engine in engines.values():
            engine.reset()
            engine.forward(ids[:WARM_TOKENS])
        for tok in ids[WARM_TOKENS:WARM_TOKENS + TIMED_TOKENS]:
            for name, engine in engines.items():
                t = time.perf_counter()
                engine.forward([tok])
                times[name].append(time.perf_counter() - t)
    return {name: statistics.median(ts) for name, ts in times.items()}


def main() -> int:
    from edgeflash.runtime.speculative.draft_model import find_draft_model, model_drafter

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target model")
    p.add_argument("--formats", nargs="+", default=["none", "q4_0", "q3_k"],
                   help="what the draft model's wider matrices become at load; none: as the file holds them")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64, help="greedy answer tokens per question")
    p.add_argument("--record", action="store_true")
    args = p.parse_args()

    target = ef.load(args.model, kv_cache="q8_0", context_length=1024)
    path = find_draft_model(target.source)
    if path is None:
        raise SystemExit(f"no draft model for {args.model} on this machine (a model alias with its tokenizer)")
    answers = []
    for question in mtbench_questions(args.questions):
        ids = target.chat_prompt([{"role": "user", "content": question}])
        target.engine.reset()
        answers.append((list(ids), list(target.generate(ids, max_tokens=args.tokens).tokens)))
    drafters = {fmt: model_drafter(path, target.engine, requantize=None if fmt == "none" else fmt)
                for fmt in args.formats}
    rows = {}
    for fmt, drafter in drafters.items():
        agree = total = 0
        for ids, answer in answers:
            drafter.engine.reset()
            logits = drafter.engine.forward(ids + answer[:-1], all_logits=True)[len(ids) - 1:]
            for row, token in zip(logits, answer):
                agree += drafter.head.best_two(row)[0] == token
                total += 1
        rows[fmt] = {"agreement": agree / total, "tokens": total,
                     "laid_out_mb": drafter.engine.stats()["laid_out_bytes"] / 2**20}
    seconds = step_seconds({"target": target.engine, **{fmt: d.engine for fmt, d in drafters.items()}},
                           answers[0][0] + answers[0][1])
    print(f"draft model {Path(path).name} for {args.model}: {args.questions} MT-Bench answers, "
          f"{rows[args.formats[0]]['tokens']} tokens")
    print("| draft matrices | top-1 agreement | draft token ms | target step ms | ratio | laid out MiB |")
    print("|---|---|---|---|---|---|")
    run, records = new_run_id(), []
    command = "python benchmarks/speculative/draft_agreement.py " + " ".join(sys.argv[1:])
    for fmt, r in rows.items():
        draft_ms, target_ms = 1e3 * seconds[fmt], 1e3 * seconds["target"]
        print(f"| {fmt} | {r['agreement']:.3f} | {draft_ms:.2f} | {target_ms:.2f} | {draft_ms / target_ms:.3f} | "
              f"{r['laid_out_mb']:.0f} |")
        base = {"run": run, "model": args.model, "config": f"draft {Path(path).name}, matrices {fmt}",
                "command": command.strip()}
        records += [{**base, "metric": "top1_agreement", "value": round(r["agreement"], 4),
                     "notes": f"{r['tokens']} MT-Bench answer tokens, teacher-forced"},
                    {**base, "metric": "draft_step_ratio", "value": round(draft_ms / target_ms, 4),
                     "rounds": ROUNDS, "notes": f"draft {draft_ms:.2f} ms, target {target_ms:.2f} ms a token"}]
    if args.record:
        append_results("speculative", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
