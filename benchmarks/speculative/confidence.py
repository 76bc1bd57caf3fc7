"""Whether how sure the target is of its own tokens tells how often a draft model agrees with it:
per answer, the target's mean top-1 probability while it decodes greedily, against the draft
model's top-1 agreement with that answer (teacher-forced, as ceiling.py replays it). The controller
scales a draft model's rate by the first (controller.Acceptance.joining) before the model joins an
answer.

    python benchmarks/speculative/confidence.py                  # 8 MT-Bench questions, 3 grounded prompts
    python benchmarks/speculative/confidence.py --record         # appends to benchmarks/results/speculative.jsonl

Printed per answer: agreement and mean confidence over the whole answer and over its first 16
tokens (what a controller sees before a draft model joins). Recorded: the share of answers whose
agreement is within 0.05 of the target's mean confidence (metric confidence_predicts_agreement), and
the median absolute difference.
"""

from __future__ import annotations

import argparse
import statistics
import sys
from pathlib import Path

import numpy as np

import edgeflash as ef
from edgeflash.runtime.speculative.controller import top_probability
from edgeflash.runtime.speculative.draft_model import find_draft_model

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from ceiling import guesses
from compare import grounded_prompts, mtbench_questions
from record import append_results, new_run_id

EARLY = 16  # the first tokens of an answer, before a draft model would join
CLOSE = 0.05


def greedy_with_confidence(engine, eos: set[int], ids: list[int], tokens: int) -> tuple[list[int], list[float]]:
    """The target's greedy answer and its top-1 probability at each token."""
    engine.reset()
    logits = engine.forward(list(ids))[-1]
    answer, confidence = [], []
    for _ in range(tokens):
        token = int(np.argmax(logits))
        answer.append(token)
        confidence.append(top_probability(logits))
        if token in eos:
            break
        logits = engine.forward([token])[-1]
    return answer, confidence


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--grounded", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--record", action="store_true")
    args = p.parse_args()

    opts = {"kv_cache": "q8_0", "context_length": 512}
    target = ef.load(args.model, **opts)
    draft_path = find_draft_model(target.source)
    if draft_path is None:
        raise SystemExit(f"no draft model for {args.model} on this machine (a model alias with its tokenizer)")
    kind = f"draft:{draft_path}"
    drafter = ef.load(args.model, **opts, speculative=kind)._drafters[kind].model
    prompts = [("MT-Bench", target.chat_prompt([{"role": "user", "content": q}]))
               for q in mtbench_questions(args.questions)]
    prompts += [("grounded", target.encode(t)) for t in grounded_prompts(args.grounded)]
    eos = set(target.source.tokenizer.eos_ids)
    print(f"{args.model}, draft model {Path(draft_path).name}, {args.tokens} tokens")
    print("| prompts | answer tokens | agreement | target confidence | first 16: agreement | first 16: confidence |")
    print("|---|---|---|---|---|---|")
    gaps = []
    for what, ids in prompts:
        answer, confidence = greedy_with_confidence(target.engine, eos, list(ids), args.tokens)
        g = guesses(drafter, list(ids), answer)
        agree = np.array(g.top1) == np.array(g.answer)
        sure = np.array(confidence)
        gaps.append(abs(float(agree.mean()) - float(sure.mean())))
        print(f"| {what} | {len(answer)} | {agree.mean():.2f} | {sure.mean():.2f} | "
              f"{agree[:EARLY].mean():.2f} | {sure[:EARLY].mean():.2f} |")
    close = sum(gap <= CLOSE for gap in gaps)
    print(f"agreement within {CLOSE} of the target's mean confidence: {close} of {len(gaps)} answers; "
          f"median difference {statistics.median(gaps):.3f}")
    if args.record:
        command = "python benchmarks/speculative/confidence.py " + " ".join(sys.argv[1:])
        config = f"MT-Bench x{args.questions} + grounded x{args.grounded}, {Path(draft_path).name}"
        append_results("speculative", [
            {"run": new_run_id(), "model": args.model, "config": config, "metric": "confidence_predicts_agreement",
             "value": round(close / len(gaps), 3), "unit": "share of answers", "command": command.strip(),
             "notes": f"agreement within {CLOSE} of the target's mean top-1 probability in {close} of {len(gaps)} "
                      f"answers; median difference {statistics.median(gaps):.3f}; {args.tokens} tokens"}])
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
