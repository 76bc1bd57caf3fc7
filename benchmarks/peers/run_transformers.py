"""transformers (fp32, eager attention) as the numerical reference peer: one workload, one JSON line.

  python benchmarks/peers/run_transformers.py --model smollm2-135m --prompt-tokens 400 \
      --max-new-tokens 128 --threads 2 --repeat 3
  python benchmarks/peers/run_transformers.py --model gemma3-270m --perplexity
"""

from __future__ import annotations

import math
import time

import harness
from hf_models import eos_ids, load_hf
from workloads import perplexity_windows


def greedy_once(model, input_ids, max_new: int, stop: set[int], clock: harness.TokenClock) -> list[int]:
    import torch

    out_ids: list[int] = []
    clock.start()
    # logits_to_keep=1: the prompt's other positions never need the [T, vocab] head output.
    out = model(input_ids=input_ids, use_cache=True, logits_to_keep=1)
    past = out.past_key_values
    tok = int(out.logits[0, -1].argmax())
    clock.tick()
    out_ids.append(tok)
    while len(out_ids) < max_new and tok not in stop:
        out = model(input_ids=torch.tensor([[tok]]), past_key_values=past, use_cache=True)
        past = out.past_key_values
        tok = int(out.logits[0, -1].argmax())
        clock.tick()
        out_ids.append(tok)
    return out_ids


def run_generate(w: harness.Workload) -> dict:
    import torch

    model, tok = load_hf(w.model)
    stop = set(eos_ids(w.model, tok))
    input_ids = tok(w.prompt.text, return_tensors="pt").input_ids  # [1, T], BOS per the tokenizer
    repeats = []
    clock = harness.TokenClock()
    with torch.inference_mode():
        greedy_once(model, tok(harness.WARMUP_TEXT, return_tensors="pt").input_ids, 2, stop, clock)
        for i in range(w.repeat):
            ids = greedy_once(model, input_ids, w.max_new_tokens, stop, clock)
            repeats.append(harness.Repeat(
                prompt_tokens=input_ids.shape[1], generated_tokens=len(ids), ttft_s=clock.ttft_s,
                decode_s=clock.decode_s, token_ids=ids, text=tok.decode(ids)))
            harness.log(f"transformers {w.model.name} repeat {i}: prefill {repeats[-1].prefill_tok_s:.1f} tok/s, "
                        f"decode {repeats[-1].decode_tok_s:.1f} tok/s")
    return harness.generation_report("transformers", w, repeats, {
        "prompt_ids": input_ids[0].tolist(),
        "config": {"dtype": "float32", "attn_implementation": model.config._attn_implementation,
                   "transformers": __import__("transformers").__version__, "torch": torch.__version__},
    })


def run_perplexity(w: harness.Workload) -> dict:
    import torch

    model, _ = load_hf(w.model)
    windows = perplexity_windows(w.model)
    nll, n = 0.0, 0
    t0 = time.perf_counter()
    with torch.inference_mode():
        for ids in windows:
            x = torch.tensor([ids])  # [1, T]
            logits = model(input_ids=x).logits[0, :-1].float()  # [T-1, vocab]
            nll += float(torch.nn.functional.cross_entropy(logits, x[0, 1:], reduction="sum"))
            n += len(ids) - 1
    harness.log(f"transformers {w.model.name} perplexity {math.exp(nll / n):.3f} over {n} tokens")
    return harness.perplexity_report("transformers", w, nll, n, len(windows),
                                     {"seconds": round(time.perf_counter() - t0, 1), "dtype": "float32"})


def main() -> None:
    args = harness.build_parser("transformers").parse_args()
    w = harness.resolve_workload(args)
    import torch

    torch.set_num_threads(w.threads)
    report = run_perplexity(w) if w.perplexity else run_generate(w)
    harness.emit(report, args.out)


if __name__ == "__main__":
    main()
