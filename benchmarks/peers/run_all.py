"""Every peer on every model, each workload in its own process; a markdown table at the end.

  python benchmarks/peers/run_all.py                       # generation, 3 repeats, 2 threads
  python benchmarks/peers/run_all.py --perplexity
  python benchmarks/peers/run_all.py --models smollm2-135m --peers llamacpp executorch

JSON per run goes to bench-out/results/<peer>-<model>[-ppl].json. The greedy tokens of each peer
are compared with transformers' (fp32, the numerical reference): "same prefix" counts how many
leading generated tokens are identical.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

from models import BENCH_OUT, MODELS

HERE = Path(__file__).resolve().parent
PEERS = {"llamacpp": "run_llamacpp.py", "executorch": "run_executorch.py", "transformers": "run_transformers.py"}
# Prompt length per model, as in the measurements these benchmarks reproduce.
DEFAULT_PROMPT_TOKENS = {"gemma3-270m": 500, "smollm2-135m": 400}


def run_one(peer: str, model: str, args: argparse.Namespace) -> dict | None:
    out = BENCH_OUT / "results" / f"{peer}-{model}{'-ppl' if args.perplexity else ''}.json"
    cmd = [sys.executable, str(HERE / PEERS[peer]), "--model", model, "--threads", str(args.threads),
           "--out", str(out)]
    if args.perplexity:
        cmd.append("--perplexity")
    else:
        cmd += ["--prompt-tokens", str(args.prompt_tokens or DEFAULT_PROMPT_TOKENS[model]),
                "--max-new-tokens", str(args.max_new_tokens), "--repeat", str(args.repeat)]
    print("$ " + " ".join(cmd), file=sys.stderr, flush=True)
    done = subprocess.run(cmd, stdout=subprocess.DEVNULL)
    if done.returncode != 0:
        print(f"{peer} on {model} failed (exit {done.returncode})", file=sys.stderr)
        return None
    return json.loads(out.read_text())


def same_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    for x, y in zip(a, b):
        if x != y:
            break
        n += 1
    return n


def generation_table(results: dict[tuple[str, str], dict]) -> str:
    rows = ["| model | peer | prompt tok | prefill tok/s | decode tok/s | TTFT s | peak RSS MB | "
            "generated | same prefix as transformers |", "|" + "---|" * 9]
    for (model, peer), r in results.items():
        ref = results.get((model, "transformers"))
        agree = f"{same_prefix(r['token_ids'], ref['token_ids'])}/{len(ref['token_ids'])}" if ref else "-"
        rows.append(f"| {model} | {peer} | {r['prompt_tokens']} | {r['prefill_tok_s']:.1f} | "
                    f"{r['decode_tok_s']:.1f} | {r['ttft_s']:.3f} | {r['peak_rss_bytes'] / 2**20:.0f} | "
                    f"{r['generated_tokens']} | {agree} |")
    return "\n".join(rows)


def perplexity_table(results: dict[tuple[str, str], dict]) -> str:
    rows = ["| model | peer | perplexity | tokens scored |", "|---|---|---|---|"]
    for (model, peer), r in results.items():
        rows.append(f"| {model} | {peer} | {r['perplexity']:.3f} | {r['predicted_tokens']} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=list(MODELS))
    p.add_argument("--peers", nargs="+", default=list(PEERS), choices=list(PEERS))
    p.add_argument("--prompt-tokens", type=int)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--perplexity", action="store_true")
    args = p.parse_args()
    results = {}
    for model in args.models:
        for peer in args.peers:
            r = run_one(peer, model, args)
            if r is not None:
                results[(model, peer)] = r
    print(perplexity_table(results) if args.perplexity else generation_table(results))


if __name__ == "__main__":
    main()
