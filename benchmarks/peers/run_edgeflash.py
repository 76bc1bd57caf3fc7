"""edgeflash on the same workloads as the peers: one workload, one JSON line.

  python benchmarks/peers/run_edgeflash.py --model gemma3-270m --prompt-tokens 500 \
      --max-new-tokens 128 --threads 2 --repeat 3                      # the GGUF llama.cpp runs
  python benchmarks/peers/run_edgeflash.py --model smollm2-135m --source bundle:PATH --activations q8
  python benchmarks/peers/run_edgeflash.py --model gemma3-270m --perplexity

--source gguf (default) runs the very file llama.cpp runs; bundle:PATH an exported bundle.
--activations q8x2 (default; agrees with the numpy reference) or q8 (ggml-style, fastest).
"""

from __future__ import annotations

import argparse
import math
import sys
import time

import numpy as np

import harness
from workloads import perplexity_windows


def parser() -> argparse.ArgumentParser:
    p = harness.build_parser("edgeflash")
    p.add_argument("--source", default="gguf", help="gguf, or bundle:PATH")
    p.add_argument("--activations", default="q8x2", choices=["q8x2", "q8", "f32"])
    p.add_argument("--speculative", default="none")
    return p


def load(w: harness.Workload, args: argparse.Namespace):
    import edgeflash as ef

    path = str(w.model.gguf_path()) if args.source == "gguf" else args.source.split(":", 1)[1]
    return ef.load(path, threads=w.threads, context_length=2048, activations=args.activations,
                   speculative=args.speculative)


def run_generate(w: harness.Workload, args: argparse.Namespace) -> dict:
    model = load(w, args)
    prompt_ids = model.encode(w.prompt.text)
    model.generate(harness.WARMUP_TEXT, max_tokens=2)
    clock = harness.TokenClock()
    repeats = []
    peak_after_load = harness.peak_rss_bytes()
    for i in range(w.repeat):
        model.engine.reset()  # no KV prefix reuse between repeats
        ids: list[int] = []
        clock.start()
        generation = model.generation(prompt_ids, w.max_new_tokens)
        for _piece in generation:
            # Pieces arrive per decoded token (or several with speculation): stamp each new token.
            while len(clock.stamps) < len(generation.tokens):
                clock.tick()
        result = generation.result()
        ids = result.tokens
        repeats.append(harness.Repeat(
            prompt_tokens=len(prompt_ids), generated_tokens=len(ids), ttft_s=clock.ttft_s, decode_s=clock.decode_s,
            token_ids=ids, text=result.text, peer_stats={k: result.stats.get(k) for k in (
                "prefill_tok_s", "decode_tok_s", "ttft_s", "spec_mean_accepted", "kv_cache_bytes", "weight_bytes")}))
        harness.log(f"edgeflash {w.model.name} repeat {i}: prefill {repeats[-1].prefill_tok_s:.1f} tok/s, "
                    f"decode {repeats[-1].decode_tok_s:.1f} tok/s")
    return harness.generation_report("edgeflash", w, repeats, {
        "prompt_ids": prompt_ids,
        "prompt_ids_match_reference": prompt_ids == w.prompt.reference_ids if w.prompt.reference_ids else None,
        "config": {"source": args.source, "activations": args.activations, "speculative": args.speculative,
                   "engine": model.engine.name, "peak_rss_after_load": peak_after_load},
    })


def run_perplexity(w: harness.Workload, args: argparse.Namespace) -> dict:
    model = load(w, args)
    nll, n = 0.0, 0
    t0 = time.perf_counter()
    for ids in perplexity_windows(w.model):
        model.engine.reset()
        logits = model.engine.forward(ids, all_logits=True)[:-1].astype(np.float64)  # [T-1, vocab]
        m = logits.max(axis=1, keepdims=True)
        lse = m[:, 0] + np.log(np.exp(logits - m).sum(axis=1))
        nll += float((lse - logits[np.arange(len(ids) - 1), ids[1:]]).sum())
        n += len(ids) - 1
    harness.log(f"edgeflash {w.model.name} perplexity {math.exp(nll / n):.3f} over {n} tokens")
    return harness.perplexity_report("edgeflash", w, nll, n, len(perplexity_windows(w.model)), {
        "seconds": round(time.perf_counter() - t0, 1), "config": {"source": args.source,
                                                                   "activations": args.activations}})


def main() -> None:
    args = parser().parse_args()
    w = harness.resolve_workload(args)
    report = run_perplexity(w, args) if w.perplexity else run_generate(w, args)
    harness.emit(report, args.out)


if __name__ == "__main__":
    sys.exit(main())
