"""KV cache memory of each format side by side: the bytes the planner counts (what the engine
allocates) and the peak RSS of a real `edgeflash generate` at the same context, one process per
format, so the RSS differences between formats can be set against the planner's; then a budgeted
run per format with a long prompt, to show which formats fit the context under the budget.

    .venv/bin/python benchmarks/engine/kv_memory.py -m smollm2-135m --context 8192 --budget 100MB \
        --prompt-tokens 7500

Appends to benchmarks/results/kv-memory.jsonl; prints a table with ratios to f16.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
from record import append_result, new_run_id  # noqa: E402

import edgeflash.runtime.loader  # noqa: E402,F401  (registers the model sources)
from edgeflash.base.models import resolve_model  # noqa: E402
from edgeflash.export.corpus import heldout_text  # noqa: E402
from edgeflash.kernels.formats import KV_FORMATS  # noqa: E402
from edgeflash.runtime.native_config import kv_cache_bytes  # noqa: E402
from edgeflash.runtime.sources import open_model  # noqa: E402

EDGEFLASH = str(Path(sys.executable).parent / "edgeflash")
PROMPT = "The three most useful things to pack for a week of hiking are"


def generate(model: str, context: int, kv: str, *extra: str) -> tuple[int, dict | str]:
    res = subprocess.run([EDGEFLASH, "generate", "-m", model, "-n", "16", "--temperature", "0", "--context",
                          str(context), "--kv-cache", kv, "--json", *extra], capture_output=True, text=True)
    if res.returncode:
        return res.returncode, res.stderr.strip().splitlines()[-1]
    return 0, json.loads(res.stdout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--context", type=int, default=8192)
    p.add_argument("--budget", default=None, help="a memory budget for the long-prompt runs (e.g. 100MB)")
    p.add_argument("--prompt-tokens", type=int, default=7500)
    args = p.parse_args()

    source = open_model(resolve_model(args.model), verify=False)
    run = new_run_id()
    command = " ".join(["python", *sys.argv])

    def record(config: str, metric: str, value: float | str, unit: str, notes: str = "") -> None:
        append_result("kv-memory", {"run": run, "model": args.model, "budget": args.budget, "config": config,
                                    "metric": metric, "value": value, "unit": unit, "command": command,
                                    "notes": notes})

    planned, rss = {}, {}
    for kv in KV_FORMATS:
        planned[kv] = kv_cache_bytes(source.spec, args.context, kv_format=kv)
        code, out = generate(args.model, args.context, kv, "-p", PROMPT)
        assert code == 0, out
        assert out["kv_cache_bytes"] == planned[kv], (out["kv_cache_bytes"], planned[kv])
        rss[kv] = out["peak_rss_bytes"]
        record(f"context={args.context} kv={kv}", "kv_cache_bytes", planned[kv], "bytes", "planner (= engine)")
        record(f"context={args.context} kv={kv}", "peak_rss_bytes", rss[kv], "bytes", "unbudgeted, short prompt")
    print(f"{args.model}, context {args.context}:")
    print(f"{'kv':>6} {'planned MiB':>12} {'vs f16':>7} {'peak RSS MiB':>13} {'RSS - f16 RSS':>14} {'planned - f16':>14}")
    for kv in KV_FORMATS:
        print(f"{kv:>6} {planned[kv] / 2**20:>12.2f} {planned[kv] / planned['f16']:>6.3f}x {rss[kv] / 2**20:>13.1f} "
              f"{(rss[kv] - rss['f16']) / 2**20:>+14.1f} {(planned[kv] - planned['f16']) / 2**20:>+14.1f}")

    if not args.budget:
        return
    ids = source.tokenizer.encode(heldout_text()[200_000:260_000])[:args.prompt_tokens]
    with tempfile.NamedTemporaryFile("w", suffix=".txt", delete=False) as f:
        f.write(source.tokenizer.decode(ids))
    print(f"\n--memory-budget {args.budget} --context {args.context}, a {len(ids)}-token prompt:")
    for kv in KV_FORMATS:
        code, out = generate(args.model, args.context, kv, "--memory-budget", args.budget, "--prompt-file", f.name)
        config = f"context={args.context} kv={kv} prompt={len(ids)}"
        if code:
            record(config, "budget_run", "refused", "", f"exit {code}: {out}")
            print(f"{kv:>6}: refused (exit {code}): {out}")
        else:
            record(config, "budget_run_peak_rss_bytes", out["peak_rss_bytes"], "bytes",
                   f"prompt {out['prompt_tokens']} tok, generated {out['generated_tokens']}, "
                   f"baseline RSS {out['baseline_rss_bytes']}")
            print(f"{kv:>6}: ran, prompt {out['prompt_tokens']} tokens, peak RSS {out['peak_rss_bytes'] / 2**20:.1f} MiB "
                  f"({(out['peak_rss_bytes'] - out['baseline_rss_bytes']) / 2**20:.1f} MiB over the "
                  f"{out['baseline_rss_bytes'] / 2**20:.0f} MiB before loading)")
    Path(f.name).unlink()


if __name__ == "__main__":
    main()
