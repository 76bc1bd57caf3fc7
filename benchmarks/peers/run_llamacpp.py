"""llama.cpp (llama-cpp-python 0.3.36, built from source) on the GGUF file: one workload, one JSON line.

  python benchmarks/peers/run_llamacpp.py --model gemma3-270m --prompt-tokens 500 \
      --max-new-tokens 128 --threads 2 --repeat 3
  python benchmarks/peers/run_llamacpp.py --model gemma3-270m --perplexity
"""

from __future__ import annotations

import math
import time

import numpy as np

import harness
from workloads import perplexity_windows

N_CTX = 2048


def load(w: harness.Workload, logits_all: bool):
    from llama_cpp import Llama

    return Llama(model_path=str(w.model.gguf_path()), n_threads=w.threads, n_threads_batch=w.threads,
                 n_ctx=N_CTX, logits_all=logits_all, verbose=False)


def own_stats(llm) -> dict:
    """llama.cpp's own counters for the last generation (prompt eval and per-token eval)."""
    import llama_cpp

    d = llama_cpp.llama_perf_context(llm.ctx)
    stats = {"t_p_eval_ms": round(d.t_p_eval_ms, 2), "n_p_eval": d.n_p_eval,
             "t_eval_ms": round(d.t_eval_ms, 2), "n_eval": d.n_eval}
    if d.t_p_eval_ms > 0:
        stats["prefill_tok_s"] = round(d.n_p_eval / d.t_p_eval_ms * 1000, 2)
    if d.t_eval_ms > 0:
        stats["decode_tok_s"] = round(d.n_eval / d.t_eval_ms * 1000, 2)
    return stats


def run_generate(w: harness.Workload) -> dict:
    import llama_cpp

    llm = load(w, logits_all=False)
    vocab = llama_cpp.llama_model_get_vocab(llm.model)
    # add_bos=True means "as the model's metadata says": Gemma gets <bos>, SmolLM2 does not.
    prompt_ids = llm.tokenize(w.prompt.text.encode("utf-8"), add_bos=True, special=True)
    warm = llm.tokenize(harness.WARMUP_TEXT.encode("utf-8"), add_bos=True, special=True)
    for n, _tok in enumerate(llm.generate(warm, temp=0.0)):
        if n >= 1:
            break
    clock = harness.TokenClock()
    repeats = []
    for i in range(w.repeat):
        llm.reset()  # n_tokens = 0: no KV prefix reuse between repeats
        llama_cpp.llama_perf_context_reset(llm.ctx)
        ids: list[int] = []
        clock.start()
        for tok in llm.generate(prompt_ids, temp=0.0, top_k=1, top_p=1.0, min_p=0.0, repeat_penalty=1.0):
            clock.tick()
            ids.append(tok)
            if len(ids) >= w.max_new_tokens or llama_cpp.llama_vocab_is_eog(vocab, tok):
                break
        repeats.append(harness.Repeat(
            prompt_tokens=len(prompt_ids), generated_tokens=len(ids), ttft_s=clock.ttft_s, decode_s=clock.decode_s,
            token_ids=ids, text=llm.detokenize(ids).decode("utf-8", errors="replace"), peer_stats=own_stats(llm)))
        harness.log(f"llama.cpp {w.model.name} repeat {i}: prefill {repeats[-1].prefill_tok_s:.1f} tok/s, "
                    f"decode {repeats[-1].decode_tok_s:.1f} tok/s")
    return harness.generation_report("llama.cpp", w, repeats, {
        "prompt_ids": prompt_ids,
        "prompt_ids_match_reference": prompt_ids == w.prompt.reference_ids if w.prompt.reference_ids else None,
        "config": {"llama_cpp_python": llama_cpp.__version__, "n_ctx": N_CTX, "gguf": str(w.model.gguf_path())},
    })


def log_softmax_nll(logits: np.ndarray, targets: np.ndarray) -> float:
    """Sum over rows of -log softmax(logits)[target]; logits [T, vocab] float32."""
    x = logits.astype(np.float64)
    m = x.max(axis=1, keepdims=True)
    lse = m[:, 0] + np.log(np.exp(x - m).sum(axis=1))
    return float((lse - x[np.arange(len(targets)), targets]).sum())


def run_perplexity(w: harness.Workload) -> dict:
    import llama_cpp

    llm = load(w, logits_all=True)  # the scores of every position, not just the last
    windows = perplexity_windows(w.model)
    nll, n = 0.0, 0
    t0 = time.perf_counter()
    for ids in windows:
        llm.reset()
        llm.eval(ids)
        logits = np.asarray(llm.scores[: len(ids) - 1])  # [T-1, vocab]
        nll += log_softmax_nll(logits, np.asarray(ids[1:]))
        n += len(ids) - 1
    harness.log(f"llama.cpp {w.model.name} perplexity {math.exp(nll / n):.3f} over {n} tokens")
    return harness.perplexity_report("llama.cpp", w, nll, n, len(windows), {
        "seconds": round(time.perf_counter() - t0, 1), "llama_cpp_python": llama_cpp.__version__})


def main() -> None:
    args = harness.build_parser("llama.cpp").parse_args()
    w = harness.resolve_workload(args)
    report = run_perplexity(w) if w.perplexity else run_generate(w)
    harness.emit(report, args.out)


if __name__ == "__main__":
    main()
