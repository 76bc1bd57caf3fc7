"""Unbudgeted peak RSS against what the engine accounts for (weights + KV cache + activation
buffers + tokenizer and manifest), for each benchmark model from its GGUF and from its q4_0 bundle.

Each measurement runs in a fresh process: open the model, generate 48 tokens after a ~300-token
prompt with the whole model resident (2 threads, 1024-token context), and compare the process's
peak RSS over its baseline with the accounted bytes. Records: benchmarks/results/peak-rss.jsonl.

  python benchmarks/engine/peak_rss.py
  python benchmarks/engine/peak_rss.py --models smollm2-135m --no-save
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "results"))
from bench_models import MODELS, ensure_bundle, gguf_path

MEASURE = r"""
import gc, json, sys
import edgeflash.api
from edgeflash.base.heap import release_free_heap
from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
from edgeflash.runtime.loader import LoadedModel
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.sources import open_model

gc.collect(); release_free_heap()
before = current_rss_bytes()
reset_peak_rss()
source = open_model(sys.argv[1])
source.tokenizer.decode(source.tokenizer.encode("warm up the tokenizer"))
gc.collect(); release_free_heap()
rewritten = sum(source.tensors[n].nbytes for n in source.info.get("rewritten_tensors", []))
tokenizer_and_manifest = current_rss_bytes() - before - rewritten
engine = NativeEngine(source, threads=2, context_length=1024)
model = edgeflash.api.Model(LoadedModel(source, engine, "none"))
model.generate("Once upon a time, in a land far away, " * 30, max_tokens=48)
stats = engine.stats()
print(json.dumps({"peak_delta": peak_rss_bytes() - before, "weights": stats["weight_bytes"],
                  "kv_cache": stats["kv_cache_bytes"], "activations": stats["activation_bytes"],
                  "tokenizer_and_manifest": tokenizer_and_manifest}))
"""


def measure(path: Path) -> dict:
    proc = subprocess.run([sys.executable, "-c", MEASURE, str(path)], capture_output=True, text=True, timeout=900,
                          check=False)
    if proc.returncode != 0:
        raise SystemExit(f"{path}: {proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else proc.returncode}")
    m = json.loads(proc.stdout.strip().splitlines()[-1])
    m["accounted"] = m["weights"] + m["kv_cache"] + m["activations"] + m["tokenizer_and_manifest"]
    m["ratio"] = m["peak_delta"] / m["accounted"]
    return m


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--models", default=",".join(MODELS))
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    rows = []
    for name in args.models.split(","):
        for kind, path in (("gguf", gguf_path(name)), ("q4_0 bundle", ensure_bundle(name))):
            if path is None:
                print(f"{name}: no q4_0 bundle (benchmarks/engine/side_by_side.py --export writes it)", file=sys.stderr)
                continue
            m = measure(path)
            rows.append((name, kind, m))
            mib = 2**20
            print(f"{name:20s} {kind:12s} peak {m['peak_delta'] / mib:7.1f} MiB  accounted {m['accounted'] / mib:7.1f} "
                  f"MiB (weights {m['weights'] / mib:.1f}, KV {m['kv_cache'] / mib:.1f}, buffers "
                  f"{m['activations'] / mib:.1f}, tokenizer {m['tokenizer_and_manifest'] / mib:.1f})  "
                  f"{m['ratio']:.3f}x", flush=True)
    if not args.no_save:
        from record import append_results, new_run_id

        run, cmd = new_run_id(), "python benchmarks/engine/peak_rss.py " + " ".join(argv or sys.argv[1:])
        recs = []
        for name, kind, m in rows:
            for metric, value, unit in (("peak_rss_over_baseline_mb", m["peak_delta"] / 2**20, "MiB"),
                                        ("accounted_mb", m["accounted"] / 2**20, "MiB"),
                                        ("peak_over_accounted", m["ratio"], "x")):
                recs.append({"run": run, "model": name, "config": f"{kind}, unbudgeted, 2T, ctx 1024",
                             "metric": metric, "value": round(value, 4), "unit": unit, "command": cmd.strip()})
        append_results("peak-rss", recs)
        print("records appended to benchmarks/results/peak-rss.jsonl")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
