"""Per-token roofline of decoding: the weight bytes a token reads, the machine's measured read
bandwidth, where a token's time goes, and how close it is to the fastest a token can be.

For each model, from the GGUF file as it is and from its q4_0 bundle:
  bytes per token   every weight matrix a decode step reads once, by role (q, k, v, o, gate, up,
                    down, head; the head is the embedding table when they are tied), plus one
                    embedding row and the KV cache at the decoded positions
  bandwidth         a streaming read of 1 GiB at 1 and 2 threads (best of 10), again after each
                    model at the run's thread count; the roofline uses the best of the run
  time per token    the engine's own per-operation timing (runtime/native/op_profile.h), over greedy
                    decode steps after a prompt: GEMV by role, attention, everything else
  roofline          bytes per token / bandwidth at the run's thread count; "% of roofline" is that
                    time over the measured time of the C++ forward pass

  python benchmarks/engine/roofline.py -m qwen2.5-coder-0.5b                 # GGUF and bundle if exported
  python benchmarks/engine/roofline.py -m smollm2-135m -m gemma3-270m --export   # export missing bundles
  edgeflash bench roofline -m qwen2.5-coder-1.5b

Records go to benchmarks/results/roofline.jsonl (record.py) when that folder is in the checkout,
else to bench-out/results/roofline.jsonl in the same record format.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench_models import BENCH_OUT, REPO, ensure_bundle, gguf_path

# Matrix roles of a layer tensor name (after "blk.N.").
ROLES = {
    "attn_q.weight": "q",
    "attn_k.weight": "k",
    "attn_v.weight": "v",
    "attn_output.weight": "o",
    "ffn_gate.weight": "gate",
    "ffn_up.weight": "up",
    "ffn_down.weight": "down",
    "ffn_arena": "ffn arena (gate, up, down)",  # a format-3 bundle's one copy of the FFN
}
GEMV_OPS = ("gemv_qkv", "gemv_o", "gemv_ffn_in", "gemv_ffn_down", "ffn_arena", "gemv_head")


def weight_bytes_per_token(engine) -> dict[str, int]:
    """Bytes of each matrix role one decode step reads (as the engine holds them) and their formats."""
    from edgeflash.kernels.formats import KERNEL_FORMATS, row_bytes

    spec, tensors = engine.spec, engine.source.tensors

    def held(t) -> int:  # storage-only formats, and with requantize wider ones, are converted at load
        done = engine.conversions.get(t.name)  # "q4_k->q3_k", "q4_1->q4_0 (576 columns: ...)"
        if done:
            return t.rows * row_bytes(done.split("->")[1].split()[0], t.cols)
        if t.fmt in KERNEL_FORMATS:
            return t.nbytes
        return t.rows * row_bytes("q8_0" if t.cols % 32 == 0 else "f16", t.cols)

    out: dict[str, int] = {}
    for name, t in tensors.items():
        if not name.startswith("blk."):
            continue
        role = ROLES.get(name.split(".", 2)[2])
        if role is None:  # norms and biases; a bundle's neuron predictors are not read by a dense step
            if len(t.shape) != 1:
                continue
            role = "vectors"
        out[role] = out.get(role, 0) + held(t)
    head = tensors["token_embd.weight" if spec.tied_embeddings else "output.weight"]
    out["head (tied embedding)" if spec.tied_embeddings else "head"] = held(head)
    embd = tensors["token_embd.weight"]
    out["embedding row"] = held(embd) // embd.rows
    return out


def formats_of(engine) -> dict[str, list[str]]:
    spec, tensors = engine.spec, engine.source.tensors
    fm: dict[str, set[str]] = {}
    for name, t in tensors.items():
        if name.startswith("blk.") and name.split(".", 2)[2] in ROLES:
            fm.setdefault(ROLES[name.split(".", 2)[2]], set()).add(t.fmt)
    fm["head"] = {tensors["token_embd.weight" if spec.tied_embeddings else "output.weight"].fmt}
    return {k: sorted(v) for k, v in fm.items()}


def kv_bytes_read(engine, positions: list[int]) -> float:
    """Mean bytes of K and V one decode step reads at these positions (every layer, its window)."""
    from edgeflash.kernels.formats import kv_row_bytes

    spec = engine.spec
    row = kv_row_bytes(engine.kv_format, spec.head_dim)
    per_pos = []
    for p in positions:
        live = sum(min(p + 1, spec.window(layer) or p + 1) for layer in range(spec.n_layers))
        per_pos.append(2 * spec.n_kv_heads * live * row)
    return float(np.mean(per_pos))


def read_bandwidth(threads: int) -> float:
    from edgeflash.kernels.bench import read_bandwidth as bw

    return bw(threads)


def decode_profile(model, prompt_ids: list[int], tokens: int, rounds: int) -> dict:
    """The per-token profile of `tokens` greedy decode steps after the prompt, from the round with
    the median forward time."""
    engine = model.engine
    native = engine._engine
    per_round = []
    for _ in range(rounds):
        engine.reset()
        logits = engine.forward(prompt_ids)
        tok = int(np.argmax(logits[-1]))
        calls = []
        native.set_profiling(True)
        for _ in range(tokens):
            t0 = time.perf_counter()
            logits = engine.forward([tok])
            calls.append(time.perf_counter() - t0)
            tok = int(np.argmax(logits[-1]))
        prof = native.profile()
        native.set_profiling(False)
        n = prof["tokens"]
        r = {op: v[0] / n * 1e3 for op, v in prof.items() if isinstance(v, tuple)}
        r["call"] = statistics.median(calls) * 1e3
        per_round.append(r)
    # The round with the median forward time, whole: its parts add up (medians of each part need not).
    out = dict(sorted(per_round, key=lambda r: r["forward"])[len(per_round) // 2])
    out["gemv"] = sum(out[k] for k in GEMV_OPS)
    out["other"] = out["forward"] - out["gemv"] - out["attention"] - out["ffn_hook"]
    out["positions"] = list(range(len(prompt_ids), len(prompt_ids) + tokens))
    return out


def profile_model(name: str, source_kind: str, path: Path, args, bandwidth: dict[int, float]) -> dict:
    import edgeflash as ef
    from edgeflash.export.corpus import heldout_windows

    requantize = source_kind.split(":", 1)[1] if source_kind.startswith("gguf:") else None
    model = ef.load(str(path), threads=args.threads, activations=args.activations, context_length=2048,
                    requantize=requantize)
    engine = model.engine
    text = heldout_windows(1, chars_per_window=8 * args.prompt_tokens, offset_chars=50_000)[0]
    ids = model.encode(text)[: args.prompt_tokens]
    engine.forward(ids[:8])  # warm-up: pages of the weights, scratch growth, thread wake-up
    engine.reset()
    prof = decode_profile(model, ids, args.tokens, args.rounds)
    roles = weight_bytes_per_token(engine)
    kv = kv_bytes_read(engine, prof["positions"])
    weights = sum(v for k, v in roles.items())
    total = weights + kv
    gemv_bytes = weights - roles.get("vectors", 0) - roles["embedding row"]
    result = {
        "model": name,
        "source": source_kind,
        "path": str(path),
        "threads": args.threads,
        "activations": args.activations,
        "prompt_tokens": len(ids),
        "decode_tokens": args.tokens,
        "rounds": args.rounds,
        "bytes_by_role": roles,
        "formats": formats_of(engine),
        "kv_bytes": kv,
        "bytes_per_token": total,
        "times_ms": {k: v for k, v in prof.items() if k != "positions"},
        "gemv_gb_s": gemv_bytes / (prof["gemv"] * 1e-3) / 1e9 if prof["gemv"] else None,
        "tok_s": 1e3 / prof["call"],
        "loadavg": os.getloadavg()[0],
    }
    del model
    return result


def finish(results: list[dict], bandwidth: dict[int, float], threads: int) -> None:
    """The roofline of each result at the best bandwidth measured in the run (on a shared machine
    the bandwidth probe runs low when other jobs read memory: the best one is the conservative
    roofline, the shortest time a token could take)."""
    for r in results:
        r["bandwidth_gb_s"] = dict(bandwidth)
        r["roofline_ms"] = r["bytes_per_token"] / (bandwidth[threads] * 1e9) * 1e3
        r["pct_of_roofline"] = r["roofline_ms"] / r["times_ms"]["forward"]


def print_table(results: list[dict], threads: int) -> None:
    print(
        f"\n| model | source | MB/token | roofline ms ({threads}T) | forward ms | GEMV ms (GB/s) | qkv | "
        "attn | o | gate+up | down | head | other | % roofline | tok/s | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for r in results:
        t = r["times_ms"]
        print(
            f"| {r['model']} | {r['source']} | {r['bytes_per_token'] / 1e6:.1f} | {r['roofline_ms']:.2f} | "
            f"{t['forward']:.2f} | {t['gemv']:.2f} ({r['gemv_gb_s']:.1f}) | {t['gemv_qkv']:.2f} | "
            f"{t['attention']:.2f} | {t['gemv_o']:.2f} | {t['gemv_ffn_in']:.2f} | "
            f"{t['gemv_ffn_down']:.2f} | {t['gemv_head']:.2f} | {t['other'] + t['ffn_act']:.2f} | "
            f"{100 * r['pct_of_roofline']:.0f}% | {r['tok_s']:.1f} | {r['loadavg']:.1f} |"
        )
    print("\nbytes per token by role (MB):")
    for r in results:
        roles = ", ".join(f"{k} {v / 1e6:.1f}" for k, v in r["bytes_by_role"].items())
        print(
            f"  {r['model']} {r['source']}: {roles}, kv cache {r['kv_bytes'] / 1e6:.1f}; "
            f"formats {r['formats']}"
        )


def records(results: list[dict], bandwidth: dict[int, float], run: str, command: str) -> list[dict]:
    out = [
        {
            "run": run,
            "config": f"{t} thread{'s' if t > 1 else ''}",
            "metric": "read_bandwidth_gb_s",
            "value": round(bw, 2),
            "unit": "GB/s",
            "command": command,
        }
        for t, bw in bandwidth.items()
    ]
    for r in results:
        config = f"{r['source']}, {r['activations']}, {r['threads']}T"
        base = {"run": run, "model": r["model"], "config": config, "rounds": r["rounds"], "command": command}
        t = r["times_ms"]
        values = [
            ("bytes_per_token_mb", r["bytes_per_token"] / 1e6, "MB"),
            ("roofline_ms", r["roofline_ms"], "ms"),
            ("forward_ms", t["forward"], "ms"),
            ("call_ms", t["call"], "ms"),
            ("gemv_ms", t["gemv"], "ms"),
            ("attention_ms", t["attention"], "ms"),
            ("other_ms", t["other"] + t["ffn_act"], "ms"),
            ("gemv_gb_s", r["gemv_gb_s"], "GB/s"),
            ("pct_of_roofline", 100 * r["pct_of_roofline"], "%"),
            ("decode_tok_s", r["tok_s"], "tok/s"),
            ("loadavg_1m", r["loadavg"], None),
        ]
        values += [(f"{op}_ms", t[op], "ms") for op in GEMV_OPS]
        values += [
            (f"bytes_{role.split(' ')[0]}_mb", b / 1e6, "MB") for role, b in r["bytes_by_role"].items()
        ]
        for metric, value, unit in values:
            rec = {**base, "metric": metric, "value": round(value, 4)}
            if unit:
                rec["unit"] = unit
            out.append(rec)
        out.append({**base, "metric": "formats", "value": json.dumps(r["formats"])})
    return out


def save(recs: list[dict]) -> Path:
    results_dir = REPO / "benchmarks" / "results"
    if (results_dir / "record.py").is_file():
        sys.path.insert(0, str(results_dir))
        from record import append_results

        append_results("roofline", recs)
        return results_dir / "roofline.jsonl"
    path = BENCH_OUT / "results" / "roofline.jsonl"
    path.parent.mkdir(parents=True, exist_ok=True)
    import datetime as dt

    with open(path, "a", encoding="utf-8") as f:
        day = dt.date.today().isoformat()
        f.writelines(json.dumps({"benchmark": "roofline", "date": day, **r}) + "\n" for r in recs)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument(
        "-m", "--model", action="append", help="model alias or GGUF path (repeatable; default: all four)"
    )
    p.add_argument("--sources", default="gguf,q4_0",
                   help="gguf, gguf:FORMAT (the GGUF with requantize=FORMAT) and/or q4_0 (the bundle), "
                        "comma-separated")
    p.add_argument(
        "--export",
        action="store_true",
        help="export a missing q4_0 bundle first (a heavy job for the 1.5B model)",
    )
    p.add_argument("-t", "--threads", type=int, default=2)
    p.add_argument("--activations", default="q8", choices=["q8", "q8x2", "f32"])
    p.add_argument("--prompt-tokens", type=int, default=256)
    p.add_argument("--tokens", type=int, default=64, help="decode steps per round")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    import datetime as dt

    from bench_models import MODELS
    from edgeflash.base.errors import UserError

    names = args.model or list(MODELS)
    sources = args.sources.split(",")
    threads = sorted({1, args.threads})
    bandwidth = {t: read_bandwidth(t) for t in threads}
    print(
        "read bandwidth (1 GiB streaming read, best of 10): "
        + ", ".join(f"{bandwidth[t]:.1f} GB/s @ {t}T" for t in threads),
        flush=True,
    )
    results = []
    for name in names:
        for kind in sources:
            if kind.split(":")[0] == "gguf":
                path = gguf_path(name)
            else:
                path = ensure_bundle(name, kind, export=args.export)
                if path is None:
                    print(f"[{name}: no {kind} bundle; run with --export to write it]", file=sys.stderr)
                    continue
            try:
                results.append(profile_model(name, kind, path, args, bandwidth))
            except UserError as e:
                print(f"[{name} {kind}: {e}]", file=sys.stderr)
                continue
            r = results[-1]
            now = read_bandwidth(args.threads)  # again after each run: the best one counts
            bandwidth[args.threads] = max(bandwidth[args.threads], now)
            print(
                f"{name} {kind}: {r['bytes_per_token'] / 1e6:.1f} MB/token, "
                f"forward {r['times_ms']['forward']:.2f} ms; read bandwidth now {now:.1f} GB/s",
                flush=True,
            )
    finish(results, bandwidth, args.threads)
    print(
        "best read bandwidth of the run: "
        + ", ".join(f"{bandwidth[t]:.1f} GB/s @ {t}T" for t in threads),
        flush=True,
    )
    print_table(results, args.threads)
    if results and not args.no_save:
        run = dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
        path = save(records(results, bandwidth, run, " ".join(["roofline.py", *(argv or sys.argv[1:])])))
        print(f"\nrecords appended to {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
