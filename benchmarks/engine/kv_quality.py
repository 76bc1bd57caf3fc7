"""Quality and memory of the KV cache formats side by side: held-out perplexity of one model with
an f16, q8_0 and kivi2 cache at several context lengths, on the same token windows, and the KV
bytes the planner counts for each (what the engine allocates).

Each context length N scores consecutive N-token windows of the held-out plays (export/corpus.py,
the text the export's perplexity uses), every token from the second on, fed 64 tokens per forward
call like a prompt; `tail` is the perplexity of the second half of each window only (positions
N/2..N-1, where most keys a query sees are old enough to be in a 2-bit block).

    .venv/bin/python benchmarks/engine/kv_quality.py -m smollm2-135m --contexts 512,2048,4096 \
        --tokens 8192 --formats f16,kivi2

Appends to benchmarks/results/kv-quality.jsonl; prints a table with ratios to f16.
"""

from __future__ import annotations

import argparse
import math
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "results"))
from record import append_result, new_run_id  # noqa: E402

import edgeflash.runtime.loader  # noqa: E402,F401  (registers the model sources)
from edgeflash.base.models import resolve_model  # noqa: E402
from edgeflash.export.corpus import code_heldout_text, heldout_text  # noqa: E402
from edgeflash.runtime.native_config import engine_memory, engine_options  # noqa: E402
from edgeflash.runtime.native_engine import NativeEngine  # noqa: E402
from edgeflash.runtime.sources import open_model  # noqa: E402

BATCH = 64  # tokens per forward call (the engine's default max_batch)
SKIP_CHARS = 20_000  # front matter of the held-out text


def windows(ids: list[int], length: int, tokens: int) -> list[list[int]]:
    count = max(1, tokens // length)
    if count * length > len(ids):
        raise SystemExit(f"the held-out text has {len(ids)} tokens, {count} windows of {length} need more")
    return [ids[i * length:(i + 1) * length] for i in range(count)]


def nll_rows(logits: np.ndarray, targets: np.ndarray) -> np.ndarray:
    z = logits.astype(np.float64)
    top = z.max(axis=1)
    lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
    return lse - z[np.arange(len(z)), targets]


def score(engine: NativeEngine, wins: list[list[int]]) -> tuple[float, float, int]:
    """Mean NLL over every scored token, over the second half of each window, and tokens scored."""
    total, tail, n_all, n_tail = 0.0, 0.0, 0, 0
    for ids in wins:
        engine.reset()
        per_pos = np.zeros(len(ids) - 1)
        for start in range(0, len(ids) - 1, BATCH):
            chunk = ids[start:start + BATCH]
            targets = np.asarray(ids[start + 1:start + 1 + len(chunk)], dtype=np.int64)
            logits = engine.forward(chunk, all_logits=True)[:len(targets)]
            for r in range(0, len(targets), 8):
                per_pos[start + r:start + r + 8] = nll_rows(logits[r:r + 8], targets[r:r + 8])
        half = len(ids) // 2
        total, n_all = total + per_pos.sum(), n_all + len(per_pos)
        tail, n_tail = tail + per_pos[half - 1:].sum(), n_tail + len(per_pos[half - 1:])
    return total / n_all, tail / n_tail, n_all


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("-m", "--model", required=True)
    p.add_argument("--contexts", default="512,2048,4096")
    p.add_argument("--tokens", type=int, default=8192, help="tokens scored per context length (whole windows)")
    p.add_argument("--formats", default="f16,kivi2")
    p.add_argument("--text", choices=["prose", "code"], default="prose")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--plan-only", action="store_true", help="record the planned KV bytes only (no scoring)")
    args = p.parse_args()

    source = open_model(resolve_model(args.model), verify=False)
    text = heldout_text() if args.text == "prose" else code_heldout_text()
    ids = source.tokenizer.encode(text[SKIP_CHARS:])
    run = new_run_id()
    command = " ".join(["python", *sys.argv])
    rows = []
    for n in (int(c) for c in args.contexts.split(",")):
        if n > source.spec.context_length:
            print(f"{args.model}: context {n} is past the model's {source.spec.context_length}; skipped")
            continue
        wins = windows(ids, n, args.tokens)
        for fmt in args.formats.split(","):
            options = engine_options(source.spec, context_length=n, max_batch=BATCH, kv_format=fmt)
            kv_bytes = engine_memory(source.spec, options).kv_cache
            if args.plan_only:
                append_result("kv-quality", {"run": run, "model": args.model, "config": f"context={n} kv={fmt}",
                                             "metric": "kv_cache_bytes", "value": kv_bytes, "unit": "bytes",
                                             "command": command, "notes": "planner only"})
                print(f"  {args.model} N={n} {fmt}: KV {kv_bytes / 2**20:.2f} MiB")
                continue
            engine = NativeEngine(source, threads=args.threads, options=options)
            assert engine.stats()["kv_cache_bytes"] == kv_bytes
            t0 = time.perf_counter()
            mean, tail, scored = score(engine, wins)
            seconds = time.perf_counter() - t0
            engine.close()
            del engine
            rows.append((n, fmt, math.exp(mean), math.exp(tail), kv_bytes, scored, seconds))
            config = f"{args.text} context={n} kv={fmt}"
            notes = f"{len(wins)} windows of {n} tokens, {seconds:.0f} s"
            for metric, value, unit in (("perplexity", math.exp(mean), "ppl"), ("perplexity_tail", math.exp(tail), "ppl"),
                                        ("kv_cache_bytes", kv_bytes, "bytes")):
                append_result("kv-quality", {"run": run, "model": args.model, "config": config, "metric": metric,
                                             "value": round(value, 4) if unit == "ppl" else value, "unit": unit,
                                             "rounds": scored, "command": command, "notes": notes})
            print(f"  {args.model} N={n} {fmt}: ppl {math.exp(mean):.4f} tail {math.exp(tail):.4f} "
                  f"KV {kv_bytes / 2**20:.2f} MiB ({scored} tokens, {seconds:.0f} s)", flush=True)

    if args.plan_only:
        return
    print(f"\n{args.model} ({args.text}), ratios to the f16 cache at the same context:")
    print(f"{'context':>8} {'kv':>6} {'ppl':>9} {'vs f16':>8} {'tail ppl':>9} {'vs f16':>8} {'KV MiB':>8} {'vs f16':>7}")
    base = {n: r for r in rows for n in [r[0]] if r[1] == "f16"}
    for n, fmt, ppl, tail, kvb, _, _ in rows:
        b = base.get(n)
        rel = (lambda a, c: f"{100 * (a / c - 1):+.2f}%") if b else (lambda a, c: "")
        print(f"{n:>8} {fmt:>6} {ppl:>9.4f} {rel(ppl, b[2]) if b else '':>8} {tail:>9.4f} "
              f"{rel(tail, b[3]) if b else '':>8} {kvb / 2**20:>8.2f} {f'{kvb / b[4]:.3f}x' if b else '':>7}")


if __name__ == "__main__":
    main()
