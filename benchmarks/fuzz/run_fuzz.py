"""Fuzz the loaders at scale: thousands of seeded mutations of real models, each run as
`edgeflash generate` (plain and budgeted) and `edgeflash inspect` in its own process; with
--bundles, mutations of exported bundles too (plain, budgeted and sparse generate, inspect).

    python benchmarks/fuzz/run_fuzz.py                                   # 1000 cases on each model
    python benchmarks/fuzz/run_fuzz.py --models tiny smollm2-135m --cases 200 --workers 2
    python benchmarks/fuzz/run_fuzz.py --models smollm2-135m --first-case 137 --cases 1   # one case again
    python benchmarks/fuzz/run_fuzz.py --edgeflash /other/venv/bin/edgeflash   # another build, same cases
    python benchmarks/fuzz/run_fuzz.py --models --bundles out/smollm2-q4_0 --cases 300  # bundles only

Prints the outcome classes per model and run, and each failure with its case number and seed;
writes every outcome to bench-out/fuzz/ and the class counts to benchmarks/results/fuzz-gguf.jsonl
(fuzz-bundle.jsonl for bundles).
The seeds depend only on --seed and the case number, so two builds can be compared case by case.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "tests" / "fuzz"))
sys.path.insert(0, str(REPO / "benchmarks" / "results"))

from fuzz_harness import (  # noqa: E402
    BUNDLE_RUN_KINDS,
    FAILURE_CLASSES,
    BundleTarget,
    Harness,
    Target,
    scratch_dir,
    summarize,
)
from record import append_result, new_run_id  # noqa: E402
from fuzz_tiny_gguf import build_tiny_gguf  # noqa: E402

BUDGETS = {"tiny": "30MB", "smollm2-135m": "60MB", "gemma3-270m": "160MB", "qwen2.5-coder-0.5b": "200MB"}


def case_seed(base: int, case: int) -> int:
    return base * 1_000_003 + case


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--models", nargs="*", default=["smollm2-135m", "gemma3-270m"], choices=sorted(BUDGETS))
    p.add_argument("--bundles", nargs="*", default=[], metavar="DIR[:BUDGET]",
                   help="exported bundles to mutate too (budget: after a colon, else --bundle-budget)")
    p.add_argument("--bundle-budget", default="60MB")
    p.add_argument("--cases", type=int, default=1000, help="cases per model (default: %(default)s)")
    p.add_argument("--first-case", type=int, default=0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--workers", type=int, default=2, help="cases run at once (default: %(default)s)")
    p.add_argument("--rotate", action="store_true",
                   help="run each case once, taking the run kinds in turn (more cases in the same time)")
    p.add_argument("--timeout", type=float, default=120.0, help="seconds before a run counts as a hang")
    p.add_argument("--edgeflash", default=str(Path(sys.executable).parent / "edgeflash"))
    p.add_argument("--out", type=Path, default=REPO / "bench-out" / "fuzz")
    p.add_argument("--label", default="", help="a note stored with the results (e.g. the build compared)")
    p.add_argument("--no-record", action="store_true", help="do not append to benchmarks/results")
    args = p.parse_args()

    from edgeflash.base.models import resolve_model

    work = scratch_dir()
    args.out.mkdir(parents=True, exist_ok=True)
    run_id = new_run_id()
    log_path = args.out / f"gguf-{run_id.replace(':', '')}.jsonl"
    outcomes = []
    try:
        harness = Harness(args.edgeflash, work, timeout=args.timeout, rotate=args.rotate)
        with open(log_path, "w") as log:

            def show(outcome):
                log.write(json.dumps(outcome.to_dict()) + "\n")
                log.flush()
                if outcome.failed:
                    print(f"FAIL {outcome.target} case {outcome.case} (seed {outcome.seed}) {outcome.run}: "
                          f"{outcome.klass} [{outcome.op}: {outcome.detail}] {outcome.stderr[-300:]}", flush=True)

            for name in args.models:
                path = (build_tiny_gguf(resolve_model("smollm2-135m"), work / "tiny.gguf") if name == "tiny"
                        else resolve_model(name))
                target = Target(name, path, BUDGETS[name])
                seeds = [(c, case_seed(args.seed, c)) for c in range(args.first_case, args.first_case + args.cases)]
                start = time.monotonic()
                outcomes += harness.run(target, seeds, workers=args.workers, on_outcome=show)
                print(f"{name}: {args.cases} cases in {time.monotonic() - start:.0f} s", flush=True)
            bundle_harness = Harness(args.edgeflash, work, timeout=args.timeout, runs=BUNDLE_RUN_KINDS,
                                     rotate=args.rotate)
            for spec in args.bundles:
                where, _, budget = spec.partition(":")
                path = Path(where)
                target = BundleTarget(f"bundle:{path.name}", path.resolve(), budget or args.bundle_budget)
                seeds = [(c, case_seed(args.seed, c)) for c in range(args.first_case, args.first_case + args.cases)]
                start = time.monotonic()
                outcomes += bundle_harness.run(target, seeds, workers=args.workers, on_outcome=show)
                print(f"{target.name}: {args.cases} cases in {time.monotonic() - start:.0f} s", flush=True)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    table = summarize(outcomes)
    classes = sorted({k for counts in table.values() for k in counts}, key=lambda k: (k in FAILURE_CLASSES, k))
    width = max(len(k) for k in table) + 2
    print("\n" + "".ljust(width) + "".join(c.rjust(17) for c in classes))
    for key, counts in table.items():
        print(key.ljust(width) + "".join(str(counts.get(c, 0)).rjust(17) for c in classes))
    failures = [o for o in outcomes if o.failed]
    print(f"\n{len(outcomes)} runs of {len({(o.target, o.case) for o in outcomes})} cases; {len(failures)} failed runs")
    print(f"every outcome: {log_path}")
    if not args.no_record:
        for key, counts in table.items():
            model, run = key.rsplit("/", 1)
            kind = "fuzz-bundle" if model.startswith("bundle:") else "fuzz-gguf"
            for klass, n in counts.items():
                append_result(kind, {"run": run_id, "model": model, "config": run, "metric": klass, "value": n,
                                            "unit": "runs", "rounds": args.cases, "command": " ".join(sys.argv),
                                            "notes": f"seed {args.seed}, cases {args.first_case}.."
                                                     f"{args.first_case + args.cases - 1}; {args.label}".strip("; ")})
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
