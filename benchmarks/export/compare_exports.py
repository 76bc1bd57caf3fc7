"""Export the same models with two edgeflash trees side by side: wall time, peak RSS, bundle size, and
perplexity of both bundles measured the same way.

    python benchmarks/export/compare_exports.py --old /path/to/old-tree --models gemma3-270m smollm2-135m

Each export is `/usr/bin/time -v <tree>/.venv/bin/edgeflash export MODEL -o OUT --quant Q` with the
tree's default settings (peak RSS and wall time from time -v). Rounds alternate old and new. Then both
bundles are evaluated by this tree's evaluator (the native engine, teacher forcing) on the same
held-out windows of the model's own text (code for code models), next to the source model, so the
perplexities compare the exports and not two evaluators. Results go to --out as JSON and, one record
per value, to benchmarks/results/export-scale.jsonl (config "old" / "new").
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import subprocess
import sys
import time
from pathlib import Path


def timed_export(tree: Path, model: str, out: Path, quant: str, extra: list[str]) -> dict:
    cmd = ["/usr/bin/time", "-v", str(tree / ".venv/bin/edgeflash"), "export", model, "-o", str(out), "--quant", quant,
           "--quiet", "--force", *extra]
    load = os.getloadavg()[0]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{tree}: export of {model} failed: {proc.stderr[-3000:]}")
    wall = re.search(r"Elapsed \(wall clock\) time \(h:mm:ss or m:ss\): (\S+)", proc.stderr).group(1)
    parts = [float(x) for x in wall.split(":")]
    seconds = sum(p * 60 ** i for i, p in enumerate(reversed(parts)))
    rss_kb = int(re.search(r"Maximum resident set size \(kbytes\): (\d+)", proc.stderr).group(1))
    cpu = sum(float(re.search(rf"{k} time \(seconds\): (\S+)", proc.stderr).group(1)) for k in ("User", "System"))
    size = sum(f.stat().st_size for f in out.iterdir())
    return {"wall_s": round(seconds, 1), "cpu_s": round(cpu, 1), "peak_rss_mib": round(rss_kb / 1024, 1),
            "bundle_bytes": size, "load_before": round(load, 2)}


def evaluate(model: str, bundles: dict[str, Path], tokens: int) -> dict:
    from edgeflash.base.models import resolve_model
    from edgeflash.export.evaluate import perplexity
    from edgeflash.export.layerwise import release_tensors
    from edgeflash.export.pipeline import choose_texts
    from edgeflash.export.text import token_windows
    from edgeflash.runtime.bundle import load_bundle
    from edgeflash.runtime.sources import open_model

    source = open_model(resolve_model(model))
    texts = choose_texts(source, None, full_report=True)
    out = {}
    for description, text in texts.heldout:
        windows = token_windows(source.tokenizer, text, tokens, 512, description)
        row = {"source": round(perplexity(source, windows).perplexity, 4)}
        release_tensors(source, list(source.tensors))
        for name, path in bundles.items():
            row[name] = round(perplexity(load_bundle(path, verify=False), windows).perplexity, 4)
        out[description] = row
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--old", type=Path, required=True, help="the other tree (with its own .venv)")
    p.add_argument("--new", type=Path, default=Path(__file__).resolve().parents[2])
    p.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    p.add_argument("--quant", default="q4_0")
    p.add_argument("--rounds", type=int, default=1)
    p.add_argument("--eval-tokens", type=int, default=1024)
    p.add_argument("--work", type=Path, default=Path("bench-out/compare"))
    p.add_argument("--out", type=Path, default=Path("bench-out/compare_exports.json"))
    p.add_argument("--old-args", default="", help="extra export options for the old tree")
    p.add_argument("--new-args", default="", help="extra export options for the new tree")
    args = p.parse_args()
    results = {"machine": platform.node(), "time": time.time(), "quant": args.quant, "old": str(args.old),
               "new": str(args.new), "models": {}}
    for model in args.models:
        runs: dict[str, list[dict]] = {"old": [], "new": []}
        bundles = {}
        for _ in range(args.rounds):
            for name in ("old", "new"):
                out = args.work / f"{Path(model).stem}-{name}"
                extra = (args.old_args if name == "old" else args.new_args).split()
                runs[name].append(timed_export(getattr(args, name), model, out, args.quant, extra))
                bundles[name] = out
                r = runs[name][-1]
                print(f"{model} {name}: {r['wall_s']} s wall, {r['cpu_s']} s CPU, peak RSS {r['peak_rss_mib']} MiB, "
                      f"bundle {r['bundle_bytes'] / 2**20:.1f} MiB (load {r['load_before']})", flush=True)
        ppl = evaluate(model, bundles, args.eval_tokens)
        for text, row in ppl.items():
            print(f"  perplexity on {text}: source {row['source']}, old {row['old']}, new {row['new']}", flush=True)
        best = {k: min(v, key=lambda r: r["wall_s"]) for k, v in runs.items()}
        results["models"][model] = {"runs": runs, "perplexity": ppl,
                                    "wall_ratio_new_over_old": round(best["new"]["wall_s"] / best["old"]["wall_s"], 3),
                                    "rss_ratio_new_over_old": round(best["new"]["peak_rss_mib"] /
                                                                    best["old"]["peak_rss_mib"], 3)}
        print(f"  new/old: wall {results['models'][model]['wall_ratio_new_over_old']}x, peak RSS "
              f"{results['models'][model]['rss_ratio_new_over_old']}x", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=1))
    record(results, " ".join(sys.argv))


def record(results: dict, command: str) -> None:
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    from records import new_run_id, record_values

    run = new_run_id()
    for model, m in results["models"].items():
        for name in ("old", "new"):
            best = min(m["runs"][name], key=lambda r: r["wall_s"])
            values = {k: best[k] for k in ("wall_s", "cpu_s", "bundle_bytes", "load_before")}
            values["peak_rss_bytes"] = int(best["peak_rss_mib"] * 2**20)
            for text, row in m["perplexity"].items():
                values[f"perplexity:{text}"] = row[name]
                values[f"perplexity:{text}:source"] = row["source"]
            record_values(run, Path(model).stem, f"{name} ({results[name]}), {results['quant']}, defaults", values,
                          command)


if __name__ == "__main__":
    sys.exit(main())
