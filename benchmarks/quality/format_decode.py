"""Decode speed of one model exported in different weight formats, side by side in one run.

    python benchmarks/quality/format_decode.py --model qwen2.5-coder-0.5b \
        /tmp/vs/qwen2.5-coder-0.5b/edgeflash-q4_lut /tmp/vs/qwen2.5-coder-0.5b/edgeflash-q4_0

The bundles (e.g. the ones `vs_llamacpp.py` writes) are loaded one at a time and measured in
alternating rounds (A, B, A, B, ...), so a change in the machine's load hits every format alike.
Each round: the same held-out prompt, prefill, then `--tokens` greedy tokens; the median decode
tok/s per bundle and its ratio to the last bundle given (the reference) are printed and recorded
in benchmarks/results/format-decode.jsonl. Time it under the shared lock on a shared machine.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "results"))


def bundle_format(path: Path) -> str:
    """The scheme a bundle was exported with, from its manifest."""
    manifest = json.loads((path / "manifest.json").read_text())
    quant = manifest.get("quant") or {}
    return str(quant.get("scheme") or path.name)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("bundles", nargs="+", type=Path, help="bundles to compare; the last one is the reference")
    ap.add_argument("--model", required=True, help="model name for the records")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--tokens", type=int, default=64, help="decoded tokens per round")
    ap.add_argument("--prompt-tokens", type=int, default=64)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--activations", default="q8", choices=("q8x2", "q8", "f32"))
    ap.add_argument("--no-save", action="store_true")
    args = ap.parse_args()
    for path in args.bundles:
        if not (path / "manifest.json").is_file():
            print(f"{path}: not a bundle (no manifest.json)", file=sys.stderr)
            return 2

    import edgeflash as ef
    from edgeflash.export.corpus import heldout_windows
    from record import append_result, new_run_id

    text = heldout_windows(1, chars_per_window=8 * args.prompt_tokens, offset_chars=50_000)[0]
    decode: dict[Path, list[float]] = {p: [] for p in args.bundles}
    loads: list[float] = []
    for _ in range(args.rounds):
        for path in args.bundles:
            m = ef.load(path, threads=args.threads, activations=args.activations, context_length=1024)
            ids = m.encode(text)[:args.prompt_tokens]
            m.generate("Hello", max_tokens=2)  # warm-up: first touches of the weights
            m.engine.reset()
            decode[path].append(m.generate(ids, max_tokens=args.tokens).stats["decode_tok_s"])
            loads.append(os.getloadavg()[0])
            del m
    reference = statistics.median(decode[args.bundles[-1]])
    formats = {path: bundle_format(path) for path in args.bundles}
    run = new_run_id()
    command = "python benchmarks/quality/format_decode.py " + " ".join(sys.argv[1:])
    print(f"{'bundle':<50} {'format':<8} {'decode tok/s (median)':>22} {'runs':>24} {'ratio':>6}")
    for path in args.bundles:
        median = statistics.median(decode[path])
        fmt = formats[path]
        runs = " ".join(f"{v:.1f}" for v in decode[path])
        print(f"{path!s:<50} {fmt:<8} {median:>22.1f} {runs:>24} {median / reference:>6.3f}")
        if not args.no_save:
            common = {"run": run, "model": args.model, "config": f"{fmt}, {args.activations} activations, "
                      f"{args.threads} threads", "rounds": args.rounds, "command": command,
                      "notes": f"load average {min(loads):.1f}-{max(loads):.1f}; runs {runs}"}
            append_result("format-decode", {**common, "metric": "decode_tok_s", "value": round(median, 2),
                                            "low": round(min(decode[path]), 2), "high": round(max(decode[path]), 2),
                                            "unit": "tok/s"})
            append_result("format-decode", {**common, "metric": "decode_ratio_to_reference",
                                            "value": round(median / reference, 3), "unit": "x",
                                            "notes": f"reference {formats[args.bundles[-1]]}"})
    return 0


if __name__ == "__main__":
    sys.exit(main())
