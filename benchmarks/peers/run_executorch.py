"""ExecuTorch 1.5.1 (its own LLM export, XNNPACK, 8da4w) with its TextLLMRunner: one workload, one JSON line.

  python benchmarks/peers/run_executorch.py --model smollm2-135m --prompt-tokens 400 \
      --max-new-tokens 128 --threads 2 --repeat 3
  python benchmarks/peers/run_executorch.py --model gemma3-270m --perplexity

Generation is timed on TextLLMRunner (the peer's own C++ generation loop) from outside, through its
token callback, and its own Stats are recorded too. The runner reports text only, so the token ids
come from a second greedy pass driving the same .pte's `forward` method with executorch.runtime,
after the runner's peak RSS has been read; that pass also checks that both produce the same text.
Perplexity feeds the shared held-out ids one position at a time through `forward` (the export
returns the last position's logits only), which is exact teacher forcing.
"""

from __future__ import annotations

import json
import math
import time

import numpy as np

import harness
from workloads import perplexity_windows

# export_executorch.py exports with max_seq_length=512: `forward` accepts 1..511 tokens per call.
MAX_PREFILL_CHUNK = 511


def register_custom_ops() -> None:
    # Registers the llama:: ops (custom SDPA, KV-cache update); loading `forward` fails without it.
    import executorch.extension.llm.custom_ops.custom_ops  # noqa: F401
    # Registers the quantized_decomposed:: kernels: the Qwen2.5 recipe's 8-bit embedding
    # (embedding_byte) is not delegated to XNNPACK, and `forward` fails to load without them.
    import executorch.kernels.quantized  # noqa: F401


def set_threads(n: int) -> int:
    # The runner and executorch.runtime share libexecutorch_threadpool.so: one pool for both.
    from executorch.extension.pybindings import portable_lib

    portable_lib._unsafe_reset_threadpool(n)
    return portable_lib._threadpool_get_thread_count()


def require_export(w: harness.Workload) -> None:
    if not w.model.pte_path.exists():
        raise SystemExit(f"{w.model.pte_path}: missing, run `python benchmarks/peers/export_executorch.py "
                         f"--model {w.model.name}` first")


def stats_to_dict(s) -> dict:
    d = {k: getattr(s, k) for k in ("inference_start_ms", "token_encode_end_ms", "prompt_eval_end_ms",
                                    "first_token_ms", "inference_end_ms", "aggregate_sampling_time_ms",
                                    "num_prompt_tokens", "num_generated_tokens", "model_load_start_ms",
                                    "model_load_end_ms")}
    # The runner's own report: prompt eval from inference start, generation after prompt eval.
    prompt_ms = d["prompt_eval_end_ms"] - d["inference_start_ms"]
    gen_ms = d["inference_end_ms"] - d["prompt_eval_end_ms"]
    if prompt_ms > 0:
        d["prefill_tok_s"] = round(d["num_prompt_tokens"] / prompt_ms * 1000, 2)
    if gen_ms > 0:
        d["decode_tok_s"] = round(d["num_generated_tokens"] / gen_ms * 1000, 2)
    return d


class ForwardMethod:
    """The .pte's `forward(tokens [1, T], input_pos [1]) -> logits [1, vocab]` via executorch.runtime."""

    def __init__(self, pte_path):
        import torch
        from executorch.runtime import Runtime

        self.torch = torch
        self.program = Runtime.get().load_program(str(pte_path))
        self.method = self.program.load_method("forward")

    def method_value(self, name: str):
        """One of the export's constant metadata methods, e.g. get_max_seq_len."""
        return self.program.load_method(name).execute([])[0]

    def __call__(self, ids: list[int], start_pos: int) -> np.ndarray:
        torch = self.torch
        tokens = torch.tensor([ids], dtype=torch.long)  # [1, T]
        pos = torch.tensor([start_pos], dtype=torch.long)  # [1]
        return self.method.execute((tokens, pos))[0].reshape(-1).float().numpy()  # [vocab]


def greedy_with_forward(fwd: ForwardMethod, prompt_ids: list[int], max_new: int, stop: set[int],
                        chunk: int) -> tuple[list[int], float]:
    """Greedy ids from `forward`, prefill in chunks of at most `chunk`; returns (ids, decode tok/s)."""
    pos = 0
    logits = None
    for i in range(0, len(prompt_ids), chunk):
        part = prompt_ids[i:i + chunk]
        logits = fwd(part, pos)
        pos += len(part)
    out = [int(np.argmax(logits))]
    t0 = time.perf_counter()
    while len(out) < max_new and out[-1] not in stop:
        logits = fwd([out[-1]], pos)
        pos += 1
        out.append(int(np.argmax(logits)))
    dt = time.perf_counter() - t0
    return out, (len(out) - 1) / dt if dt > 0 else float("nan")


def run_generate(w: harness.Workload) -> dict:
    from executorch.extension.llm.runner import GenerationConfig, TextLLMRunner

    from hf_models import eos_ids, load_tokenizer

    require_export(w)
    register_custom_ops()
    threads = set_threads(w.threads)
    runner = TextLLMRunner(str(w.model.pte_path), str(w.model.tokenizer_json))
    # BOS exactly when the model's own tokenizer adds it, as llama.cpp and transformers do
    # (recorded at export, so no second tokenizer inflates this process's peak RSS).
    fmt = json.loads((w.model.executorch_dir / "prompt_format.json").read_text())
    config = GenerationConfig(echo=False, max_new_tokens=w.max_new_tokens, temperature=0.0,
                              num_bos=1 if fmt["adds_bos"] else 0, num_eos=0)
    # The runner loads the program lazily on its first generate(): warm up once so load time is
    # not counted as time to first token (the other peers load in their constructors).
    runner.generate(harness.WARMUP_TEXT, GenerationConfig(echo=False, max_new_tokens=2, temperature=0.0,
                                                          num_bos=config.num_bos), lambda _piece: None)
    clock = harness.TokenClock()
    repeats = []
    for i in range(w.repeat):
        runner.reset()  # the runner keeps its position between calls (for chat): start each repeat at 0
        pieces: list[str] = []
        stats: list = []

        def on_token(piece: str) -> None:
            clock.tick()
            pieces.append(piece)

        clock.start()
        runner.generate(w.prompt.text, config, on_token, lambda s: stats.append(stats_to_dict(s)))
        own = stats[-1] if stats else {}
        repeats.append(harness.Repeat(
            prompt_tokens=own.get("num_prompt_tokens", -1), generated_tokens=len(pieces), ttft_s=clock.ttft_s,
            decode_s=clock.decode_s, token_ids=[], text="".join(pieces), peer_stats=own))
        harness.log(f"executorch {w.model.name} repeat {i}: prefill {repeats[-1].prefill_tok_s:.1f} tok/s, "
                    f"decode {repeats[-1].decode_tok_s:.1f} tok/s")
    peak = harness.peak_rss_bytes()

    # Token ids: the same greedy decode through `forward`, from the shared reference prompt ids.
    tok = load_tokenizer(w.model)
    prompt_ids = tok.encode(w.prompt.text)
    fwd = ForwardMethod(w.model.pte_path)
    ids, loop_tok_s = greedy_with_forward(fwd, prompt_ids, w.max_new_tokens, set(eos_ids(w.model, tok)),
                                          MAX_PREFILL_CHUNK)
    forward_text = tok.decode(ids)
    for r in repeats:
        r.token_ids = ids  # the runner gives text only; see forward_text_matches_runner
    return harness.generation_report("executorch", w, repeats, {
        "prompt_ids": prompt_ids,
        # The runner tokenizes the text itself; its count must equal the reference ids' (BOS included).
        "runner_prompt_tokens_match_reference": repeats[0].prompt_tokens == len(prompt_ids),
        "forward_token_ids": ids,
        "forward_text_matches_runner": forward_text == repeats[0].text,
        "runner_texts_identical": all(r.text == repeats[0].text for r in repeats),
        "forward_loop_decode_tok_s": round(loop_tok_s, 2),
        "config": {"pte": str(w.model.pte_path), "pte_bytes": w.model.pte_path.stat().st_size,
                   "threadpool_threads": threads, "num_bos": config.num_bos},
    }, peak_rss=peak)


def log_softmax_nll(logits: np.ndarray, target: int) -> float:
    x = logits.astype(np.float64)
    m = x.max()
    return float(m + np.log(np.exp(x - m).sum()) - x[target])


def run_perplexity(w: harness.Workload) -> dict:
    require_export(w)
    register_custom_ops()
    threads = set_threads(w.threads)
    fwd = ForwardMethod(w.model.pte_path)
    windows = perplexity_windows(w.model)
    nll, n = 0.0, 0
    t0 = time.perf_counter()
    for ids in windows:
        for pos in range(len(ids) - 1):
            nll += log_softmax_nll(fwd([ids[pos]], pos), ids[pos + 1])
            n += 1
    harness.log(f"executorch {w.model.name} perplexity {math.exp(nll / n):.3f} over {n} tokens")
    return harness.perplexity_report("executorch", w, nll, n, len(windows), {
        "seconds": round(time.perf_counter() - t0, 1), "pte": str(w.model.pte_path),
        "threadpool_threads": threads, "method": "forward one position at a time (KV cache), exact"})


def main() -> None:
    args = harness.build_parser("executorch").parse_args()
    w = harness.resolve_workload(args)
    # The runner prints the generated text and its own stats line on stdout: keep stdout for JSON.
    with harness.native_stdout_to_stderr():
        report = run_perplexity(w) if w.perplexity else run_generate(w)
    harness.emit(report, args.out)


if __name__ == "__main__":
    main()
