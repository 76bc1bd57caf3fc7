"""Every platform target on both models: file size, export time, parity with the reference
runtime on the same weights, and decode speed where the target runs here; then SmolLM2 next to
ExecuTorch's own LLM export (`export_llm`, 8da4w) on size and speed.

  .venv/bin/python benchmarks/backends/bench_backends.py                 # everything, ~40 min on 2 cores
  .venv/bin/python benchmarks/backends/bench_backends.py --models smollm2-135m --targets onnx

Exports go to bench-out/backends/<model>-<target>-c<chunks>/, results to
bench-out/backends/results.json; a markdown table is printed at the end (docs/backends.md).
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
OUT = REPO / "bench-out" / "backends"
MODELS = ("gemma3-270m", "smollm2-135m")
TARGETS = ("executorch", "onnx", "coreml")


def run_one(alias: str, target: str, args) -> dict:
    from edgeflash.export.targets import export_target
    from edgeflash.export.targets.chunks import MANIFEST_FILE, read_manifest
    from edgeflash.export.targets.parity import compare, prompts_from_heldout, reference_model, summarize
    from edgeflash.export.targets.runner import TargetRunner

    exact = target == "executorch" and args.et_activations == "f32"
    out = OUT / f"{alias}-{target}{'-f32' if exact else ''}-c{args.chunks}"
    options = {"et_activations": args.et_activations} if target == "executorch" and args.et_activations else {}
    if args.reuse and (out / MANIFEST_FILE).exists():
        manifest = read_manifest(out)  # measured when it was made
        timings = {**manifest["timings_s"], "total": round(sum(manifest["timings_s"].values()), 2)}
    else:
        result = export_target(alias, out, target, quant=args.quant, chunks=args.chunks, cache_len=args.cache_len,
                               prefill_tokens=args.prefill_tokens, calibration_tokens=0, overwrite=True,
                               threads=args.threads, **options)
        manifest, timings = result.manifest, result.timings
    row = {"model": alias, "target": f"{target} f32 activations" if exact else target, "quant": args.quant, "chunks": args.chunks, "cache_len": args.cache_len,
           "bytes": manifest["total_bytes"], "export_s": timings["total"]}
    if target == "coreml" and platform.system() != "Darwin":
        return row  # Core ML predicts on macOS only; the package is built and validated here
    runner = TargetRunner(out, threads=args.threads)
    prompts = prompts_from_heldout(runner.tokenizer, args.prompts, args.prompt_tokens)
    # f32 activations compute what the plain float32 reference does
    reference, ops = reference_model(alias, target, args.quant, target_arithmetic=not exact)
    summary = summarize(compare(runner, reference, prompts, args.new_tokens, ops=ops))
    row["parity"] = {k: v for k, v in summary.items() if k != "per_prompt"}
    if ops is not None:  # also against plain float32 arithmetic: what the target's rounding costs
        summary = summarize(compare(runner, reference, prompts, args.new_tokens))
        row["parity_float"] = {k: v for k, v in summary.items() if k != "per_prompt"}
    speed = runner.generate(prompts[0], args.speed_tokens, stop_ids=set())
    row["prefill_tok_s"], row["decode_tok_s"] = round(speed.prefill_tok_s, 1), round(speed.decode_tok_s, 1)
    return row


def peer_executorch(args) -> dict | None:
    """ExecuTorch's own export of SmolLM2, measured by the peer harness in its own venv."""
    pte = REPO / "bench-out/executorch/smollm2-135m/smollm2_135m_8da4w.pte"
    python = REPO / ".venv-bench/bin/python"
    if not pte.exists() or not python.exists():
        print(f"skipping the export_llm comparison: {pte} or {python} missing (benchmarks/peers/README.md)")
        return None
    proc = subprocess.run([str(python), "benchmarks/peers/run_executorch.py", "--model", "smollm2-135m",
                           "--prompt-tokens", str(args.prompt_tokens), "--max-new-tokens", str(args.speed_tokens),
                           "--threads", str(args.threads), "--repeat", "1"],
                          cwd=REPO, capture_output=True, text=True, check=True,
                          env={"PYTHONPATH": str(REPO / "benchmarks/peers"), "PATH": "/usr/bin:/bin"})
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {"model": "smollm2-135m", "target": "executorch export_llm (8da4w)", "bytes": pte.stat().st_size,
            "decode_tok_s": data.get("decode_tok_s"), "prefill_tok_s": data.get("prefill_tok_s")}


def table(rows: list[dict]) -> str:
    header = ("| model | target | chunks | size MiB | export s | logit max abs err | prefill err | "
              "top-1 agree (min) | same 32-token greedy | decode tok/s |")
    lines = [header, "|---|---|---|---|---|---|---|---|---|---|"]
    expanded = []
    for r in rows:  # a target with its own rounding also gets a row against plain float32
        expanded.append(r)
        if r.get("parity_float"):
            expanded.append({**r, "target": f"{r['target']} vs float32", "parity": r["parity_float"],
                             "decode_tok_s": None})
    for r in expanded:
        p = r.get("parity")
        parity = (f"{p['max_abs_error']} | {p['prefill_max_abs_error']} | {p['min_top1_agreement']} | "
                  f"{p['same_continuation']}/{p['prompts']}") if p else "— | — | — | —"
        lines.append(f"| {r['model']} | {r['target']} | {r.get('chunks', '—')} | {r['bytes'] / 2**20:.1f} | "
                     f"{r.get('export_s', '—')} | {parity} | {r.get('decode_tok_s') or '—'} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    ap.add_argument("--targets", nargs="+", default=list(TARGETS), choices=TARGETS)
    ap.add_argument("--quant", default="q4_0-rtn")
    ap.add_argument("--chunks", type=int, default=1)
    ap.add_argument("--cache-len", type=int, default=256)
    ap.add_argument("--prefill-tokens", type=int, default=32)
    ap.add_argument("--prompts", type=int, default=4)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--new-tokens", type=int, default=32)
    ap.add_argument("--speed-tokens", type=int, default=128)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--et-activations", choices=("int8", "f32"), default=None,
                    help="executorch: the linear layers' activations (f32 = weight-only, exact; default int8)")
    ap.add_argument("--no-peer", action="store_true", help="skip the export_llm comparison")
    ap.add_argument("--reuse", action="store_true", help="measure existing exports instead of exporting again")
    ap.add_argument("--results", default="results.json", help="results file in bench-out/backends/")
    ap.add_argument("--table", action="store_true", help="only print the table of every results*.json")
    args = ap.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    if args.table:
        rows = [r for f in sorted(OUT.glob("results*.json")) for r in json.loads(f.read_text())]
        print(table(sorted(rows, key=lambda r: (r["model"], r["target"]))))
        return
    results_file = OUT / args.results
    rows = json.loads(results_file.read_text()) if results_file.exists() else []
    for alias in args.models:
        for target in args.targets:
            t0 = time.time()
            row = run_one(alias, target, args)
            row["wall_s"] = round(time.time() - t0, 1)
            print(json.dumps(row), flush=True)
            rows = [r for r in rows if (r["model"], r["target"], r.get("chunks")) != (alias, row["target"], args.chunks)]
            rows.append(row)
            results_file.write_text(json.dumps(rows, indent=1))
    if not args.no_peer and "smollm2-135m" in args.models:
        peer = peer_executorch(args)
        if peer:
            print(json.dumps(peer), flush=True)
            rows = [r for r in rows if r["target"] != peer["target"]] + [peer]
            results_file.write_text(json.dumps(rows, indent=1))
    print(table(rows))


if __name__ == "__main__":
    sys.exit(main())
