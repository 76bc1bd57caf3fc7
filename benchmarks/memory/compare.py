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
  python benchmarks/memory/compare.py --window-sweep --models qwen2.5-coder-1.5b --bundle /tmp/q15-bundle \
      --budgets 0.25 0.33 --sparsities 0.3 0.5 --windows 0 4 --cgroup   # timed: exact flash vs sparse S/K
  python benchmarks/memory/compare.py --long                 # 512 tokens, model twice the budget, RSS over time

Bundles are exported once into bench-out/bundles/ (q4_0, full calibration). Budgets are fractions
of the bundle's size on flash (weights.bin: everything exact mode reads plus the neuron arenas and
predictors only approximate mode reads). Context: 256 tokens, so the KV cache leaves room for weights.
"""

from __future__ import annotations

import argparse
import json
import os
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
                      "neuron_read_median_bytes": s.get("neuron_read_median_bytes"), "neuron_reads": s.get("neuron_reads"),
                      "sparsity": s.get("sparsity"), "plan_notes": plan.notes if plan else [],
                      "generated": s["generated_tokens"]}))
""")


def exact_bytes(bundle: Path) -> tuple[int, int]:
    """(bytes an exact run needs, bytes only approximate mode reads) from the manifest."""
    manifest = json.loads((bundle / "manifest.json").read_text())
    approx = sum(b["nbytes"] for b in manifest["blocks"] if b["kind"] in ("neurons", "predictor"))
    total = sum(b["nbytes"] for b in manifest["blocks"])
    return total - approx, approx


def bundle_of(model: str, args: argparse.Namespace) -> Path:
    if args.bundle is not None:
        if len(args.models) != 1:
            raise SystemExit("--bundle: give exactly one model in --models")
        return args.bundle
    if model not in MODELS:
        raise SystemExit(f"--models {model}: give its bundle with --bundle (only {', '.join(MODELS)} are exported here)")
    return ensure_bundle(model)


def run(bundle: Path, budget: int, options: dict, tokens: int, cgroup: Path | None = None,
        prompt: str = PROMPT) -> dict:
    cmd = [sys.executable, "-c", RUN, str(bundle), str(budget), json.dumps(options), str(tokens), prompt]
    if cgroup is not None:  # the shell joins the group, then becomes the measured process
        cmd = ["bash", "-c", f'echo $$ > {cgroup}/cgroup.procs; exec "$@"', "bash", *cmd]
    proc = subprocess.run(cmd, capture_output=True, text=True, cwd="/")
    if proc.returncode != 0:
        return {"error": proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"}
    return json.loads(proc.stdout.strip().splitlines()[-1])


def compare(args: argparse.Namespace) -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    results: dict[tuple, list[dict]] = {}
    plan = []
    for model in args.models:
        bundle = bundle_of(model, args)
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


QUALITY = textwrap.dedent("""
    import json, sys
    import numpy as np
    import edgeflash as ef
    from edgeflash.export.corpus import code_heldout_text, heldout_text
    from edgeflash.export.text import token_windows
    bundle, budget, configs, n_tokens = sys.argv[1], int(sys.argv[2]), json.loads(sys.argv[3]), int(sys.argv[4])
    # Token by token, as decoding runs: a batch would share one union of predicted neurons.
    # configs: name -> load options ("exact": {}); one model at a time, so four 1.5B models need not fit
    models = {}
    out = {}
    texts = {"prose": heldout_text(), "code": code_heldout_text()}
    nll, top = {}, {}
    for name, options in configs.items():
        m = ef.load(bundle, memory_budget=budget, context_length=256, **options)
        for kind, text in texts.items():
            windows = token_windows(m.tokenizer, text, n_tokens, 64, kind)
            nll[kind, name], top[kind, name] = [], []
            for window in windows:
                m.engine.reset()
                for i, tok in enumerate(window[:-1]):
                    logits = m.engine.forward([tok])[-1].astype(np.float64)
                    z = logits.max() + np.log(np.exp(logits - logits.max()).sum())
                    nll[kind, name].append(z - logits[window[i + 1]])
                    top[kind, name].append(int(np.argmax(logits)))
        m.close()
        del m
    for kind in texts:
        exact_top = np.asarray(top[kind, "exact"])
        for name in configs:
            out[f"{kind}|{name}"] = {"perplexity": float(np.exp(np.mean(nll[kind, name]))),
                                     "positions": len(nll[kind, name]),
                                     "top1_agreement": float(np.mean(np.asarray(top[kind, name]) == exact_top))}
    print(json.dumps(out))
""")


def quality(bundle: Path, budget: int, configs: dict[str, dict], tokens: int) -> dict:
    """Perplexity on held-out prose and code and top-1 agreement with the exact run, per sparsity
    level, teacher-forced token by token. The window and the budget do not change what a token
    computes (the cache only decides what is re-read), so one budget that holds everything serves."""
    proc = subprocess.run([sys.executable, "-c", QUALITY, str(bundle), str(budget), json.dumps(configs), str(tokens)],
                          capture_output=True, text=True, cwd="/")
    if proc.returncode != 0:
        raise SystemExit(f"quality run failed: {proc.stderr.strip()[-2000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


CGROUP_SLACK = 128_000_000  # the interpreter, numpy and edgeflash's code and files, outside the budget


def sweep_cgroup(budget: int) -> Path:
    sys.path.insert(0, str(REPO / "benchmarks" / "export"))
    from run_export import cgroup_dir

    return cgroup_dir(f"edgeflash-sweep-{budget}", budget + CGROUP_SLACK)


def sweep_plot(model: str, args: argparse.Namespace, results: dict[tuple, list[dict]], q: dict) -> None:
    """docs/img/memory-sparsity-sweep.png: tokens/s against sparsity (a line per selection mode and
    window, exact flash as a level line) per budget, and perplexity against sparsity per held-out
    text, exact at 0%."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib is not installed: tables only", file=sys.stderr)
        return
    fig, axes = plt.subplots(1, len(args.budgets) + (1 if q else 0), figsize=(4.2 * (len(args.budgets) + 1), 3.6))
    axes = list(axes) if hasattr(axes, "__len__") else [axes]
    for ax, fraction in zip(axes, args.budgets):
        flash = [r["decode_tok_s"] for r in results.get((fraction, "flash"), []) if "error" not in r]
        if flash:
            ax.axhline(statistics.median(flash), color="black", linestyle="--", label="exact flash")
        for mode in args.modes:
            tag = "" if mode == "neuron" else f" c{args.neuron_chunk // 1024}"
            for k in args.windows:
                xs, ys = [], []
                for s in args.sparsities:
                    runs = [r for r in results.get((fraction, f"s{s:g}{tag} k{k}"), []) if "error" not in r]
                    if runs:
                        xs.append(s)
                        ys.append(statistics.median(r["decode_tok_s"] for r in runs))
                if xs:
                    ax.plot(xs, ys, marker="o", label=f"{mode}{tag.strip() and ' ' + tag.strip() + ' KiB'}, window {k}")
        ax.set_title(f"{model} at {fraction:.0%} of its weights")
        ax.set_xlabel("sparsity")
        ax.set_ylabel("tokens/s")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    if q:
        ax = axes[-1]
        for mode in args.modes:
            tag = "" if mode == "neuron" else f" c{args.neuron_chunk // 1024}"
            for kind, style in (("prose", "-"), ("code", ":")):
                base = q[f"{kind}|exact"]["perplexity"]
                xs = [s for s in args.sparsities if f"{kind}|s{s:g}{tag}" in q]
                ys = [(q[f"{kind}|s{s:g}{tag}"]["perplexity"] / base - 1) * 100 for s in xs]
                ax.plot([0.0] + xs, [0.0] + ys, style, marker="o", label=f"{mode} (predictor), {kind}")
        for kind, style in (("prose", "-"), ("code", ":")):  # exact selection, when measured (sparse_quality.py)
            cats = [s for s in args.sparsities if f"{kind}|CATS exact {s:g}" in q]
            if cats:
                base = q[f"{kind}|exact"]["perplexity"]
                ax.plot([0.0] + cats, [0.0] + [(q[f"{kind}|CATS exact {s:g}"]["perplexity"] / base - 1) * 100
                                               for s in cats], style, marker="s", color="black",
                        label=f"exact CATS selection, {kind}")
        ax.axhline(10, color="grey", linestyle="--", label="+10%")
        ax.set_yscale("symlog", linthresh=10)
        ax.set_ylim(bottom=-1)
        ax.set_title("perplexity vs exact (held-out)")
        ax.set_xlabel("sparsity")
        ax.set_ylabel("% over exact")
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    path = REPO / "docs" / "img" / "memory-sparsity-sweep.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.tight_layout()
    fig.savefig(path, dpi=80)
    print(f"plot: {path}", file=sys.stderr)


def recorded_quality(model_name: str) -> dict:
    """The latest run of benchmarks/memory/sparse_quality.py for this model, as quality() returns
    it (perplexity and top-1 agreement per text and configuration), or {}."""
    sys.path.insert(0, str(REPO / "benchmarks" / "results"))
    from record import read_results

    rows = [r for r in read_results("memory-sparse-quality") if r.get("model") == model_name]
    if not rows:
        return {}
    run = max(r["run"] for r in rows)
    out: dict[str, dict] = {}
    for r in rows:
        if r["run"] == run and r["metric"].startswith(("perplexity_", "top1_agreement_")) \
                and not r["metric"].endswith("_pct"):
            kind = r["metric"].rsplit("_", 1)[1]
            key = "perplexity" if r["metric"].startswith("perplexity") else "top1_agreement"
            out.setdefault(f"{kind}|{r['config']}", {})[key] = r["value"]
    return out


def timed_window_sweep(args: argparse.Namespace) -> None:
    """Exact flash against sparse FFN (sparsity S, window K) at budgets that are fractions of the
    exact weights, side by side: every configuration in its own process, in a shuffled order per
    round; tokens/s with per-round ratios to exact flash, bytes and median neuron read per token,
    peak RSS against the budget; then perplexity (prose, code) and top-1 agreement per S."""
    sys.path.insert(0, str(REPO / "benchmarks" / "results"))
    from record import append_results, new_run_id

    OUT.mkdir(parents=True, exist_ok=True)
    # auto's measurements go to a profile of this run, not the user's (the runs inherit the variable)
    os.environ["XDG_CACHE_HOME"] = str(OUT / "cache")
    (OUT / "cache" / "edgeflash" / "sparsity-profile.json").unlink(missing_ok=True)
    run_id, command = new_run_id(), "python benchmarks/memory/compare.py " + " ".join(sys.argv[1:])
    configs = {"flash": {"strategy": "flash"}}
    quality_configs: dict[str, dict] = {"exact": {}}
    for s in args.sparsities:  # as asked (no fallback): what the setting itself costs
        for mode in args.modes:  # neuron by neuron (the predictor's threshold), or whole chunks
            chunk = {} if mode == "neuron" else {"neuron_chunk": args.neuron_chunk}
            tag = "" if mode == "neuron" else f" c{args.neuron_chunk // 1024}"
            for k in args.windows:
                configs[f"s{s:g}{tag} k{k}"] = {"strategy": "flash", "sparsity": s, "window": k, "ffn_fallback": False,
                                                **chunk}
            quality_configs[f"s{s:g}{tag}"] = {"sparsity": s, "ffn_fallback": False, **chunk}
    if args.planner:  # what a user gets: the planner falls back to exact flash where the setting loses
        for s in args.sparsities:
            configs[f"planner s{s:g} k4"] = {"strategy": "flash", "sparsity": s, "window": 4}
            if "chunk" in args.modes:
                configs[f"planner s{s:g} c{args.neuron_chunk // 1024} k4"] = {
                    "strategy": "flash", "sparsity": s, "window": 4, "neuron_chunk": args.neuron_chunk}
        configs["auto"] = {"strategy": "flash", "sparsity": "auto"}
    records = []
    for model in args.models:
        bundle = bundle_of(model, args)
        exact, approx = exact_bytes(bundle)
        results: dict[tuple, list[dict]] = {}
        for round_no in range(args.rounds):
            for fraction in args.budgets:
                budget = int(exact * fraction)
                cgroup = sweep_cgroup(budget) if args.cgroup else None
                for name in random.Random(f"{round_no}|{model}|{fraction}").sample(list(configs), len(configs)):
                    r = run(bundle, budget, configs[name], args.tokens, cgroup)
                    if cgroup is not None:
                        r["cgroup_max_usage"] = int((cgroup / "memory.max_usage_in_bytes").read_text())
                        (cgroup / "memory.max_usage_in_bytes").write_text("0")
                    results.setdefault((fraction, name), []).append(r)
                    print(f"round {round_no} {model} {fraction:.0%} {name}: "
                          f"{r.get('error') or str(r['decode_tok_s']) + ' tok/s'}", file=sys.stderr)
        q = quality(bundle, int((exact + approx) * 1.2), quality_configs, args.quality_tokens) \
            if args.quality_tokens else {}
        (OUT / f"window_sweep_timed_{model}.json").write_text(json.dumps(
            {"results": {f"{f}|{n}": v for (f, n), v in results.items()}, "quality": q}))

        def rec(budget: str | None, budget_mb: float | None, config: str, metric: str, value, unit=None, low=None,
                high=None, rounds=None) -> None:
            records.append({"run": run_id, "model": model, "budget": budget, "budget_mb": budget_mb, "config": config,
                            "metric": metric, "value": value, "unit": unit, "low": low, "high": high, "rounds": rounds,
                            "command": command})

        print(f"\n{model}: exact weights {exact / 1e6:.0f} MB; {args.tokens} greedy tokens, {args.rounds} rounds")
        print("| budget | config | tok/s | vs exact flash, per round | MB read/token | median neuron read KiB | "
              "cache hit rate | peak RSS MB (budget) | cgroup max MB | greedy = exact |")
        print("|" + "---|" * 10)
        for fraction in args.budgets:
            budget = int(exact * fraction)
            label, mb = f"{fraction:.0%}", round(budget / 1e6, 1)
            exact_runs = [r for r in results[(fraction, "flash")] if "error" not in r]
            exact_tokens = exact_runs[0]["tokens"] if exact_runs else None
            for name in configs:
                runs = [r for r in results[(fraction, name)] if "error" not in r]
                if not runs:
                    err = results[(fraction, name)][0].get("error", "")
                    print(f"| {label} ({mb:.0f} MB) | {name} | - | | | | | | | {err[:100]} |")
                    rec(label, mb, name, "refused", err[:300])
                    continue
                tok = statistics.median(r["decode_tok_s"] for r in runs)
                ratios = [a["decode_tok_s"] / b["decode_tok_s"] for a, b in zip(results[(fraction, name)],
                                                                               results[(fraction, "flash")])
                          if "error" not in a and "error" not in b]
                per_token = statistics.median(r["flash_bytes_per_token"] for r in runs)
                medians = [r["neuron_read_median_bytes"] for r in runs if r.get("neuron_read_median_bytes")]
                read = statistics.median(medians) if medians else None
                hit = statistics.median(r["neuron_cache_hit_rate"] for r in runs) \
                    if runs[0].get("neuron_cache_hit_rate") is not None else None
                peak = max(r["peak_over_baseline"] for r in runs)
                usage = max((r.get("cgroup_max_usage", 0) for r in runs), default=0)
                same = "yes" if all(r["tokens"] == exact_tokens for r in runs) else "no"
                ratio = statistics.median(ratios) if ratios else None
                fell_back = any(r.get("sparsity") is None for r in runs) and name != "flash"
                if name == "auto":
                    notes = [n for n in runs[-1].get("plan_notes", []) if "auto chose" in n]
                    print(f"auto: {notes[0] if notes else 'no choice noted'}", file=sys.stderr)
                print(f"| {label} ({mb:.0f} MB) | {name}{' (fell back to exact)' if fell_back else ''} | {tok:.2f} | "
                      + (f"{ratio:.2f}x ({min(ratios):.2f}-{max(ratios):.2f})" if ratios else "-")
                      + f" | {per_token / 1e6:.1f} | {read / 1024 if read else '-'} | {hit if hit is not None else '-'} | "
                      f"{peak / 1e6:.0f} ({mb:.0f}) | {usage / 1e6:.0f} | {same} |")
                rec(label, mb, name, "decode_tok_s", round(tok, 3), "tok/s", rounds=len(runs))
                if ratios:
                    rec(label, mb, name, "vs_exact_flash", round(ratio, 3), "x", round(min(ratios), 3),
                        round(max(ratios), 3), len(ratios))
                rec(label, mb, name, "mb_read_per_token", round(per_token / 1e6, 2), "MB", rounds=len(runs))
                if read:
                    rec(label, mb, name, "neuron_read_median_kib", read / 1024, "KiB", rounds=len(runs))
                if hit is not None:
                    rec(label, mb, name, "neuron_cache_hit_rate", hit, rounds=len(runs))
                rec(label, mb, name, "peak_rss_over_baseline_mb", round(peak / 1e6, 1), "MB", rounds=len(runs))
                if usage:
                    rec(label, mb, name, "cgroup_max_usage_mb", round(usage / 1e6, 1), "MB", rounds=len(runs))
                rec(label, mb, name, "greedy_equals_exact", same == "yes")
                if fell_back:
                    rec(label, mb, name, "fell_back_to_exact", True)
        model_name = json.loads((bundle / "manifest.json").read_text())["model"]["name"]
        sweep_plot(model, args, results, q or recorded_quality(model_name))
        if not q:
            continue
        print(f"\n| config | perplexity prose (vs exact) | perplexity code (vs exact) | top-1 = exact, prose | "
              f"top-1 = exact, code | positions |")
        print("|" + "---|" * 6)
        for name in quality_configs:
            cells = []
            for kind in ("prose", "code"):
                base, cur = q[f"{kind}|exact"]["perplexity"], q[f"{kind}|{name}"]["perplexity"]
                cells.append(f"{cur:.3f} ({(cur / base - 1) * 100:+.1f}%)")
                rec(None, None, name, f"perplexity_{kind}", round(cur, 4))
                rec(None, None, name, f"perplexity_{kind}_delta_pct", round((cur / base - 1) * 100, 2), "%")
                rec(None, None, name, f"top1_agreement_{kind}", round(q[f"{kind}|{name}"]["top1_agreement"], 4))
            print(f"| {name} | {cells[0]} | {cells[1]} | {q[f'prose|{name}']['top1_agreement']:.1%} | "
                  f"{q[f'code|{name}']['top1_agreement']:.1%} | {q[f'prose|{name}']['positions']}+"
                  f"{q[f'code|{name}']['positions']} |")
    append_results("memory-window", records)
    print(f"\n{len(records)} records appended to benchmarks/results/memory-window.jsonl (run {run_id})", file=sys.stderr)


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
    p.add_argument("--models", nargs="+", default=list(MODELS),
                   help=f"model aliases ({', '.join(MODELS)} are exported into bench-out/bundles/ when missing)")
    p.add_argument("--bundle", type=Path, default=None,
                   help="an exported bundle to use for the (single) model in --models, e.g. /tmp/q15-bundle")
    p.add_argument("--budgets", nargs="+", type=float, default=None,
                   help="--window-sweep timed side by side: budgets as fractions of the exact weights (0.25 0.33)")
    p.add_argument("--sparsities", nargs="+", type=float, default=[0.3, 0.5, 0.7])
    p.add_argument("--windows", nargs="+", type=int, default=[0, 4])
    p.add_argument("--modes", nargs="+", default=["neuron"], choices=["neuron", "chunk"],
                   help="--window-sweep --budgets: sparse selection neuron by neuron and/or in whole chunks")
    p.add_argument("--neuron-chunk", type=int, default=65536, help="chunk mode: bytes a chunk (default 64 KiB)")
    p.add_argument("--quality-tokens", type=int, default=192,
                   help="held-out tokens per text (prose, code) scored token by token for perplexity/agreement (0: none)")
    p.add_argument("--planner", action="store_true",
                   help="--window-sweep --budgets: also each level at window 4 with the planner's fallback, and auto")
    p.add_argument("--cgroup", action="store_true",
                   help="run each timed configuration in a memory cgroup of its budget + 128 MB (page cache counted)")
    p.add_argument("--configs", nargs="+", default=list(CONFIGS), choices=list(CONFIGS))
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--tokens", type=int, default=48)
    p.add_argument("--no-ceiling", dest="ceiling", action="store_false",
                   help="skip measuring, each round, the most this storage allows over hybrid (read_ceiling.py)")
    p.add_argument("--window-sweep", action="store_true")
    p.add_argument("--long", action="store_true")
    args = p.parse_args()
    if args.window_sweep and args.budgets:
        timed_window_sweep(args)
    elif args.window_sweep:
        window_sweep(args)
    elif args.long:
        long_run(args)
    else:
        compare(args)


if __name__ == "__main__":
    main()
