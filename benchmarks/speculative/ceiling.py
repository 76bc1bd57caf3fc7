"""The most a draft model's chains can give on this machine: the target's own greedy answers replayed
against the draft model's guesses (teacher-forced), under the measured cost of every part of a pass,
with no controller, no warm-up and no Python between the parts. At the same costs, what the
speculative decoder measures (compare.py) can only be lower.

    python benchmarks/speculative/ceiling.py                            # no budget and 25%
    python benchmarks/speculative/ceiling.py --budgets none --questions 8 --grounded 3 --record

Per answer, every policy of a grid is replayed: draft a chain while the draft model's probability
of its top-1 stays at or above a threshold, up to a depth, optionally with each drafted token's
runner-up as a leaf. A pass yields the leading drafted tokens that equal the target's answer (a
runner-up leaf where the chain first differs, if it is the answer's token), plus the target's own
token; it costs its drafted forwards and a verification pass of its width, both in plain steps,
measured in this process with the engines taking turns (at a budget: the plain model under the
budget for the plain step; the speculating model, whose draft model takes part of the same budget,
for the rest). Two ceilings per prompt set: the best single policy (the median over answers, the
policy chosen for it), and each answer's own best policy (an oracle); the third column is the
oracle with the draft model's catch-up charged once per answer (taking in the prompt's last 192
tokens, as the decoder's draft model joins).
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np

import edgeflash as ef
from edgeflash.runtime.speculative.draft_model import find_draft_model
from edgeflash.runtime.speculative.drafters import ModelDrafter

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import grounded_prompts, label, mtbench_questions
from record import append_results, new_run_id
from verify_cost import CACHED, pass_seconds

THRESHOLDS = (0.0, 0.2, 0.4, 0.6, 0.8)
DEPTHS = (1, 2, 3, 4, 6, 8)
ROUNDS = 7
MAX_WIDTH = 16  # the widest pass a budgeted engine runs


@dataclass(frozen=True)
class Policy:
    threshold: float
    depth: int
    leaves: bool

    def __str__(self) -> str:
        return f"p>={self.threshold:.1f}, depth {self.depth}" + (", runner-up leaves" if self.leaves else "")


@dataclass
class Guesses:
    """The draft model's two best tokens and its top-1 probability at each answer position."""
    answer: list[int]
    top1: list[int]
    prob: list[float]
    top2: list[int]
    catch_up_tokens: int


def guesses(drafter: ModelDrafter, prompt: list[int], answer: list[int]) -> Guesses:
    view = drafter.join_afresh(prompt)
    drafter.engine.reset()
    logits = drafter.engine.forward(view + answer[:-1], all_logits=True)[len(view) - 1:]
    best = [drafter.head.best_two(row) for row in logits]
    return Guesses(answer, [b[0] for b in best], [b[1] for b in best], [b[2] for b in best], len(view))


def replay(g: Guesses, policy: Policy, verify: dict[int, float], draft: float) -> float:
    """Plain steps one answer costs under `policy` (its first token comes from the prompt's pass)."""
    i, cost, n = 1, 0.0, len(g.answer)
    while i < n:
        room = n - i - 1  # the pass adds a token of its own
        widest = max(verify)  # a pass is at most the engine's batch
        depth = min(policy.depth, room, (widest - 1) // (2 if policy.leaves else 1))
        k = 0
        while k < depth and g.prob[i + k] >= policy.threshold:
            k += 1
        # a token below the threshold was drafted too: its probability is known only after its forward
        forwards = k + (k < depth)
        if k == 0:
            cost, i = cost + forwards * draft + 1.0, i + 1
            continue
        accepted = 0
        while accepted < k and g.top1[i + accepted] == g.answer[i + accepted]:
            accepted += 1
        runner_up = policy.leaves and accepted < k and g.top2[i + accepted] == g.answer[i + accepted]
        width = 1 + k + (k if policy.leaves else 0)
        # (the next pass's first forward takes in whatever this one accepted after its drafted
        # tokens, in one batch)
        cost += forwards * draft + verify[width]
        i += accepted + runner_up + 1
    return cost


def measure_costs(plain_engine, target_engine, drafter: ModelDrafter, ids: list[int],
                  widths: list[int]) -> tuple[dict[int, float], float, float, float]:
    """(verify cost by width, draft forward, one catch-up token) in plain steps, and the plain step
    in seconds: medians of ROUNDS rounds, every engine taking turns."""
    times: dict = {("verify", w): [] for w in widths}
    times.update({("plain", 1): [], ("draft", 1): [], ("catch-up", 1): []})
    for e in (plain_engine, target_engine, drafter.engine):
        e.reset()
        e.forward(ids[:CACHED])
    pass_seconds(target_engine, ids, max(widths))  # scratch buffers at their largest
    for _ in range(ROUNDS):
        times["plain", 1].append(pass_seconds(plain_engine, ids, 1))
        for w in widths:
            times["verify", w].append(pass_seconds(target_engine, ids, w))
        times["draft", 1].append(pass_seconds(drafter.engine, ids, 1))
        drafter.engine.truncate(0)
        start = time.perf_counter()
        drafter.engine.forward(ids[:CACHED])
        times["catch-up", 1].append((time.perf_counter() - start) / CACHED)
    plain = statistics.median(times["plain", 1])
    verify = {w: statistics.median(times["verify", w]) / plain for w in widths}
    return verify, statistics.median(times["draft", 1]) / plain, \
        statistics.median(times["catch-up", 1]) / plain, plain


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b")
    p.add_argument("--budgets", nargs="+", default=["none", "0.25"],
                   help="none and/or fractions of the model file")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--grounded", type=int, default=3)
    p.add_argument("--tokens", type=int, default=64)
    p.add_argument("--context", type=int, default=512)
    p.add_argument("--per-answer", action="store_true", help="also print each answer's ceilings")
    p.add_argument("--record", action="store_true")
    args = p.parse_args()

    opts = {"kv_cache": "q8_0", "context_length": args.context}
    base = ef.load(args.model, **opts)
    draft_path = find_draft_model(base.source)
    if draft_path is None:
        raise SystemExit(f"no draft model for {args.model} on this machine "
                         "(a model alias with its tokenizer)")
    kind = f"draft:{draft_path}"
    prompts = [("MT-Bench", base.chat_prompt([{"role": "user", "content": q}]))
               for q in mtbench_questions(args.questions)]
    prompts += [("grounded", base.encode(t)) for t in grounded_prompts(args.grounded)]
    answers = []
    for what, ids in prompts:
        base.engine.reset()
        answer = base.generate(ids, max_tokens=args.tokens, speculative=None).tokens
        answers.append((what, list(ids), list(answer)))
    sample = answers[0][1] + answers[0][2]
    widths = list(range(2, 1 + min(2 * max(DEPTHS) + 1, MAX_WIDTH)))  # chains, with their leaves
    run, records = new_run_id(), []
    command = "python benchmarks/speculative/ceiling.py " + " ".join(sys.argv[1:])
    policies = [Policy(t, d, leaves) for t, d, leaves in itertools.product(THRESHOLDS, DEPTHS, (False, True))]
    for budget in args.budgets:
        if budget == "none":
            plain, spec = base, ef.load(args.model, **opts, speculative=kind)
        else:
            size = int(float(budget) * Path(base.source.path).stat().st_size)
            plain = ef.load(args.model, **opts, memory_budget=size)
            spec = ef.load(args.model, **opts, memory_budget=size, speculative=kind)
        drafter = spec._drafters[kind].model
        if drafter is None:
            print(f"{label(budget)}: no room for the draft model next to the target")
            continue
        verify, draft, catch_up, plain_s = measure_costs(plain.engine, spec.engine, drafter, sample, widths)
        print(f"\n{args.model} with {Path(draft_path).name}, budget {label(budget)}: plain step "
              f"{plain_s * 1e3:.0f} ms; in plain steps a draft forward {draft:.3f}, a catch-up token "
              f"{catch_up:.4f}, a verification pass of 2 / 3 / 5 / 9 nodes "
              + " / ".join(f"{verify[w]:.2f}" for w in (2, 3, 5, 9)))
        replays = [(what, guesses(drafter, ids, answer)) for what, ids, answer in answers]
        print("| prompts | best single policy | its median (worst) | each answer's best: median (worst) | "
              "with catch-up: median (worst) | top-1 agreement |")
        print("|---|---|---|---|---|---|")
        for what in dict.fromkeys(w for w, _ in replays):
            gs = [g for w, g in replays if w == what]
            steps = {pol: [replay(g, pol, verify, draft) for g in gs] for pol in policies}
            tokens = [len(g.answer) - 1 for g in gs]
            best = max(policies, key=lambda pol: statistics.median(n / c for n, c in zip(tokens, steps[pol])))
            own_best = [min(steps[pol][j] for pol in policies) for j in range(len(gs))]
            # the catch-up is paid only where drafting after it beats plain steps
            charged = [min(n, c + g.catch_up_tokens * catch_up) for n, c, g in zip(tokens, own_best, gs)]
            row = {name: [n / c for n, c in zip(tokens, costs)]
                   for name, costs in (("best single policy", steps[best]), ("each answer's best", own_best),
                                       ("with catch-up", charged))}
            agree = [float(np.mean(np.array(g.top1) == np.array(g.answer))) for g in gs]
            if args.per_answer:
                for j, g in enumerate(gs):
                    print(f"  {what} {j + 1}: {len(g.answer)} tokens, top-1 agreement {agree[j]:.0%}, "
                          + ", ".join(f"{name} {v[j]:.2f}x" for name, v in row.items())
                          + f" (catch-up {g.catch_up_tokens} tokens)")
            overall = sum(a * len(g.answer) for a, g in zip(agree, gs)) / sum(len(g.answer) for g in gs)
            print(f"| {what} x{len(gs)} | {best} | " + " | ".join(
                f"{statistics.median(v):.2f}x ({min(v):.2f}x)" for v in row.values()) + f" | {overall:.1%} |")
            for name, values in row.items():
                records.append({"run": run, "model": args.model, "budget": label(budget),
                                "config": f"{what} x{len(gs)}, {name}", "metric": "speedup_ceiling",
                                "value": round(statistics.median(values), 3), "low": round(min(values), 3),
                                "unit": "x", "command": command.strip(),
                                "notes": f"draft model {Path(draft_path).name}, {args.tokens} tokens, top-1 "
                                         f"agreement {overall:.1%}; best single policy: {best}; in plain "
                                         f"steps a draft forward {draft:.3f}, a 2-node pass {verify[2]:.2f}"})
        del plain, spec, drafter
    if args.record:
        append_results("speculative", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
