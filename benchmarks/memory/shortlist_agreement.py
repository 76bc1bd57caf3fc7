"""How often the shortlist head's top-1 agrees with the full head's, teacher-forced on held-out text.

The shortlist head computes exact logits for the N most frequent calibration tokens and -inf for
the rest, so its top-1 equals the full head's exactly when the full top-1 is among those N. This
script measures that on the held-out Shakespeare split (which calibration never saw), for several N.
It also scores the q8_0 KV cache (`kv_cache="q8_0"`), alone and with the 8192-token shortlist: how
often that run's top-1 equals the f16 cache's full-head top-1.

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
    q8 = ef.load(bundle, kv_cache="q8_0")
    ids = np.asarray(model.source.info["manifest"]["calibration"]["token_frequencies"]["ids"], dtype=np.int64)
    rank = np.full(model.spec.vocab_size, np.iinfo(np.int64).max)
    rank[ids] = np.arange(len(ids))  # a token's place in the frequency list
    tops, q8_tops, q8_shortlist_tops = [], [], []
    shortlist = np.zeros(model.spec.vocab_size, dtype=bool)
    shortlist[ids[:8192]] = True
    for window in token_windows(model.tokenizer, heldout_text(), tokens, WINDOW, "held-out"):
        model.engine.reset()
        tops.append(np.argmax(model.engine.forward(window, all_logits=True), axis=-1))
        q8.engine.reset()
        logits = q8.engine.forward(window, all_logits=True)
        q8_tops.append(np.argmax(logits, axis=-1))
        q8_shortlist_tops.append(np.argmax(np.where(shortlist, logits, -np.inf), axis=-1))
    top = np.concatenate(tops)
    return {n: float(np.mean(rank[top] < n)) for n in SIZES if n <= len(ids)} | {
        "positions": int(top.size),
        "kv_q8": float(np.mean(np.concatenate(q8_tops) == top)),
        "kv_q8_shortlist_8192": float(np.mean(np.concatenate(q8_shortlist_tops) == top))}


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
    print("| model | held-out positions | " + " | ".join(f"top-1 agreement, N={n}" for n in sizes)
          + " | q8_0 KV cache | q8_0 KV + N=8192 |")
    print("|---|---|" + "---|" * (len(sizes) + 2))
    for model, r in rows.items():
        print(f"| {model} | {r['positions']} | " + " | ".join(f"{r[n]:.1%}" if n in r else "-" for n in sizes)
              + f" | {r['kv_q8']:.1%} | {r['kv_q8_shortlist_8192']:.1%} |")


if __name__ == "__main__":
    main()
