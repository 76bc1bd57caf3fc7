"""Time `edgeflash export` end to end, per stage, wall and CPU, with the machine's load.

    python benchmarks/export/bench_export.py                       # Gemma 3 270M, q4_0 (the 2-minute target)
    python benchmarks/export/bench_export.py --model smollm2-135m --quant q8_0 q4_0 q4_lut

Each run is a real `edgeflash export` subprocess with default settings (so the time includes
interpreter start, model load, calibration, quantization, evaluation, writing and verification).
The machine is shared: the load average before and after is printed with every run, and CPU
seconds (all threads of the export process) are reported next to wall seconds.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
import time
from pathlib import Path

TARGET_S = 120.0


def run_export(model: str, quant: str, out: Path, extra: list[str]) -> dict:
    load_before = os.getloadavg()[0]
    usage_before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "export", model, "-o", str(out), "--quant",
                           quant, "--quiet", "--force", "--json", *extra], capture_output=True, text=True, check=False)
    wall = time.perf_counter() - t0
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        raise SystemExit(f"export failed ({proc.returncode}): {proc.stderr[-2000:]}")
    summary = json.loads(proc.stdout.strip().splitlines()[-1])
    report = summary["report"]
    return {"model": model, "quant": quant, "wall_s": round(wall, 1),
            "cpu_s": round(usage.ru_utime + usage.ru_stime - usage_before.ru_utime - usage_before.ru_stime, 1),
            "load_before": round(load_before, 2), "load_after": round(os.getloadavg()[0], 2),
            "peak_rss_mib": round(usage.ru_maxrss / 1024),  # the largest child so far: the export
            "stages_wall_s": report.get("timings_s"), "stages_cpu_s": report.get("cpu_s"),
            "bundle_mib": round(summary["weights_bytes"] / 2**20, 1),
            "perplexity": report.get("perplexity"), "baseline": report.get("baseline"),
            "sparsity": report.get("sparsity"), "size_by_role": report.get("size_by_role")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--model", default="gemma3-270m")
    p.add_argument("--quant", nargs="+", default=["q4_0"])
    p.add_argument("--out", type=Path, default=None, help="where bundles go (default: a temporary directory)")
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    p.add_argument("extra", nargs=argparse.REMAINDER, help="more `edgeflash export` options after --")
    args = p.parse_args(argv)
    extra = [a for a in args.extra if a != "--"]
    results = []
    with tempfile.TemporaryDirectory() as tmp:
        root = args.out or Path(tmp)
        for quant in args.quant:
            r = run_export(args.model, quant, root / f"{args.model}-{quant.replace(':', '_')}", extra)
            results.append(r)
            ppl = r["perplexity"] or {}
            base = r["baseline"] or {}
            print(f"{r['model']:<14} {r['quant']:<12} wall {r['wall_s']:>6.1f} s ({r['wall_s'] / TARGET_S:.2f} of the "
                  f"{TARGET_S:.0f} s target), cpu {r['cpu_s']:>6.1f} s, peak RSS {r['peak_rss_mib']} MiB, "
                  f"load {r['load_before']}->{r['load_after']}, "
                  f"bundle {r['bundle_mib']} MiB, ppl {ppl.get('source')} -> {ppl.get('exported')}"
                  + (f" (round-to-nearest {base.get('perplexity')})" if base else ""), flush=True)
            print("    stages wall/cpu s: " + ", ".join(
                f"{k} {v}/{(r['stages_cpu_s'] or {}).get(k, '-')}" for k, v in (r["stages_wall_s"] or {}).items()))
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
