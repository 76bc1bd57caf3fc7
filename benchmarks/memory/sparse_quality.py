"""Quality of sparse FFN settings on held-out prose and code: perplexity and top-1 agreement with the
exact run, teacher-forced token by token (as decoding runs), one configuration loaded at a time.

    python benchmarks/memory/sparse_quality.py --bundle BUNDLE --tokens 64 \
        --cats 0.2 0.3 0.5 --configs "s0.3" "s0.3 c64"

`--cats S`: the exact CATS criterion at level S (every neuron's gate computed from the dense arena,
those with |act(gate . x)| under the level's threshold skipped): what the criterion itself costs,
without a predictor. `--configs`: sparse mode as a budgeted run takes it (`sS` neuron by neuron
through the predictor, `sS cK` in chunks of K KiB). The budget holds every weight, so only the
selection differs from the exact run. Records go to benchmarks/results/memory-sparse-quality.jsonl.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]


def config_options(name: str) -> dict:
    """'s0.3' -> sparsity 0.3 neuron by neuron; 's0.3 c64' -> in chunks of 64 KiB."""
    parts = name.split()
    options = {"sparsity": float(parts[0][1:]), "ffn_fallback": False}
    for p in parts[1:]:
        if p.startswith("c"):
            options["neuron_chunk"] = int(p[1:]) * 1024
    return options


def score(model, texts: dict[str, str], tokens: int) -> dict[str, tuple[list[float], list[int]]]:
    from edgeflash.export.text import token_windows

    out = {}
    for kind, text in texts.items():
        nll, top = [], []
        for window in token_windows(model.tokenizer, text, tokens, 64, kind):
            model.engine.reset()
            for i, tok in enumerate(window[:-1]):
                logits = model.engine.forward([tok])[-1].astype(np.float64)
                z = logits.max() + np.log(np.exp(logits - logits.max()).sum())
                nll.append(float(z - logits[window[i + 1]]))
                top.append(int(np.argmax(logits)))
        out[kind] = (nll, top)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--bundle", type=Path, required=True)
    p.add_argument("--tokens", type=int, default=64, help="held-out tokens per text (windows of 64)")
    p.add_argument("--cats", nargs="*", type=float, default=[], help="levels of the exact CATS criterion")
    p.add_argument("--configs", nargs="*", default=[], help="sparse settings, e.g. 's0.3' 's0.3 c64'")
    args = p.parse_args()
    import edgeflash as ef
    from edgeflash.export.corpus import code_heldout_text, heldout_text

    sys.path.insert(0, str(REPO / "benchmarks" / "results"))
    from record import append_results, new_run_id

    manifest = json.loads((args.bundle / "manifest.json").read_text())
    targets = manifest["calibration"]["sparsity"]["targets"]
    thresholds = manifest["calibration"]["sparsity"]["act_threshold"]
    budget = sum(b["nbytes"] for b in manifest["blocks"]) * 6 // 5  # every weight fits
    texts = {"prose": heldout_text(), "code": code_heldout_text()}
    run_id, command = new_run_id(), "python benchmarks/memory/sparse_quality.py " + " ".join(sys.argv[1:])
    model_name = manifest["model"]["name"]
    exact, records = None, []

    def report(name: str, scores: dict) -> None:
        nonlocal exact
        if exact is None:
            exact = scores
        for kind, (nll, top) in scores.items():
            ppl = float(np.exp(np.mean(nll)))
            base = float(np.exp(np.mean(exact[kind][0])))
            agree = float(np.mean(np.asarray(top) == np.asarray(exact[kind][1])))
            print(f"| {name} | {kind} | {ppl:.3f} | {(ppl / base - 1) * 100:+.1f}% | {agree:.1%} | {len(nll)} |", flush=True)
            for metric, value, unit in ((f"perplexity_{kind}", round(ppl, 4), None),
                                        (f"perplexity_{kind}_delta_pct", round((ppl / base - 1) * 100, 2), "%"),
                                        (f"top1_agreement_{kind}", round(agree, 4), None)):
                records.append({"run": run_id, "model": model_name, "config": name, "metric": metric, "value": value,
                                "unit": unit, "notes": f"{len(nll)} positions", "command": command})

    print("| config | text | perplexity | vs exact | top-1 = exact | positions |\n|---|---|---|---|---|---|")
    m = ef.load(args.bundle, memory_budget=budget, context_length=256)
    report("exact", score(m, texts, args.tokens))
    for level in args.cats:
        m.engine._engine.set_ffn_thresholds([float(t[targets.index(level)]) for t in thresholds])
        report(f"CATS exact {level:g}", score(m, texts, args.tokens))
    m.close()
    for name in args.configs:
        m = ef.load(args.bundle, memory_budget=budget, context_length=256, **config_options(name))
        report(name, score(m, texts, args.tokens))
        m.close()
    append_results("memory-sparse-quality", records)
    print(f"{len(records)} records appended (run {run_id})", file=sys.stderr)


if __name__ == "__main__":
    main()
