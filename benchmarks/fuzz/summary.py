"""Sum the outcome counts a fuzz campaign recorded in benchmarks/results/fuzz-{gguf,bundle}.jsonl.

    python benchmarks/fuzz/summary.py                          # records labelled "acceptance campaign"
    python benchmarks/fuzz/summary.py --label "" --since 2026-11-25T22:00:00Z

Prints, per file, model and run kind, the runs in each outcome class, the cases (one run per case
with --rotate) and the failures (every class other than clean_error and ran).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter, defaultdict
from pathlib import Path

RESULTS = Path(__file__).resolve().parents[1] / "results"
OK = ("clean_error", "ran")


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--label", default="acceptance campaign", help="records whose notes contain this")
    p.add_argument("--since", default="", help="records of runs at or after this run id")
    args = p.parse_args()
    failed = 0
    for kind in ("fuzz-gguf", "fuzz-bundle"):
        path = RESULTS / f"{kind}.jsonl"
        table: dict[tuple[str, str], Counter] = defaultdict(Counter)
        runs = set()
        if path.exists():
            for line in path.read_text().splitlines():
                r = json.loads(line)
                if args.label in (r.get("notes") or "") and r["run"] >= args.since:
                    table[(r["model"], r["config"])][r["metric"]] += r["value"]
                    runs.add(r["run"])
        classes = sorted({c for counts in table.values() for c in counts}, key=lambda c: (c not in OK, c))
        print(f"\n{kind}: {len(runs)} invocations")
        print("model/run".ljust(48) + "".join(c.rjust(14) for c in classes) + "total".rjust(8))
        totals: Counter = Counter()
        for (model, run), counts in sorted(table.items()):
            totals.update(counts)
            print(f"{model}/{run}".ljust(48) + "".join(str(counts.get(c, 0)).rjust(14) for c in classes)
                  + str(sum(counts.values())).rjust(8))
        print("all".ljust(48) + "".join(str(totals.get(c, 0)).rjust(14) for c in classes)
              + str(sum(totals.values())).rjust(8))
        failed += sum(n for c, n in totals.items() if c not in OK)
    print(f"\nfailed runs: {failed}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
