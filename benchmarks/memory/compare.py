"""Budgeted runs side by side: naive vs hybrid vs flash, exact and approximate, at 50% and 25% of
each model's bundle, every configuration in its own process (peak RSS is per run), interleaved
over rounds so load on this shared machine hits all alike. Each round runs the configurations in
its own shuffled order, seeded by the round, model and budget: the virtual disk's host may cache
what was read last, so no configuration should always run right after another (rotating the list
would keep each configuration behind the same neighbour). Besides medians of tok/s, the ratios
are given as the median over rounds of each round's own ratio. Reads use direct I/O: they go to
the storage (or the host's cache), not the guest's page cache. After each model and budget, the
round measures the storage's read rates and, from them, the most each flash configuration could
have gained over hybrid that round (read_ceiling.py); `--no-ceiling` skips it.

  python benchmarks/memory/compare.py                        # both models, 2 rounds
  python benchmarks/memory/compare.py --models gemma3-270m --rounds 3 --tokens 64
  python benchmarks/memory/compare.py --window-sweep         # bytes/token vs window k and sparsity (+ plot)
  python benchmarks/memory/compare.py --long                 # 512 tokens, model twice the budget, RSS over time

Bundles are exported once into bench-out/bundles/ (q4_0, full calibration). Budgets are fractions
of the bundle's size on flash (weights.bin: everything exact mode reads plus the neuron arenas and
predictors only approximate mode reads). Context: 256 tokens, so the KV cache leaves room for weights.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "benchmarks"))
from bench_bundles import ensure_bundle

sys.path.insert(0, str(Path(__file__).resolve().parent))
import read_ceiling

OUT = REPO / "bench-out" / "memory"
MODELS = ("gemma3-270m", "smollm2-135m")
PROMPT = "The history of the lighthouse keepers on this coast begins"

CONFIGS = {  # name -> load options
    "naive": {"strategy": "naive"},
    "hybrid": {"strategy": "hybrid"},
    "flash": {"strategy": "flash"},
    "flash+head": {"strategy": "flash", "head_shortlist": 8192},
    "flash+head+kv8": {"strategy": "flash", "head_shortlist": 8192, "kv_cache": "q8_0"},
    "flash+head+s30": {"strategy": "flash", "head_shortlist": 8192, "sparsity": 0.3},
    "flash+head+s50": {"strategy": "flash", "head_shortlist": 8192, "sparsity": 0.5},
}

RUN = textwrap.dedent("""
    import json, sys, time
    import edgeflash as ef
    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    bundle, budget, options, tokens, prompt = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4]), sys.argv[5]
    reset_peak_rss(); before = current_rss_bytes()
    try:  # budget 0: the unbudgeted engine, for its compute time a token
        m = ef.load(bundle, memory_budget=budget or None, context_length=256, **options)
    except ef.UserError as e:
        print(json.dumps({"error": str(e)})); sys.exit(0)
    r = m.generate(prompt, max_tokens=tokens)
    s = r.stats
    plan = getattr(m.engine, "plan", None)
    io = plan and {"threads": plan.io.threads, "chunk_bytes": plan.io.chunk_bytes, "unit": plan.unit_bytes}
    print(json.dumps({"decode_tok_s": s["decode_tok_s"], "prefill_tok_s": s["prefill_tok_s"], "io": io,
                      "flash_bytes_per_token": s.get("flash_bytes_per_token", 0), "io_wait_share": s.get("io_wait_share"),
                      "peak_over_baseline": peak_rss_bytes() - before, "planned": s.get("planned_bytes"),
                      "neuron_cache_hit_rate": s.get("neuron_cache_hit_rate"), "tokens": r.tokens,
                      "generated": s["generated_tokens"]}))
""")


def exact_bytes(bundle: Path) -> tuple[int, int]:
    """(bytes an exact run needs, bytes only approximate mode reads) from the manifest."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    approx = sum(b["nbytes"] for b in manifest["blocks"] if b["kind"] in ("neurons", "predictor"))
    total = sum(b["nbytes"] for b in manifest["blocks"])
    return total - approx, approx


def run(bundle: Path, budget: int, options: dict, tokens: int) -> dict:
    proc = subprocess.run([sys.executable, "-c", RUN, str(bundle), str(budget), json.dumps(options), str(tokens),
                           PROMPT], capture_output=True, text=True, cwd="/")
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[tuple, list[dict]] = {}
    plan = []
    for model in args.models:
        bundle = ensure_bundle(model)
        exact, approx = exact_bytes(bundle)
        print(f"{model}: exact-mode weights {exact / 1e6:.1f} MB (+ {approx / 1e6:.1f} MB arenas/predictors)",
              file=sys.stderr)
        for fraction in (0.5, 0.25):
            plan.append((model, bundle, fraction, int((exact + approx) * fraction)))
    ceilings: dict[tuple, list[dict]] = {}
    for round_no in range(args.rounds):
        compute_s = {}
        for model, bundle, fraction, budget in plan:
            for name in random.Random(f"{round_no}|{model}|{fraction}").sample(args.configs, len(args.configs)):
                r = run(bundle, budget, CONFIGS[name], args.tokens)
                results.setdefault((model, fraction, name), []).append(r)
                print(f"round {round_no} {model} {fraction:.0%} {name}: "
                      f"{r.get('error') or str(r['decode_tok_s']) + ' tok/s'}", file=sys.stderr)
            if args.ceiling and "hybrid" in args.configs:
                if model not in compute_s:
                    unbudgeted = run(bundle, 0, {}, args.tokens)
                    compute_s[model] = 1 / unbudgeted["decode_tok_s"] if "error" not in unbudgeted else 0.0
                c = round_ceiling(bundle, {n: results[(model, fraction, n)][-1] for n in args.configs}, compute_s[model])
                if c:
                    ceilings.setdefault((model, fraction), []).append(c)
    (OUT / "compare.json").write_text(json.dumps({**{f"{k[0]}|{k[1]}|{k[2]}": v for k, v in results.items()},
                                                  **{f"ceiling|{k[0]}|{k[1]}": v for k, v in ceilings.items()}}))
    print("| model | budget | config | decode tok/s | vs naive | vs hybrid | flash MB/token | I/O wait | "
          "peak RSS MB, largest (budget) | greedy = exact |")
    print("|" + "---|" * 10)
    for model, bundle, fraction, budget in plan:
        def median(name: str, key: str) -> float | None:
            runs = [r for r in results.get((model, fraction, name), []) if "error" not in r]
            return statistics.median(r[key] for r in runs) if runs else None

        exact_tokens = next((r["tokens"] for r in results.get((model, fraction, "hybrid"), []) if "tokens" in r), None)
        for name in args.configs:
            runs = [r for r in results[(model, fraction, name)] if "error" not in r]
            if not runs:
                err = results[(model, fraction, name)][0].get("error", "")
                print(f"| {model} | {fraction:.0%} ({budget / 1e6:.0f} MB) | {name} | - | | | | | | {err[:90]} |")
                continue
            tok = median(name, "decode_tok_s")
            ratios = [f"{tok / base:.2f}x" if base else "-"
                      for base in (median("naive", "decode_tok_s"), median("hybrid", "decode_tok_s"))]
            # every round's output, not just the first: exact mode must not drift between runs
            same = "yes" if all(r["tokens"] == exact_tokens for r in runs) else "no (approximate)"
            print(f"| {model} | {fraction:.0%} ({budget / 1e6:.0f} MB) | {name} | {tok:.1f} | {ratios[0]} | {ratios[1]} | "
                  f"{median(name, 'flash_bytes_per_token') / 1e6:.1f} | {median(name, 'io_wait_share'):.0%} | "
                  f"{max(r['peak_over_baseline'] for r in runs) / 1e6:.0f} ({budget / 1e6:.0f}) | {same} |")
    print_paired(plan, args.configs, results)
    if ceilings:
        print_ceilings(plan, ceilings)


def round_ceiling(bundle: Path, runs: dict[str, dict], compute_s: float) -> dict | None:
    """This round's storage rates and, for every flash configuration, the most it could have
    gained over hybrid (read_ceiling.py); None when hybrid did not run."""
    hybrid = runs.get("hybrid", {})
    if "error" in hybrid or not hybrid.get("io"):
        return None
    rates = read_ceiling.measure(bundle / "weights.bin", hybrid, runs.get("flash"))
    rates["compute_s"] = compute_s
    rates["configs"] = {}
    for name, r in runs.items():
        if name.startswith("flash") and "error" not in r:
            exact = CONFIGS[name] == {"strategy": "flash"}  # same arithmetic as unbudgeted
            rates["configs"][name] = {
                "vs_hybrid": r["decode_tok_s"] / hybrid["decode_tok_s"], "bytes_per_token": r["flash_bytes_per_token"],
                "ceiling": read_ceiling.ceiling(hybrid["decode_tok_s"], r["flash_bytes_per_token"], rates["best_mb_s"],
                                                compute_s if exact else 0.0)}
    return rates


READS_NOTHING = 100_000  # bytes a token: an embedding row's page, no weights


def print_ceilings(plan: list, ceilings: dict[tuple, list[dict]]) -> None:
    """Each flash configuration against the most this storage allowed it, round by round."""
    print("\n| model | budget | storage, median of rounds | config | vs hybrid, per round | ceiling vs hybrid, "
          "per round | share of the ceiling reached |")
    print("|" + "---|" * 7)
    for model, _, fraction, _ in plan:
        rounds = ceilings.get((model, fraction))
        if not rounds:
            continue
        storage = read_ceiling.summarize(rounds)
        for name in rounds[0]["configs"]:
            if rounds[0]["configs"][name]["bytes_per_token"] < READS_NOTHING:
                print(f"| {model} | {fraction:.0%} | {storage} | {name} | | reads nothing: bound by compute alone | |")
                continue
            pairs = [(r["configs"][name]["vs_hybrid"], r["configs"][name]["ceiling"]) for r in rounds
                     if name in r["configs"]]
            ratio, ceiling = [p[0] for p in pairs], [p[1] for p in pairs]
            share = statistics.median(a / c for a, c in pairs)
            print(f"| {model} | {fraction:.0%} | {storage} | {name} | {statistics.median(ratio):.2f}x "
                  f"({min(ratio):.2f}-{max(ratio):.2f}) | {statistics.median(ceiling):.2f}x "
                  f"({min(ceiling):.2f}-{max(ceiling):.2f}) | {share:.0%} |")


def print_paired(plan: list, configs: list[str], results: dict[tuple, list[dict]]) -> None:
    """Per-round ratios (each round's configurations ran back to back), their median and range,
    and the rate each configuration streamed at (MB per token x tokens per second)."""
    print("\n| model | budget | config | vs naive, per round: median (range) | vs hybrid, per round: median (range) "
          "| streamed MB/s |")
    print("|" + "---|" * 6)
    for model, _, fraction, _ in plan:
        def tok(name: str) -> list[float | None]:
            return [r.get("decode_tok_s") for r in results.get((model, fraction, name), [])]

        naive, hybrid = tok("naive"), tok("hybrid")
        for name in configs:
            runs = [r for r in results[(model, fraction, name)] if "error" not in r]
            if not runs:
                continue
            cells = []
            for base in (naive, hybrid):
                ratios = [a / b for a, b in zip(tok(name), base) if a and b]
                cells.append(f"{statistics.median(ratios):.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
            rate = statistics.median(r["flash_bytes_per_token"] * r["decode_tok_s"] / 1e6 for r in runs)
            print(f"| {model} | {fraction:.0%} | {name} | {cells[0]} | {cells[1]} | {rate:.0f} |")


def window_sweep(args: argparse.Namespace) -> None:
    """Neuron-cache bytes read per token for window k = 0..8 at sparsity 30/50/70% (generous budget,
    so the cache never evicts for lack of room: only the window decides)."""
    OUT.mkdir(parents=True, exist_ok=True)
    rows = []
    for model in args.models:
        bundle = ensure_bundle(model)
        exact, _ = exact_bytes(bundle)
        for sparsity in (0.3, 0.5, 0.7):
            for k in range(0, 9):
                opts = {"strategy": "flash", "sparsity": sparsity, "window": k, "head_shortlist": 8192}
                r = run(bundle, int(exact * 1.5), opts, args.tokens)
                if "error" in r:
                    print(f"{model} s={sparsity} k={k}: {r['error']}", file=sys.stderr)
                    continue
                rows.append({"model": model, "sparsity": sparsity, "window": k,
                             "flash_bytes_per_token": r["flash_bytes_per_token"], "hit_rate": r["neuron_cache_hit_rate"]})
                print(f"{model} s={sparsity} k={k}: {r['flash_bytes_per_token'] / 1e6:.2f} MB/token, "
                      f"hit rate {r['neuron_cache_hit_rate']}", file=sys.stderr)
    (OUT / "window_sweep.json").write_text(json.dumps(rows))
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: table only (pip install matplotlib for the plot)", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(args.models), figsize=(6 * len(args.models), 4), squeeze=False)
    for ax, model in zip(axes[0], args.models):
        for sparsity in (0.3, 0.5, 0.7):
            pts = [(r["window"], r["flash_bytes_per_token"] / 1e6) for r in rows
                   if r["model"] == model and r["sparsity"] == sparsity]
            if pts:
                ax.plot(*zip(*pts), marker="o", label=f"sparsity {sparsity:.0%}")
        ax.set_title(f"{model}: FFN neuron bytes read per token")
        ax.set_xlabel("window k (tokens whose neurons stay cached)")
        ax.set_ylabel("MB per token")
        ax.legend()
        ax.grid(alpha=0.3)
    path = REPO / "docs" / "img" / "memory-window-sweep.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    print(f"plot: {path}", file=sys.stderr)


LONG = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
    bundle, budget, tokens = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    reset_peak_rss(); before = current_rss_bytes()
    m = ef.load(bundle, memory_budget=budget, context_length=1024)
    samples = []
    g = m.generation("Write a long story about a lighthouse keeper and the sea.", tokens)
    for i, _ in enumerate(g):
        if i % 32 == 0:
            samples.append(current_rss_bytes() - before)
    r = g.result()
    print(json.dumps({"generated": r.stats["generated_tokens"], "rss_samples": samples,
                      "peak": peak_rss_bytes() - before, "decode_tok_s": r.stats["decode_tok_s"]}))
""")


def long_run(args: argparse.Namespace) -> None:
    for model in args.models:
        bundle = ensure_bundle(model)
        exact, _ = exact_bytes(bundle)
        budget = exact // 2  # the model is twice the budget
        proc = subprocess.run([sys.executable, "-c", LONG, str(bundle), str(budget), "512"], capture_output=True,
                              text=True, cwd="/")
        if proc.returncode != 0:
            print(proc.stderr[-2000:], file=sys.stderr)
            continue
        r = json.loads(proc.stdout.strip().splitlines()[-1])
        mb = [round(x / 1e6, 1) for x in r["rss_samples"]]
        print(f"{model}: budget {budget / 1e6:.0f} MB (model {exact / 1e6:.0f} MB), {r['generated']} tokens at "
              f"{r['decode_tok_s']} tok/s; RSS over baseline every 32 tokens (MB): {mb}; peak {r['peak'] / 1e6:.1f} MB")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--models", nargs="+", default=list(MODELS), choices=MODELS)
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                   help="skip measuring, each round, the most this storage allows over hybrid (read_ceiling.py)")
    p.add_argument("--window-sweep", action="store_true")
    p.add_argument("--long", action="store_true")
    args = p.parse_args()
    if args.window_sweep:
        window_sweep(args)
    elif args.long:
        long_run(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
