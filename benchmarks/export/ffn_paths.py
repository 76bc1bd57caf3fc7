"""The dense FFN read from the one-copy neuron arena against dense matrices, on the native engine.

    python benchmarks/export/ffn_paths.py --arena OUT_ARENA --dense OUT_DENSE [--rounds 3]

Both bundles come from the same model and settings (`edgeflash export`, and the same with
--no-neuron-arena). Rounds alternate the two; prefill is 256 tokens of held-out text, decode 64
greedy tokens. Prints tok/s and the arena/dense ratios, and writes them as JSON.
"""

from __future__ import annotations

import argparse
import json
import platform
import time
from pathlib import Path

import numpy as np


def measure(path: Path, prompt_ids: list[int], decode: int) -> dict[str, float]:
    import edgeflash as ef

    m = ef.load(path)
    engine = m.engine
    engine.reset()
    t = time.perf_counter()
    logits = engine.forward(prompt_ids)
    prefill = len(prompt_ids) / (time.perf_counter() - t)
    tok = int(np.argmax(logits[-1]))
    t = time.perf_counter()
    for _ in range(decode):
        tok = int(np.argmax(engine.forward([tok])[-1]))
    return {"prefill_tok_s": prefill, "decode_tok_s": decode / (time.perf_counter() - t)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arena", type=Path, required=True)
    p.add_argument("--dense", type=Path, required=True)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--out", type=Path, default=Path("bench-out/ffn_paths.json"))
    args = p.parse_args()
    from edgeflash.export.corpus import heldout_text
    from edgeflash.runtime.bundle import load_bundle

    ids = load_bundle(args.arena, verify=False).tokenizer.encode(heldout_text()[20_000:40_000])[:256]
    runs: dict[str, list[dict[str, float]]] = {"arena": [], "dense": []}
    for _ in range(args.rounds):
        for name in ("arena", "dense"):
            runs[name].append(measure(getattr(args, name), ids, 64))
    best = {k: {m: max(r[m] for r in v) for m in v[0]} for k, v in runs.items()}
    ratios = {m: round(best["arena"][m] / best["dense"][m], 3) for m in best["arena"]}
    for name, b in best.items():
        print(f"{name:6s} prefill {b['prefill_tok_s']:8.1f} tok/s  decode {b['decode_tok_s']:8.1f} tok/s")
    print(f"arena/dense: prefill {ratios['prefill_tok_s']:.3f}x, decode {ratios['decode_tok_s']:.3f}x")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"arena": str(args.arena), "dense": str(args.dense), "runs": runs, "best": best,
                                    "ratios": ratios, "machine": platform.node(), "time": time.time()}, indent=1))


if __name__ == "__main__":
    main()
