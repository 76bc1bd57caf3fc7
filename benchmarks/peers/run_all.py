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


def result_path(peer: str, model: str, args: argparse.Namespace) -> Path:
    return BENCH_OUT / "results" / f"{peer}-{model}{'-ppl' if args.perplexity else ''}.json"


def load_saved(peer: str, model: str, args: argparse.Namespace) -> dict | None:
    path = result_path(peer, model, args)
    return json.loads(path.read_text()) if path.exists() else None


def run_one(peer: str, model: str, args: argparse.Namespace) -> dict | None:
    out = result_path(peer, model, args)
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
    """Medians, with the best repeat in parentheses (the one least disturbed on a shared machine)."""
    rows = ["| model | peer | prompt tok | prefill tok/s median (best) | decode tok/s median (best) | "
            "TTFT s median | peak RSS MB | generated | same prefix as transformers | load avg |",
            "|" + "---|" * 10]
    for (model, peer), r in results.items():
        ref = results.get((model, "transformers"))
        agree = f"{same_prefix(r['token_ids'], ref['token_ids'])}/{len(ref['token_ids'])}" if ref else "-"
        best_prefill = max(x["prefill_tok_s"] for x in r["repeats"])
        best_decode = max(x["decode_tok_s"] for x in r["repeats"])
        rows.append(f"| {model} | {peer} | {r['prompt_tokens']} | {r['prefill_tok_s']:.1f} ({best_prefill:.1f}) | "
                    f"{r['decode_tok_s']:.1f} ({best_decode:.1f}) | {r['ttft_s']:.3f} | "
                    f"{r['peak_rss_bytes'] / 2**20:.0f} | {r['generated_tokens']} | {agree} | "
                    f"{r['machine']['loadavg_1m']} |")
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
    p.add_argument("--table-only", action="store_true", help="print the table from saved results, run nothing")
    args = p.parse_args()
    results = {}
    for model in args.models:
        for peer in args.peers:
            r = load_saved(peer, model, args) if args.table_only else run_one(peer, model, args)
            if r is not None:
                results[(model, peer)] = r
    print(perplexity_table(results) if args.perplexity else generation_table(results))


if __name__ == "__main__":
    main()
