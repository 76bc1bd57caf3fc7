"""How often the shortlist head's top-1 agrees with the full head's, teacher-forced on held-out text.

The shortlist head computes exact logits for the N most frequent calibration tokens and -inf for
the rest, so its top-1 equals the full head's exactly when the full top-1 is among those N. This
script measures that on the held-out Shakespeare split (which calibration never saw), for several N.

  python benchmarks/memory/shortlist_agreement.py                   # both models, N = 2048..32768
  python benchmarks/memory/shortlist_agreement.py --tokens 4096
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from compare import MODELS, OUT, ensure_bundle

SIZES = (2048, 4096, 8192, 16384, 32768)
WINDOW = 128  # positions per forward pass: Gemma's logits are 1 MiB a position


def agreement(bundle: Path, tokens: int) -> dict[int, float]:
    import edgeflash as ef
    from edgeflash.export.corpus import heldout_text
    from edgeflash.export.text import token_windows

    model = ef.load(bundle)
    ids = np.asarray(model.source.info["manifest"]["calibration"]["token_frequencies"]["ids"], dtype=np.int64)
    rank = np.full(model.spec.vocab_size, np.iinfo(np.int64).max)
    rank[ids] = np.arange(len(ids))  # a token's place in the frequency list
    tops = []
    for window in token_windows(model.tokenizer, heldout_text(), tokens, WINDOW, "held-out"):
        model.engine.reset()
        logits = model.engine.forward(window, all_logits=True)
        tops.append(np.argmax(logits, axis=-1))
    top = np.concatenate(tops)
    return {n: float(np.mean(rank[top] < n)) for n in SIZES if n <= len(ids)} | {"positions": int(top.size)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    parser.add_argument("--tokens", type=int, default=4096, help="held-out tokens scored per model")
    args = parser.parse_args()
    OUT.mkdir(parents=True, exist_ok=True)
    rows = {}
    for model in args.models:
        bundle = ensure_bundle(model)
        rows[model] = agreement(bundle, args.tokens)
        print(f"{model}: {rows[model]}", file=sys.stderr)
    (OUT / "shortlist_agreement.json").write_text(json.dumps(rows, indent=1))
    sizes = [n for n in SIZES if any(n in r for r in rows.values())]
    print("| model | held-out positions | " + " | ".join(f"top-1 agreement, N={n}" for n in sizes) + " |")
    print("|---|---|" + "---|" * len(sizes))
    for model, r in rows.items():
        print(f"| {model} | {r['positions']} | " + " | ".join(f"{r[n]:.1%}" if n in r else "-" for n in sizes) + " |")


if __name__ == "__main__":
    main()
