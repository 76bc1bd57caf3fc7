"""Every scheme on every real model: export, load in the reference runtime, generate, compare.

    python benchmarks/export/matrix.py                         # both models, every scheme
    python benchmarks/export/matrix.py --models smollm2-135m --schemes keep q8_0

For each (model, scheme): a real `edgeflash export` run (default settings unless options follow
`--`), `edgeflash generate -m BUNDLE --engine reference` (greedy, 16 tokens), and for `keep` a
check that the bundle's logits equal the GGUF's exactly. Prints a markdown table of bundle
sizes and perplexities (source, exported, round-to-nearest baseline, sparsity costs).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

MODELS = ("gemma3-270m", "smollm2-135m")
SCHEMES = ("keep", "q8_0", "q4_0", "q4_1", "q4_k", "q4_lut", "q4_0-mixed")
PROMPT = "The three most useful things to pack for a week of hiking are"


def keep_logits_equal(model: str, bundle: Path) -> bool:
    import numpy as np
    from edgeflash.base.models import resolve_model
    from edgeflash.runtime.bundle import load_bundle
    from edgeflash.runtime.reference import ReferenceEngine
    from edgeflash.runtime.sources import open_model

    gguf = open_model(resolve_model(model))
    ids = gguf.tokenizer.encode(PROMPT)
    return bool(np.array_equal(ReferenceEngine(load_bundle(bundle)).forward(ids, all_logits=True),
                               ReferenceEngine(gguf).forward(ids, all_logits=True)))


def run_one(model: str, scheme: str, out: Path, extra: list[str]) -> dict:
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "export", model, "-o", str(out), "--quant",
                           scheme, "--quiet", "--force", "--json", *extra], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        return {"model": model, "scheme": scheme, "error": proc.stderr.strip().splitlines()[-1:]}
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    gen = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "generate", "-m", str(out), "--engine",
                          "reference", "-p", PROMPT, "-n", "16"], capture_output=True, text=True, check=False)
    report = summary["report"]
    row = {"model": model, "scheme": scheme, "wall_s": round(wall, 1), "bundle_mib": round(summary["weights_bytes"] / 2**20, 1),
           "size_by_role": report.get("size_by_role"), "perplexity": report.get("perplexity"),
           "baseline": report.get("baseline"), "sparsity": report.get("sparsity"),
           "fallbacks": len(report.get("fallbacks") or []), "eval_tokens": (report.get("eval") or {}).get("tokens"),
           "generate_ok": gen.returncode == 0, "generated": gen.stdout.strip()[len(PROMPT):].strip()[:80]}
    if scheme == "keep":
        row["keep_logits_equal_gguf"] = keep_logits_equal(model, out)
    return row


def table(rows: list[dict]) -> str:
    head = ("| model | scheme | bundle MiB | ppl source | ppl exported | Δ | round-to-nearest (Δ) | sparsity 30/50/70% Δ "
            "| fallbacks | generates |")
    lines = [head, "|" + "|".join("---" for _ in range(10)) + "|"]
    for r in rows:
        if "error" in r:
            lines.append(f"| {r['model']} | {r['scheme']} | error: {r['error']} |||||||")
            continue
        p = r["perplexity"] or {}
        b = r["baseline"]
        sp = "/".join(f"{s['delta_pct']:+.0f}%" for s in r["sparsity"] or [])
        lines.append(f"| {r['model']} | {r['scheme']} | {r['bundle_mib']} | {p.get('source')} | {p.get('exported')} | "
                     f"{p.get('delta_pct', 0):+.2f}% | "
                     + (f"{b['perplexity']} ({b['delta_pct']:+.1f}%)" if b else "-")
                     + f" | {sp} | {r['fallbacks']} | {'yes' if r['generate_ok'] else 'NO'}"
                     + (" (logits = GGUF)" if r.get("keep_logits_equal_gguf") else "") + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="+", default=list(MODELS))
    p.add_argument("--schemes", nargs="+", default=list(SCHEMES))
    p.add_argument("--out", type=Path, required=True, help="directory for the bundles")
    p.add_argument("--json", type=Path, default=None)
    p.add_argument("extra", nargs=argparse.REMAINDER, help="more `edgeflash export` options after --")
    args = p.parse_args(argv)
    extra = [a for a in args.extra if a != "--"]
    rows = []
    for model in args.models:
        for scheme in args.schemes:
            rows.append(run_one(model, scheme, args.out / f"{model}-{scheme}", extra))
            print(json.dumps(rows[-1]), flush=True)
            if args.json:
                args.json.write_text(json.dumps(rows, indent=1))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
