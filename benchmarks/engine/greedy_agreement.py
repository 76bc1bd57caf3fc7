"""Greedy continuations of the native engine against the numpy reference runtime, on the same
weights: how many prompts give identical tokens for the first N, and where the others part.

Prompts: held-out Shakespeare passages (never seen by calibration), plus, per model, one prompt
longer than Gemma 3's 512-token sliding window.

  python benchmarks/engine/greedy_agreement.py                 # both models, 8 prompts, 64 tokens
  python benchmarks/engine/greedy_agreement.py --models smollm2-135m --prompts 4 --tokens 32
"""

from __future__ import annotations

import argparse


def first_difference(a: list[int], b: list[int]) -> int | None:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", nargs="+", default=["gemma3-270m", "smollm2-135m"])
    parser.add_argument("--prompts", type=int, default=8, help="short held-out prompts (plus one long one)")
    parser.add_argument("--tokens", type=int, default=64)
    args = parser.parse_args()

    import edgeflash as ef
    from edgeflash.export.corpus import heldout_windows

    texts = heldout_windows(args.prompts, chars_per_window=400, offset_chars=30_000)
    long_text = heldout_windows(1, chars_per_window=3000, offset_chars=90_000)[0]
    print("| model | prompts | identical for all tokens | first differences at (token index) |")
    print("|---|---|---|---|")
    for alias in args.models:
        native = ef.load(alias, context_length=2048)
        reference = ef.load(alias, engine="reference", context_length=2048)
        prompts = [native.encode(t) for t in texts] + [native.encode(long_text)]
        same, parts = 0, []
        for ids in prompts:
            a = native.generate(ids, max_tokens=args.tokens).tokens
            b = reference.generate(ids, max_tokens=args.tokens).tokens
            d = first_difference(a, b)
            same += d is None
            if d is not None:
                parts.append(f"{d} (prompt of {len(ids)} tokens)")
        print(f"| {alias} | {len(prompts)} (longest {max(map(len, prompts))} tokens) | {same}/{len(prompts)} | "
              f"{', '.join(parts) or '-'} |", flush=True)


if __name__ == "__main__":
    main()
