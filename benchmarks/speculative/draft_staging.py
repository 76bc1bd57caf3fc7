"""A budgeted draft model streaming through its target's staging arena against slots of its own,
side by side in one process.

  python benchmarks/speculative/draft_staging.py                       # Qwen2.5-Coder-1.5B at 25%, 8 questions
  python benchmarks/speculative/draft_staging.py --questions 4 --no-record

Under a memory budget, a draft model's streamed layers pass through the target's staging arena
(memory/native/streaming.h): its own slots' bytes keep more of its layers resident, and the units it
streams stay in the arena from one draft token to the next. Both variants get the same share of the
same budget: `own` plans its slots inside that share (as before the arena was shared), `borrowed`
streams through the target's. Per MT-Bench question (in the chat format, greedy) the order is plain,
own, borrowed, plain; speedup = decode tok/s over the mean of the two plain decodings, and every
output is checked against plain decoding. Also timed: a draft token and an 8-node verification pass,
each variant taking turns, in the way a speculative step runs them (six draft tokens, then the
pass). Each load starts from nothing learned (an empty state folder). Results are appended to
benchmarks/results/speculative.jsonl (metric `speedup`, configs "MT-Bench xN, draft, own staging"
and "..., target's staging"; metrics `draft_token_ms` and `verify_8_ms`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import edgeflash as ef
from edgeflash.base.models import resolve_model
from edgeflash.kernels import current_isa
from edgeflash.runtime.speculative.draft_model import find_draft_model, model_drafter
from edgeflash.runtime.speculative.tree import DraftTree

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import label, mtbench_questions
from record import append_results, new_run_id

TIMING_TEXT = "def fibonacci(n):\n    '''Return the n-th Fibonacci number.'''\n    a, b = 0, 1\n" * 6
CACHED = 64


def time_parts(model, drafter, ids: list[int], steps: int = 4) -> tuple[list[float], list[float]]:
    """Seconds of each draft token and each 8-node pass: six draft tokens, then the pass, as a step."""
    target, draft = model.engine, drafter.engine
    target.reset()
    draft.reset()
    target.forward(ids[:CACHED])
    draft.forward(ids[:CACHED])
    drafts, passes = [], []
    for step in range(steps):
        base = CACHED + 8 * step
        start = time.perf_counter()
        for j in range(6):
            draft.forward([ids[base + j]])
        drafted = time.perf_counter()
        tree = DraftTree.root(ids[base])
        tree.add_chain(0, ids[base + 1:base + 8], 16)
        target.forward_tree(tree.tokens, tree.depths(), tree.ancestor_mask(), argmax_only=True)
        target.commit_tree(list(range(8)))
        passes.append(time.perf_counter() - drafted)
        drafts.append((drafted - start) / 6)
        draft.truncate(base + 1)
        draft.forward(ids[base + 1:base + 8])  # the accepted tokens, as the next step takes them in
    return drafts, passes


def plan_line(drafter) -> str:
    plan = drafter.engine.weights.weights.plan
    resident = sum(1 for g in plan.resident if g.startswith("layer."))
    return (f"{resident} of {drafter.engine.spec.n_layers} layers resident, {plan.stream_bytes_per_pass / 2**20:.1f} "
            f"MiB streamed a token, staging {plan.staging_bytes / 2**20:.1f} MiB of its own, "
            f"{drafter.engine._engine.retained_units} units retained in the target's arena")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--budget", type=float, default=0.25, help="fraction of the model file")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--no-record", action="store_true")
    args = p.parse_args()
    os.environ["EDGEFLASH_SPECULATIVE_STATE"] = tempfile.mkdtemp(prefix="draft-staging-")  # nothing learned

    budget = int(args.budget * resolve_model(args.model).stat().st_size)
    opts = {"memory_budget": budget, "context_length": args.context, "kv_cache": "q8_0"}
    plain = ef.load(args.model, **opts)
    path = find_draft_model(plain.source)
    if path is None:
        raise SystemExit(f"no draft model for {args.model} on this machine (a model alias with its tokenizer)")
    kind = f"draft:{path}"
    borrowed = ef.load(args.model, **opts, speculative=kind)
    own = ef.load(args.model, **opts, speculative=kind)
    share = own.engine.weights.plan.fixed["speculative"]
    drafters = own._drafters[kind]
    drafters.model = None  # its borrowing drafter goes before the other is built: one at a time in memory
    drafters.model = model_drafter(path, own.engine, budget=share, borrow_staging=False)
    variants = {"own staging": own, "target's staging": borrowed}
    for name, m in variants.items():
        print(f"{name}: {plan_line(m._drafters[kind].model)}")

    timing_ids = plain.encode(TIMING_TEXT)
    parts = {name: ([], []) for name in variants}
    for _ in range(3):  # the variants take turns
        for name, m in variants.items():
            d, v = time_parts(m, m._drafters[kind].model, timing_ids)
            parts[name][0].extend(d)
            parts[name][1].extend(v)

    ratios = {name: [] for name in variants}
    for q in mtbench_questions(args.questions):
        ids = plain.chat_prompt([{"role": "user", "content": q}])
        runs = {}
        for name, m, k in (("plain", plain, None), ("own staging", own, kind), ("target's staging", borrowed, kind),
                           ("plain again", plain, None)):
            m.engine.reset()
            runs[name] = m.generate(ids, max_tokens=args.tokens, speculative=k)
        base = (runs["plain"].stats["decode_tok_s"] + runs["plain again"].stats["decode_tok_s"]) / 2
        for name in variants:
            if runs[name].tokens != runs["plain"].tokens:
                raise SystemExit(f"{name}: the output differs from plain decoding on {q[:40]!r}")
            ratios[name].append(runs[name].stats["decode_tok_s"] / base)
        print(" | ".join(f"{name} {ratios[name][-1]:.2f}x" for name in variants) + f" | plain {base:.2f} tok/s",
              flush=True)

    print(f"\n{args.model} at {label(str(args.budget))} ({budget / 1e6:.0f} MB), {Path(path).name} drafting, "
          f"{current_isa()} kernels, {args.questions} MT-Bench questions, {args.tokens} tokens")
    print("| draft model's slots | speedup median | worst | draft token ms | 8-node pass ms |")
    print("|---|---|---|---|---|")
    run, records = new_run_id(), []
    command = "python benchmarks/speculative/draft_staging.py " + " ".join(sys.argv[1:])
    common = {"run": run, "model": args.model, "budget": label(str(args.budget)), "command": command.strip(),
              "budget_mb": round(budget / 1e6)}
    for name, m in variants.items():
        med, worst = statistics.median(ratios[name]), min(ratios[name])
        draft_ms, verify_ms = statistics.median(parts[name][0]) * 1e3, statistics.median(parts[name][1]) * 1e3
        print(f"| {name} | {med:.2f}x | {worst:.2f}x | {draft_ms:.1f} | {verify_ms:.0f} |")
        cfg = f"MT-Bench x{args.questions}, draft, {name}"
        notes = f"gguf files, {current_isa()} kernels, greedy, {args.tokens} new tokens; {plan_line(m._drafters[kind].model)}"
        records += [
            {**common, "config": cfg, "metric": "speedup", "value": round(med, 3), "low": round(worst, 3),
             "high": round(max(ratios[name]), 3), "unit": "x", "rounds": len(ratios[name]), "notes": notes},
            {**common, "config": cfg, "metric": "draft_token_ms", "value": round(draft_ms, 2), "unit": "ms"},
            {**common, "config": cfg, "metric": "verify_8_ms", "value": round(verify_ms, 1), "unit": "ms"},
        ]
    if not args.no_record:
        append_results("speculative", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
