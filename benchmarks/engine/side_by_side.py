"""edgeflash, llama.cpp and ExecuTorch side by side on the four benchmark models, in one run: decode
tok/s (greedy, 2 threads, 128 tokens after a 512-token prompt), prefill tok/s of that prompt, peak RSS,
and perplexity on the same held-out token ids; edgeflash's ratio to llama.cpp and to the faster peer.

Configuration executorch is the model's 8da4w XNNPACK .pte written by
benchmarks/peers/export_executorch.py (skipped, with the command, while it is missing), run in the
benchmark environment like llama.cpp; "vs faster peer" is against the faster of every llama.cpp and
ExecuTorch run of each round.

Every measurement runs in its own process (so peak RSS is that runtime's alone), interleaved over
rounds (edgeflash, llama.cpp, edgeflash, ...) so load from other processes hits all alike; a
table shows medians over rounds. All runtimes get the same token ids (tokenized once by edgeflash's
tokenizer from the GGUF): the same prompt, the same perplexity windows.

  python benchmarks/engine/side_by_side.py                         # all four models, 3 rounds
  python benchmarks/engine/side_by_side.py --models qwen2.5-coder-0.5b --rounds 5
  python benchmarks/engine/side_by_side.py --configs gguf-q8,bundle-q8 --no-perplexity

Configurations: gguf-q8 (the GGUF as it is, Q8 activations like llama.cpp's), gguf-q8x2 (the
default activations, about 16-bit), gguf-q4_0 (the GGUF with its wider matrices requantized to
q4_0 at load, `edgeflash.load(..., requantize="q4_0")`, Q8 activations), gguf-q3_k (the same with
requantize="q3_k": matrices of a multiple of 256 columns to q3_k, the others to q4_0), bundle-q8 (the bundle from
`edgeflash export --quant q4_0`, or of the scheme --bundle-quant names, see bench_models.py;
--export writes missing ones), llamacpp (llama-cpp-python on the GGUF, from the benchmark
environment: bash benchmarks/peers/setup-env.sh, or --llama-python), llamacpp-passive (the same with OMP_WAIT_POLICY=PASSIVE: its OpenMP threads
sleep instead of spinning between operations, which on a loaded machine runs several times faster,
and slower on a quiet one). Ratios are against the faster of the llama.cpp runs of each round.
Records go to benchmarks/results/side-by-side.jsonl.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]
CONFIGS = ("gguf-q8", "gguf-q8x2", "gguf-q4_0", "gguf-q3_k", "bundle-q8", "llamacpp", "llamacpp-passive", "executorch")
LLAMACPP = ("llamacpp", "llamacpp-passive")
# executorch: the model's 8da4w XNNPACK .pte from benchmarks/peers/export_executorch.py, driven through
# its `forward` method by executorch.runtime in the benchmark environment (see worker_executorch).
PEERS = (*LLAMACPP, "executorch")
PPL_WINDOWS, PPL_TOKENS = 4, 512  # perplexity: this many held-out windows of this many tokens
PROMPT_OFFSET_CHARS = 50_000  # the prompt passage starts here in the held-out text (past front matter)


# ------------------------------------------------------------------------------------------ workers
# A worker runs one configuration in its own process and prints one JSON object. The llama.cpp
# worker runs in the benchmark environment's Python, so it imports nothing from edgeflash.


def _nll(logits, targets) -> float:
    import numpy as np

    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return float((lse - x[np.arange(len(targets)), targets]).sum())


def worker_edgeflash(job: dict) -> dict:
    import edgeflash as ef
    import numpy as np

    model = ef.load(job["path"], threads=job["threads"], activations=job["activations"], context_length=2048,
                    requantize=job.get("requantize"))
    engine = model.engine
    engine.forward(job["prompt"][:8])  # warm-up: weights paged in, scratch grown, threads started
    engine.reset()
    if job["perplexity"]:
        nll, n = 0.0, 0
        for ids in job["windows"]:
            engine.reset()
            logits = engine.forward(ids, all_logits=True)
            nll += _nll(logits[:-1], np.asarray(ids[1:]))
            n += len(ids) - 1
        return {"nll": nll, "tokens": n, "perplexity": math.exp(nll / n)}
    t0 = time.perf_counter()
    logits = engine.forward(job["prompt"])
    prefill_s = time.perf_counter() - t0
    tok = int(np.argmax(logits[-1]))
    out, stamps = [tok], [time.perf_counter()]
    for _ in range(job["decode_tokens"] - 1):
        tok = int(np.argmax(engine.forward([tok])[-1]))
        out.append(tok)
        stamps.append(time.perf_counter())
    return {"prefill_s": prefill_s, "decode_s": stamps[-1] - stamps[0], "generated": out}


def worker_llamacpp(job: dict) -> dict:
    import llama_cpp
    import numpy as np
    from llama_cpp import Llama

    llm = Llama(
        model_path=job["path"],
        n_threads=job["threads"],
        n_threads_batch=job["threads"],
        n_ctx=2048,
        n_batch=512,
        logits_all=job["perplexity"],
        verbose=False,
    )
    llm.eval(job["prompt"][:8])  # warm-up
    llm.reset()
    if job["perplexity"]:
        nll, n = 0.0, 0
        for ids in job["windows"]:
            llm.reset()
            llm.eval(ids)
            nll += _nll(np.asarray(llm.scores[: len(ids) - 1]), np.asarray(ids[1:]))
            n += len(ids) - 1
        return {"nll": nll, "tokens": n, "perplexity": math.exp(nll / n), "llama_cpp": llama_cpp.__version__}
    n_vocab = llm.n_vocab()

    def last_logits():  # the last evaluated token's logits (Llama.eval keeps them only with logits_all)
        return np.ctypeslib.as_array(llama_cpp.llama_get_logits_ith(llm.ctx, -1), shape=(n_vocab,))

    t0 = time.perf_counter()
    llm.eval(job["prompt"])
    prefill_s = time.perf_counter() - t0
    tok = int(np.argmax(last_logits()))
    out, stamps = [tok], [time.perf_counter()]
    for _ in range(job["decode_tokens"] - 1):
        llm.eval([tok])
        tok = int(np.argmax(last_logits()))
        out.append(tok)
        stamps.append(time.perf_counter())
    return {
        "prefill_s": prefill_s,
        "decode_s": stamps[-1] - stamps[0],
        "generated": out,
        "llama_cpp": llama_cpp.__version__,
    }


def worker_executorch(job: dict) -> dict:
    """The .pte's `forward(tokens, start_pos) -> last position's logits` through executorch.runtime.

    The same loop as the other workers drives it (prompt ids in, argmax out), so all three pay the
    same Python overhead per token; run_executorch.py times ExecuTorch's own C++ TextLLMRunner.
    The export returns the last position's logits only, so perplexity feeds one token per call
    (exact teacher forcing at decode speed).
    """
    import numpy as np

    sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
    from run_executorch import ForwardMethod, log_softmax_nll, register_custom_ops, set_threads

    register_custom_ops()
    threads = set_threads(job["threads"])
    fwd = ForwardMethod(job["path"])
    # The longest chunk `forward` takes: export.max_seq_length - 1 (the export's own metadata method).
    chunk = int(fwd.method_value("get_max_seq_len")) - 1
    fwd(job["prompt"][:8], 0)  # warm-up: program loaded, XNNPACK weights packed, threads started
    info = {"executorch_threads": threads, "max_chunk": chunk}
    if job["perplexity"]:
        nll, n = 0.0, 0
        for ids in job["windows"]:
            for pos in range(len(ids) - 1):
                nll += log_softmax_nll(fwd([ids[pos]], pos), ids[pos + 1])
                n += 1
        return {"nll": nll, "tokens": n, "perplexity": math.exp(nll / n), **info}
    prompt = job["prompt"]
    t0 = time.perf_counter()
    for i in range(0, len(prompt), chunk):
        logits = fwd(prompt[i : i + chunk], i)
    prefill_s = time.perf_counter() - t0
    pos = len(prompt)
    tok = int(np.argmax(logits))
    out, stamps = [tok], [time.perf_counter()]
    for _ in range(job["decode_tokens"] - 1):
        tok = int(np.argmax(fwd([tok], pos)))
        pos += 1
        out.append(tok)
        stamps.append(time.perf_counter())
    return {"prefill_s": prefill_s, "decode_s": stamps[-1] - stamps[0], "generated": out, **info}


def executorch_job(job: dict) -> dict | None:
    """The job with the model's ExecuTorch export in place of its GGUF (None, with the reason, if none)."""
    from bench_models import MODELS, gguf_path

    name = next((m for m in MODELS if str(gguf_path(m)) == job["path"]), None)
    pte = None
    if name is not None:
        sys.path.insert(0, str(REPO / "benchmarks" / "peers"))
        from models import get_model

        pte = get_model(name).pte_path
    if pte is None or not pte.is_file():
        print(f"[executorch skipped: no .pte for {name or job['path']}; run "
              f"benchmarks/peers/export_executorch.py --model {name or 'MODEL'} in the benchmark venv]",
              file=sys.stderr)
        return None
    return {**job, "path": str(pte)}


WORKERS = {"llamacpp": worker_llamacpp, "executorch": worker_executorch, "edgeflash": worker_edgeflash}


def run_worker(kind: str, job_file: Path) -> None:
    job = json.loads(job_file.read_text())
    result = WORKERS[kind](job)
    result["peak_rss_mb"] = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    result["loadavg"] = os.getloadavg()[0]
    print(json.dumps(result))


# ------------------------------------------------------------------------------------------ driver


def token_ids(name: str, gguf: Path, prompt_tokens: int) -> dict:
    """The prompt and the perplexity windows as token ids of the model's tokenizer (cached)."""
    from bench_models import BENCH_OUT

    cache = BENCH_OUT / "side-by-side" / f"{name}-ids-{prompt_tokens}.json"
    if cache.is_file():
        return json.loads(cache.read_text())
    from edgeflash.export.corpus import heldout_windows
    from edgeflash.runtime.sources import open_model

    tok = open_model(gguf).tokenizer
    prompt = tok.encode(
        heldout_windows(1, chars_per_window=8 * prompt_tokens, offset_chars=PROMPT_OFFSET_CHARS)[0]
    )
    if len(prompt) < prompt_tokens:
        raise SystemExit(f"{name}: the held-out passage has only {len(prompt)} tokens")
    windows = [
        tok.encode(w)[:PPL_TOKENS] for w in heldout_windows(PPL_WINDOWS, chars_per_window=6 * PPL_TOKENS)
    ]
    ids = {"prompt": prompt[:prompt_tokens], "windows": windows}
    cache.parent.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(ids))
    return ids


def last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def run_job(config: str, job: dict, args) -> dict | None:
    peer = config in PEERS
    if config == "executorch" and (job := executorch_job(job)) is None:
        return None
    python = args.llama_python if peer else sys.executable
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE"} if config == "llamacpp-passive" else None
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(job, f)
    try:
        done = subprocess.run(
            [
                python,
                str(Path(__file__)),
                "--worker",
                ("executorch" if config == "executorch" else "llamacpp") if peer else "edgeflash",
                f.name,
            ],
            capture_output=True,
            check=False,
            text=True,
            timeout=3600,
            env=env,
        )
    finally:
        os.unlink(f.name)
    if done.returncode != 0:
        print(
            f"[{config} failed: {last_line(done.stderr) or done.returncode}]",
            file=sys.stderr,
        )
        return None
    return json.loads(done.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--worker", nargs=2, metavar=("KIND", "JOB"), help=argparse.SUPPRESS)
    p.add_argument(
        "--models", nargs="+", default=None, help="aliases or GGUF paths (default: the four models)"
    )
    p.add_argument(
        "--configs", default=",".join(CONFIGS), help=f"comma-separated subset of {', '.join(CONFIGS)}"
    )
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--prompt-tokens", type=int, default=512)
    p.add_argument("--decode-tokens", type=int, default=128)
    p.add_argument("--no-perplexity", action="store_true")
    p.add_argument("--export", action="store_true", help="export missing bundles first (heavy for 1.5B)")
    p.add_argument(
        "--bundle-quant",
        default="q4_0",
        metavar="SCHEME",
        help="the --quant scheme(s) of bundle-q8's bundles, comma-separated (default q4_0; e.g. "
        "keep-arena,keep; SCHEME+dense: exported without a neuron arena); other than q4_0 the scheme "
        "is named in the config column",
    )
    p.add_argument(
        "--llama-python",
        default=str(REPO / ".venv-bench" / "bin" / "python"),
        help="the Python with llama-cpp-python and ExecuTorch (default: .venv-bench of this checkout)",
    )
    p.add_argument("--no-save", action="store_true")
    args = p.parse_args(argv)
    if args.worker:
        run_worker(args.worker[0], Path(args.worker[1]))
        return 0
    sys.path.insert(0, str(HERE))
    from bench_models import MODELS, ensure_bundle, gguf_path

    configs = args.configs.split(",")
    for c in configs:
        if c not in CONFIGS:
            p.error(f"unknown configuration {c!r}; choose from {', '.join(CONFIGS)}")
    if any(c in PEERS for c in configs) and not Path(args.llama_python).exists():
        p.error(
            f"llama.cpp runs in the benchmark environment: {args.llama_python} is missing "
            "(bash benchmarks/peers/setup-env.sh, or --llama-python PATH)"
        )
    models = args.models or list(MODELS)
    jobs: dict[tuple[str, str], dict] = {}
    for name in models:
        gguf = gguf_path(name)
        ids = token_ids(name, gguf, args.prompt_tokens)
        # one configuration per bundle scheme (--bundle-quant A,B): "bundle-q8 SCHEME" unless q4_0
        runs = [(c, q) for c in configs for q in (args.bundle_quant.split(",") if c == "bundle-q8" else [None])]
        for c, quant in runs:
            path, label = gguf, c
            if quant is not None:
                path = ensure_bundle(name, quant, export=args.export)
                if path is None:
                    print(f"[{name}: no {quant} bundle, bundle-q8 skipped; --export writes it]", file=sys.stderr)
                    continue
                label = c if quant == "q4_0" else f"bundle-q8 {quant}"
            jobs[(name, label)] = {
                "path": str(path),
                "threads": args.threads,
                "activations": "q8x2" if c == "gguf-q8x2" else "q8",
                "requantize": {"gguf-q4_0": "q4_0", "gguf-q3_k": "q3_k"}.get(c),
                "prompt": ids["prompt"],
                "windows": ids["windows"],
                "decode_tokens": args.decode_tokens,
                "perplexity": False,
            }
    speed: dict[tuple[str, str], list[dict]] = {k: [] for k in jobs}
    for r in range(args.rounds):
        for key, job in jobs.items():
            res = run_job(key[1], job, args)
            if res is not None:
                speed[key].append(res)
                print(
                    f"round {r} {key[0]} {key[1]}: "
                    f"prefill {len(job['prompt']) / res['prefill_s']:.1f} tok/s, "
                    f"decode {(len(res['generated']) - 1) / res['decode_s']:.1f} tok/s, "
                    f"load {res['loadavg']:.1f}",
                    file=sys.stderr,
                    flush=True,
                )
    ppl: dict[tuple[str, str], dict] = {}
    if not args.no_perplexity:
        for key, job in jobs.items():
            if key[1] == "llamacpp-passive":  # the same numbers as llamacpp
                continue
            res = run_job(key[1], {**job, "perplexity": True}, args)
            if res is not None:
                ppl[key] = res
                print(
                    f"{key[0]} {key[1]}: perplexity {res['perplexity']:.3f} over {res['tokens']} tokens",
                    file=sys.stderr,
                    flush=True,
                )
    rows = summarize(jobs, speed, ppl)
    print_table(rows, args)
    if not args.no_save and rows:
        save(rows, args, argv)
    return 0


def summarize(jobs, speed, ppl) -> list[dict]:
    rows = []
    for (name, config), runs in speed.items():
        if not runs:
            continue
        n_prompt = len(jobs[(name, config)]["prompt"])
        decode = [(len(r["generated"]) - 1) / r["decode_s"] for r in runs]
        prefill = [n_prompt / r["prefill_s"] for r in runs]
        rows.append(
            {
                "model": name,
                "config": config,
                "rounds": len(runs),
                "decode_tok_s": statistics.median(decode),
                "decode_low": min(decode),
                "decode_high": max(decode),
                "prefill_tok_s": statistics.median(prefill),
                "peak_rss_mb": max(r["peak_rss_mb"] for r in runs),
                "perplexity": ppl.get((name, config), {}).get("perplexity"),
                "generated": runs[0]["generated"],
                "loadavg": statistics.median(r["loadavg"] for r in runs),
                "per_round": {"decode": decode, "prefill": prefill},
            }
        )
    by_key = {(r["model"], r["config"]): r for r in rows}
    for r in rows:
        # Ratios to the faster llama.cpp run of each round (rounds are interleaved), and to the faster
        # of every peer run (llama.cpp and ExecuTorch) of each round.
        for suffix, group in (("llamacpp", LLAMACPP), ("peer", PEERS)):
            peers = [by_key[(r["model"], c)] for c in group if (r["model"], c) in by_key]
            if not peers or r["config"] in PEERS:
                continue
            for what in ("decode", "prefill"):
                k = min([len(r["per_round"][what])] + [len(p["per_round"][what]) for p in peers])
                best = [max(p["per_round"][what][i] for p in peers) for i in range(k)]
                ratios = [a / b for a, b in zip(r["per_round"][what][:k], best)]
                if ratios:
                    r[f"{what}_vs_{suffix}"] = statistics.median(ratios)
                    r[f"{what}_vs_{suffix}_range"] = (min(ratios), max(ratios))
        llama = next((by_key[(r["model"], c)] for c in LLAMACPP if (r["model"], c) in by_key), None)
        if llama is not None and r["config"] not in LLAMACPP:  # ExecuTorch's greedy tokens too
            same = 0
            for a, b in zip(r["generated"], llama["generated"]):
                if a != b:
                    break
                same += 1
            r["same_prefix_as_llamacpp"] = same
    return rows


def print_table(rows: list[dict], args) -> None:
    print(
        f"\n{args.threads} threads, {args.prompt_tokens}-token prompt, {args.decode_tokens} greedy tokens, "
        f"medians of "
        f"{args.rounds} interleaved rounds\n"
    )
    print(
        "| model | config | decode tok/s | vs faster llama.cpp | vs faster peer | prefill tok/s | "
        "vs faster llama.cpp | vs faster peer | perplexity | peak RSS MB | same tokens as llama.cpp | load |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")

    def ratio(r: dict, what: str) -> str:
        if what not in r:
            return "-"
        lo, hi = r[f"{what}_range"]
        return f"{r[what]:.2f}x ({lo:.2f}-{hi:.2f})"

    for r in rows:
        ppl = f"{r['perplexity']:.3f}" if r["perplexity"] is not None else "-"
        same = r.get("same_prefix_as_llamacpp", "-")
        print(
            f"| {r['model']} | {r['config']} | {r['decode_tok_s']:.1f} | {ratio(r, 'decode_vs_llamacpp')} | "
            f"{ratio(r, 'decode_vs_peer')} | {r['prefill_tok_s']:.1f} | {ratio(r, 'prefill_vs_llamacpp')} | "
            f"{ratio(r, 'prefill_vs_peer')} | {ppl} | {r['peak_rss_mb']:.0f} | {same} | {r['loadavg']:.1f} |"
        )


def save(rows: list[dict], args, argv) -> None:
    sys.path.insert(0, str(REPO / "benchmarks" / "results"))
    from record import append_results, new_run_id

    run = new_run_id()
    command = " ".join(["side_by_side.py", *(argv if argv is not None else sys.argv[1:])])
    recs = [
        {
            "run": run,
            "metric": "conditions",
            "value": f"{args.threads} threads, {args.prompt_tokens}-token "
            f"prompt, {args.decode_tokens} greedy tokens, {args.rounds} interleaved rounds",
            "command": command,
        }
    ]
    for r in rows:
        base = {
            "run": run,
            "model": r["model"],
            "config": r["config"],
            "rounds": r["rounds"],
            "command": command,
        }
        recs.append(
            {
                **base,
                "metric": "decode_tok_s",
                "value": round(r["decode_tok_s"], 2),
                "low": round(r["decode_low"], 2),
                "high": round(r["decode_high"], 2),
                "unit": "tok/s",
            }
        )
        recs.append(
            {**base, "metric": "prefill_tok_s", "value": round(r["prefill_tok_s"], 2), "unit": "tok/s"}
        )
        recs.append({**base, "metric": "peak_rss_mb", "value": round(r["peak_rss_mb"], 1), "unit": "MiB"})
        recs.append({**base, "metric": "loadavg_1m", "value": round(r["loadavg"], 2)})
        if r["perplexity"] is not None:
            recs.append(
                {
                    **base,
                    "metric": "perplexity",
                    "value": round(r["perplexity"], 4),
                    "notes": f"{PPL_WINDOWS} held-out windows of {PPL_TOKENS} token ids, the same for every "
                    "runtime",
                }
            )
        for what in ("decode_vs_llamacpp", "prefill_vs_llamacpp", "decode_vs_peer", "prefill_vs_peer"):
            if what in r:
                lo, hi = r[f"{what}_range"]
                recs.append(
                    {
                        **base,
                        "metric": what,
                        "value": round(r[what], 3),
                        "low": round(lo, 3),
                        "high": round(hi, 3),
                        "unit": "x",
                    }
                )
        if "same_prefix_as_llamacpp" in r:
            recs.append({**base, "metric": "same_prefix_as_llamacpp", "value": r["same_prefix_as_llamacpp"]})
    append_results("side-by-side", recs)
    print("\nrecords appended to benchmarks/results/side-by-side.jsonl")


if __name__ == "__main__":
    raise SystemExit(main())
