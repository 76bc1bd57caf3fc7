"""Perplexity of edgeflash's quantization schemes against llama.cpp's own quantizer, same source.

    python benchmarks/quality/vs_llamacpp.py --model smollm2-135m --work /tmp/vs-llamacpp
    python benchmarks/quality/vs_llamacpp.py --model qwen2.5-coder-1.5b --stages gguf,llamacpp   # split a long run

Stages (each skips work whose output already exists in --work):
  gguf      the source model's tensors, dequantized, written as an F16 GGUF (matrices f16, vectors f32,
            every metadata key copied): the one file both quantizers start from
  llamacpp  llama.cpp quantizes that file (llama_cpp.llama_model_quantize, in the peers' venv) to
            Q4_0, Q4_K_M and Q8_0
  export    edgeflash exports the same F16 file with its schemes (no neuron arena, no predictors: the
            weights only, as dense as llama.cpp's files)
  score     every file on the same held-out token ids (prose and code, the exporter's held-out texts):
            edgeflash's GGUF loader on the native engine for every file, and llama.cpp itself
            (llama-cpp-python logits) for the GGUF files
Each score is one jsonl line in --out with bits per weight (bytes of all weights x 8 / parameters).
`python benchmarks/quality/vs_llamacpp.py --table [RESULTS]` prints the latest scores as a table.
"""

from __future__ import annotations

import argparse
import datetime
import json
import math
import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

BENCH_PYTHON = Path("/work/main/.venv-bench/bin/python")  # llama-cpp-python 0.3.36
LLAMA_FTYPES = {"Q4_0": 2, "Q8_0": 7, "Q4_K_M": 15}  # llama_ftype values
EF_SCHEMES = ("q4_0", "q4_lut", "q4_k", "q5_0", "q8_0")
RESULTS = HERE.parent / "results" / "quality-vs-llamacpp.jsonl"

_LLAMA_QUANTIZE = """
import ctypes, sys, llama_cpp
src, dst, ftype, threads = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
params = llama_cpp.llama_model_quantize_default_params()
params.ftype = ftype
params.nthread = threads
rc = llama_cpp.llama_model_quantize(src.encode(), dst.encode(), ctypes.byref(params))
sys.exit(rc)
"""

_LLAMA_SCORE = """
import json, sys, numpy as np, llama_cpp
path, windows_file, threads = sys.argv[1], sys.argv[2], int(sys.argv[3])
windows = json.load(open(windows_file))
n_ctx = max(len(w) for ws in windows.values() for w in ws)
llm = llama_cpp.Llama(model_path=path, n_ctx=n_ctx, n_batch=n_ctx, n_threads=threads, logits_all=True, verbose=False)
out = {}
for kind, ws in windows.items():
    total, count = 0.0, 0
    for ids in ws:
        llm.reset()
        llm.eval(ids)
        z = np.asarray(llm.scores[:len(ids) - 1], dtype=np.float64)
        top = z.max(axis=1)
        lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        t = np.asarray(ids[1:])
        total += float((lse - z[np.arange(len(t)), t]).sum())
        count += len(t)
    out[kind] = [total, count]
print(json.dumps(out))
"""


def write_f16_gguf(source: Path, out: Path) -> None:
    """Every tensor of `source` dequantized from the file's own bytes (gguf-py; edgeflash's loader
    would undo llama.cpp's q/k row order): 2-D ones as F16, the rest F32; metadata copied."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    tmp = out.with_name(out.name + ".partial")
    writer = gguf.GGUFWriter(str(tmp), arch)
    for name, field in reader.fields.items():
        if name.startswith("GGUF.") or name in ("general.architecture", "general.file_type"):
            continue
        vtype = field.types[0]
        sub = field.types[-1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, field.contents(), vtype, sub)
    writer.add_file_type(gguf.LlamaFileType.MOSTLY_F16)
    for info in reader.tensors:
        values = gguf.quants.dequantize(info.data, info.tensor_type)
        shape = tuple(int(n) for n in reversed(info.shape))  # ne order -> row-major
        values = np.asarray(values, dtype=np.float32).reshape(shape)
        writer.add_tensor(info.name, values.astype(np.float16) if values.ndim == 2 else values)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    os.replace(tmp, out)


def gguf_bits_per_weight(path: Path) -> float:
    import gguf

    reader = gguf.GGUFReader(str(path))
    nbytes = sum(int(t.n_bytes) for t in reader.tensors)
    return 8 * nbytes / sum(int(t.n_elements) for t in reader.tensors)


def bundle_bits_per_weight(path: Path, params: int) -> float:
    """Bytes of every block that holds weights (not predictors), x 8, over the source's parameters."""
    manifest = json.loads((path / "manifest.json").read_text())
    nbytes = sum(b["data_nbytes"] for b in manifest["blocks"] if b["kind"] != "predictor")
    return 8 * nbytes / params


def edgeflash_perplexity(path: Path, windows: dict[str, list[list[int]]], threads: int) -> dict[str, list[float]]:
    from edgeflash.export.evaluate import perplexity
    from edgeflash.runtime.sources import open_model

    model = open_model(path)
    return {kind: [p.mean_nll * p.tokens, p.tokens] for kind, ws in windows.items()
            for p in [perplexity(model, ws, threads=threads)]}


def llamacpp_perplexity(path: Path, windows_file: Path, threads: int) -> dict[str, list[float]]:
    res = subprocess.run([str(BENCH_PYTHON), "-c", _LLAMA_SCORE, str(path), str(windows_file), str(threads)],
                         capture_output=True, text=True, check=True)
    return json.loads(res.stdout.strip().splitlines()[-1])


def table(results: Path) -> str:
    """Markdown table of the latest score of every (model, file, text) in `results`, scored by edgeflash."""
    latest: dict[tuple[str, str, str, str, str], dict] = {}
    for line in results.read_text().splitlines():
        row = json.loads(line)
        latest[(row["model"], row["quantizer"], row["scheme"], row["text"], row["scored_by"])] = row
    files = sorted({k[:3] for k in latest}, key=lambda k: (k[0], latest_bpw(latest, k)))
    lines = ["| model | file | bits/weight | prose ppl | code ppl | llama.cpp scoring (prose / code) |",
             "|---|---|---|---|---|---|"]
    def ppl(key: tuple[str, str, str], text: str, scorer: str) -> str:
        row = latest.get((*key, text, scorer))
        return f"{row['perplexity']:.3f}" if row else "-"

    for model, quantizer, scheme in files:
        k = (model, quantizer, scheme)
        own = f"{ppl(k, 'prose', 'llama.cpp')} / {ppl(k, 'code', 'llama.cpp')}" if quantizer != "edgeflash" else ""
        lines.append(f"| {model} | {quantizer} {scheme} | {latest_bpw(latest, k):.2f} | "
                     f"{ppl(k, 'prose', 'edgeflash')} | {ppl(k, 'code', 'edgeflash')} | {own} |")
    return "\n".join(lines)


def latest_bpw(latest: dict, key: tuple[str, str, str]) -> float:
    return next(r["bits_per_weight"] for k, r in latest.items() if k[:3] == key)


def main() -> None:
    if "--table" in sys.argv:
        i = sys.argv.index("--table")
        print(table(Path(sys.argv[i + 1]) if len(sys.argv) > i + 1 else RESULTS))
        return
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="model alias or GGUF path (the packaged source)")
    ap.add_argument("--work", type=Path, required=True, help="directory for the F16 GGUF, quantized files, bundles")
    ap.add_argument("--stages", default="gguf,llamacpp,export,score")
    ap.add_argument("--llama", default=",".join(LLAMA_FTYPES), help="llama.cpp types")
    ap.add_argument("--schemes", default=",".join(EF_SCHEMES), help="edgeflash schemes")
    ap.add_argument("--tokens", type=int, default=1024, help="held-out tokens of each text")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--llamacpp-scoring", choices=("all", "f16", "none"), default="all",
                    help="which GGUF files llama.cpp scores as well (all, only the F16 file, none)")
    ap.add_argument("--skip-source", action="store_true",
                    help="score: leave out the F16 file (its scores are already in --out)")
    ap.add_argument("--out", type=Path, default=RESULTS)
    args = ap.parse_args()

    from calib import heldout_windows
    from edgeflash.base.models import resolve_model
    from edgeflash.runtime.sources import open_model

    stages = set(args.stages.split(","))
    source = Path(resolve_model(args.model))
    name = args.model if not Path(args.model).exists() else source.stem
    work = args.work / name
    work.mkdir(parents=True, exist_ok=True)
    f16 = work / "f16.gguf"
    llama_types = [t for t in args.llama.split(",") if t]
    schemes = [s for s in args.schemes.split(",") if s]

    if "gguf" in stages and not f16.exists():
        t0 = time.time()
        write_f16_gguf(source, f16)
        print(f"{f16}: F16 GGUF of {source.name} in {time.time() - t0:.0f} s", flush=True)
    if "llamacpp" in stages:
        for qt in llama_types:
            dst = work / f"llamacpp-{qt}.gguf"
            if dst.exists():
                continue
            t0 = time.time()
            subprocess.run([str(BENCH_PYTHON), "-c", _LLAMA_QUANTIZE, str(f16), str(dst), str(LLAMA_FTYPES[qt]),
                            str(args.threads)], check=True, capture_output=True)
            print(f"{dst}: llama.cpp {qt} in {time.time() - t0:.0f} s", flush=True)
    if "export" in stages:
        for scheme in schemes:
            dst = work / f"edgeflash-{scheme}"
            if dst.exists():
                continue
            t0 = time.time()
            subprocess.run([str(Path(sys.executable).parent / "edgeflash"), "export", str(f16), "-o", str(dst),
                            "--quant", scheme, "--no-neuron-arena", "--predictor-rank", "0", "--eval-tokens", "0",
                            "--quiet", "-t", str(args.threads)], check=True)
            print(f"{dst}: edgeflash {scheme} in {time.time() - t0:.0f} s", flush=True)
    if "score" not in stages:
        return

    source_model = open_model(f16)
    params = sum(int(np.prod(t.shape)) for t in source_model.tensors.values())
    windows = heldout_windows(source_model, args.tokens)
    windows_file = work / "heldout-windows.json"
    windows_file.write_text(json.dumps(windows))
    del source_model
    files: list[tuple[str, str, Path, float]] = [] if args.skip_source else [("source", "F16", f16, math.nan)]
    files += [("llama.cpp", qt, work / f"llamacpp-{qt}.gguf", math.nan) for qt in llama_types]
    files += [("edgeflash", s, work / f"edgeflash-{s}", math.nan) for s in schemes]
    date = datetime.date.today().isoformat()
    command = "python benchmarks/quality/vs_llamacpp.py " + " ".join(sys.argv[1:])
    args.out.parent.mkdir(parents=True, exist_ok=True)
    for quantizer, label, path, _ in files:
        if not path.exists():
            print(f"{path}: missing, not scored", flush=True)
            continue
        bpw = bundle_bits_per_weight(path, params) if path.is_dir() else gguf_bits_per_weight(path)
        scorers = [("edgeflash", lambda p=path: edgeflash_perplexity(p, windows, args.threads))]
        if path.is_file() and (args.llamacpp_scoring == "all" or (args.llamacpp_scoring == "f16" and label == "F16")):
            scorers.append(("llama.cpp", lambda p=path: llamacpp_perplexity(p, windows_file, args.threads)))
        for scorer, fn in scorers:
            t0 = time.time()
            nll = fn()
            for kind, (total, count) in nll.items():
                ppl = math.exp(total / count)
                row = {"benchmark": "quality-vs-llamacpp", "date": date, "model": name, "quantizer": quantizer,
                       "scheme": label, "bits_per_weight": round(bpw, 3), "text": kind, "tokens": int(count),
                       "scored_by": scorer, "perplexity": round(ppl, 4), "command": command}
                with args.out.open("a") as f:
                    f.write(json.dumps(row) + "\n")
                print(f"{name:20s} {quantizer:9s} {label:7s} {bpw:5.2f} bpw  {kind:5s} {scorer:9s} ppl {ppl:9.4f} "
                      f"({time.time() - t0:.0f} s)", flush=True)


if __name__ == "__main__":
    main()
