"""Every peer on every model, each workload in its own process; a markdown table at the end.

  python benchmarks/peers/run_all.py                       # generation, 3 repeats, 2 threads
  python benchmarks/peers/run_all.py --perplexity
  python benchmarks/peers/run_all.py --models smollm2-135m --peers edgeflash llamacpp executorch
  python benchmarks/peers/run_all.py --rounds 3            # side by side, interleaved, with ratios

With --rounds R every peer runs R times, interleaved (edgeflash, llama.cpp, ExecuTorch, ...,
again), so a burst of load on this shared machine hits all of them alike; the table then shows the
median over rounds of each run's best repeat and edgeflash's ratio to each peer.

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

# random-7b runs only when named: its fp32 transformers copy alone would need about 30 GB.
DEFAULT_MODELS = ["gemma3-270m", "smollm2-135m", "qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b"]

HERE = Path(__file__).resolve().parent
# peer -> (runner, extra flags)
PEERS = {
    "edgeflash": ("run_edgeflash.py", []),  # the GGUF itself, q8x2 activations
    "edgeflash-q8": ("run_edgeflash.py", ["--activations", "q8"]),  # ggml-style activations
    # a 4-bit bundle from `edgeflash export --quant q4_0` (4-bit head too, as ExecuTorch's 8da4w)
    "edgeflash-q4-bundle": ("run_edgeflash.py", ["--activations", "q8", "--source",
                                                 "bundle:" + str(BENCH_OUT / "bundles" / "{model}-q4_0")]),
    "llamacpp": ("run_llamacpp.py", []),
    "executorch": ("run_executorch.py", []),
    "transformers": ("run_transformers.py", []),
}
# Prompt length per model, as in the measurements these benchmarks reproduce.
DEFAULT_PROMPT_TOKENS = {"gemma3-270m": 500, "smollm2-135m": 400, "qwen2.5-coder-0.5b": 400,
                         "qwen2.5-coder-1.5b": 400, "random-7b": 400}


def result_path(peer: str, model: str, args: argparse.Namespace, round_no: int = 0) -> Path:
    suffix = f"-r{round_no}" if round_no else ""
    return BENCH_OUT / "results" / f"{peer}-{model}{'-ppl' if args.perplexity else ''}{suffix}.json"


def load_saved(peer: str, model: str, args: argparse.Namespace) -> dict | None:
    path = result_path(peer, model, args)
    return json.loads(path.read_text()) if path.exists() else None


def run_one(peer: str, model: str, args: argparse.Namespace, round_no: int = 0) -> dict | None:
    out = result_path(peer, model, args, round_no)
    runner, extra = PEERS[peer]
    cmd = [sys.executable, str(HERE / runner), "--model", model, "--threads", str(args.threads),
           "--out", str(out), *(flag.format(model=model) for flag in extra)]
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


def side_by_side_table(rounds: list[dict[tuple[str, str], dict]]) -> str:
    """Median over rounds of each run's best repeat, and edgeflash's ratio to each peer."""
    import statistics

    keys = sorted({k for r in rounds for k in r}, key=lambda k: (k[0], list(PEERS).index(k[1])))
    med = {}
    for key in keys:
        runs = [r[key] for r in rounds if key in r]
        med[key] = {m: statistics.median(x[f"best_{m}"] for x in runs) for m in ("prefill_tok_s", "decode_tok_s")}
        med[key]["rss"] = statistics.median(x["peak_rss_bytes"] for x in runs) / 2**20
        med[key]["n"] = len(runs)
    rows = ["| model | peer | rounds | prefill tok/s | decode tok/s | peak RSS MB | edgeflash prefill ratio | "
            "edgeflash decode ratio |", "|" + "---|" * 8]
    for model, peer in keys:
        m = med[(model, peer)]
        ours = med.get((model, "edgeflash"))
        ratio = (lambda a: f"{ours[a] / m[a]:.2f}x") if ours and peer != "edgeflash" else (lambda a: "-")
        rows.append(f"| {model} | {peer} | {m['n']} | {m['prefill_tok_s']:.1f} | {m['decode_tok_s']:.1f} | "
                    f"{m['rss']:.0f} | {ratio('prefill_tok_s')} | {ratio('decode_tok_s')} |")
    return "\n".join(rows)


def perplexity_table(results: dict[tuple[str, str], dict]) -> str:
    rows = ["| model | peer | perplexity | tokens scored |", "|---|---|---|---|"]
    for (model, peer), r in results.items():
        rows.append(f"| {model} | {peer} | {r['perplexity']:.3f} | {r['predicted_tokens']} |")
    return "\n".join(rows)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=DEFAULT_MODELS, choices=list(MODELS))
    p.add_argument("--peers", nargs="+", default=["edgeflash", "llamacpp", "executorch", "transformers"],
                   choices=list(PEERS))
    p.add_argument("--prompt-tokens", type=int)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--perplexity", action="store_true")
    p.add_argument("--table-only", action="store_true", help="print the table from saved results, run nothing")
    p.add_argument("--rounds", type=int, default=0, help="interleaved side-by-side rounds (0: one plain sweep)")
    args = p.parse_args()
    if args.rounds and not args.perplexity:
        rounds = []
        for round_no in range(1, args.rounds + 1):
            done = {}
            for model in args.models:
                for peer in args.peers:
                    r = run_one(peer, model, args, round_no)
                    if r is not None:
                        done[(model, peer)] = r
            rounds.append(done)
        print(side_by_side_table(rounds))
        return
    results = {}
    for model in args.models:
        for peer in args.peers:
            r = load_saved(peer, model, args) if args.table_only else run_one(peer, model, args)
            if r is not None:
                results[(model, peer)] = r
    print(perplexity_table(results) if args.perplexity else generation_table(results))


if __name__ == "__main__":
    main()
