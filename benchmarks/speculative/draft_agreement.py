"""How well a draft model guesses the target, and what a draft token costs, by the format its
matrices take at load: the draft's top-1 over its shortlist against the target's own greedy answers
to MT-Bench questions (teacher-forced), and the median seconds of a one-token draft forward
against a plain target step, the engines taking turns token by token in one process.

    python benchmarks/speculative/draft_agreement.py                       # Qwen2.5-Coder-1.5B and its 0.5B
    python benchmarks/speculative/draft_agreement.py --formats none q4_0 q3_k --questions 8 --record

`none` keeps the draft model's matrices as its file holds them. `--drop-layers N ...` also
measures the draft model (its matrices in q4_0) without N of its layers, two ways: `skip` leaves
out the N layers whose removal alone costs the least agreement, `exit` its last N (early exit):
how well a draft model would guess that ran only the layers a budget keeps resident. `--record`
appends to benchmarks/results/speculative.jsonl (metrics top1_agreement and draft_step_ratio).
"""

from __future__ import annotations

import argparse
import dataclasses
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


def without_layers(source, dropped: set[int]):
    """`source` (a ModelSource) without the layers in `dropped`, the others renumbered in order."""
    from edgeflash.runtime.source import ModelSource

    keep = [i for i in range(source.spec.n_layers) if i not in dropped]
    renumber = {old: new for new, old in enumerate(keep)}
    tensors = {}
    for name, tensor in source.tensors.items():
        if name.startswith("blk."):
            _, layer, rest = name.split(".", 2)
            if int(layer) in renumber:
                tensors[f"blk.{renumber[int(layer)]}.{rest}"] = tensor
        else:
            tensors[name] = tensor
    spec = dataclasses.replace(source.spec, n_layers=len(keep),
                               layer_kinds=[source.spec.layer_kinds[i] for i in keep])
    return ModelSource(path=source.path, kind=source.kind, spec=spec, tokenizer=source.tokenizer,
                       tensors=tensors, info=dict(source.info))


def agreement(drafter, answers: list) -> float:
    """The draft's top-1 over its shortlist against the target's greedy answers, teacher-forced."""
    agree = total = 0
    for ids, answer in answers:
        drafter.engine.reset()
        logits = drafter.engine.forward(ids + answer[:-1], all_logits=True)[len(ids) - 1:]
        for row, token in zip(logits, answer):
            agree += drafter.head.best_two(row)[0] == token
            total += 1
    return agree / total


def layer_drop_rows(path, target, answers: list, counts: list[int]) -> dict:
    """Agreement of the draft model (q4_0 matrices) without layers, by how many and which go."""
    from edgeflash.runtime.speculative.draft_model import DRAFT_REQUANTIZE, model_drafter, open_draft_model

    source = open_draft_model(path, target.source)
    n = source.spec.n_layers

    def measured(dropped: set[int]) -> tuple[float, float]:
        drafter = model_drafter(path, target.engine, requantize=DRAFT_REQUANTIZE,
                                source=without_layers(source, dropped))
        return agreement(drafter, answers), drafter.engine.stats()["laid_out_bytes"] / 2**20

    alone = {i: measured({i})[0] for i in range(n)}  # the cost of leaving out each layer by itself
    least_needed = sorted(range(n), key=lambda i: (-alone[i], i))
    rows = {}
    for count in counts:
        for how, dropped in (("skip", set(least_needed[:count])), ("exit", set(range(n - count, n)))):
            share, mib = measured(dropped)
            rows[f"{DRAFT_REQUANTIZE}, {how} {count} of {n} layers"] = {
                "agreement": share, "laid_out_mb": mib, "dropped": sorted(dropped)}
    return rows


def main() -> int:
    from edgeflash.runtime.speculative.draft_model import find_draft_model, model_drafter

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--model", default="qwen2.5-coder-1.5b", help="the target model")
    p.add_argument("--formats", nargs="+", default=["none", "q4_0", "q3_k"],
                   help="what the draft model's wider matrices become at load; none: as the file holds them")
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--tokens", type=int, default=64, help="greedy answer tokens per question")
    p.add_argument("--drop-layers", nargs="*", type=int, default=[],
                   help="also measure the draft model without this many of its layers (skip and exit)")
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
    tokens = sum(len(answer) for _, answer in answers)
    for fmt, drafter in drafters.items():
        rows[fmt] = {"agreement": agreement(drafter, answers),
                     "laid_out_mb": drafter.engine.stats()["laid_out_bytes"] / 2**20}
    seconds = step_seconds({"target": target.engine, **{fmt: d.engine for fmt, d in drafters.items()}},
                           answers[0][0] + answers[0][1])
    del drafters
    rows.update(layer_drop_rows(path, target, answers, args.drop_layers))
    print(f"draft model {Path(path).name} for {args.model}: {args.questions} MT-Bench answers, "
          f"{tokens} tokens")
    print("| draft matrices | top-1 agreement | draft token ms | target step ms | ratio | laid out MiB |")
    print("|---|---|---|---|---|---|")
    run, records = new_run_id(), []
    command = "python benchmarks/speculative/draft_agreement.py " + " ".join(sys.argv[1:])
    for fmt, r in rows.items():
        base = {"run": run, "model": args.model, "config": f"draft {Path(path).name}, matrices {fmt}",
                "command": command.strip()}
        notes = f"{tokens} MT-Bench answer tokens, teacher-forced"
        if fmt not in seconds:  # a layer-drop variant: agreement only (a forward that many layers shorter)
            print(f"| {fmt} | {r['agreement']:.3f} | - | - | - | {r['laid_out_mb']:.0f} |")
            records.append({**base, "metric": "top1_agreement", "value": round(r["agreement"], 4),
                            "notes": f"{notes}; layers left out: {r['dropped']}"})
            continue
        draft_ms, target_ms = 1e3 * seconds[fmt], 1e3 * seconds["target"]
        print(f"| {fmt} | {r['agreement']:.3f} | {draft_ms:.2f} | {target_ms:.2f} | {draft_ms / target_ms:.3f} | "
              f"{r['laid_out_mb']:.0f} |")
        records += [{**base, "metric": "top1_agreement", "value": round(r["agreement"], 4), "notes": notes},
                    {**base, "metric": "draft_step_ratio", "value": round(draft_ms / target_ms, 4),
                     "rounds": ROUNDS, "notes": f"draft {draft_ms:.2f} ms, target {target_ms:.2f} ms a token"}]
    if args.record:
        append_results("speculative", records)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
