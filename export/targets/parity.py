"""Parity of an export against the reference runtime on the same weights.

The reference runs `PreparedModel.reference_source()`: the float32 values the target computes
with, so every difference measured here comes from the target's arithmetic, not from the
weights. A target whose kernels round more than the weights (XNNPACK quantizes the input of each
4/8-bit linear layer to int8 per token) gives the reference the same rounding through
`reference_ops`; without it the comparison measures what that rounding costs.

Per prompt: teacher-forced logits after every prompt token (the decode method, one token at a
time), the prefill method's logits after the whole prompt, and the greedy continuation of
`new_tokens` tokens from each side.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np
from edgeflash.runtime.source import ModelSource


@dataclass
class PromptParity:
    prompt_tokens: int
    max_abs_error: float  # over every teacher-forced logit of the prompt
    relative_error: float  # max_abs_error / max |reference logit|
    prefill_max_abs_error: float  # logits after the whole prompt through the prefill method
    top1_agreement: float  # fraction of prompt positions with the same argmax
    same_continuation: bool  # greedy tokens identical
    common_prefix: int  # leading greedy tokens identical


def prompts_from_heldout(tokenizer, count: int, tokens: int) -> list[list[int]]:
    """`count` deterministic prompts of `tokens` tokens (BOS included where the model adds it)
    from the held-out Shakespeare plays."""
    from edgeflash.export.corpus import heldout_windows

    return [tokenizer.encode(text)[:tokens] for text in heldout_windows(count, chars_per_window=600)]


def reference_greedy(engine, prompt: list[int], new_tokens: int) -> tuple[np.ndarray, list[int]]:
    """(teacher-forced logits [len(prompt), vocab], greedy continuation) from the reference."""
    engine.reset()
    logits = engine.forward(prompt, all_logits=True)
    out = [int(np.argmax(logits[-1]))]
    while len(out) < new_tokens:
        out.append(int(np.argmax(engine.forward([out[-1]])[-1])))
    return logits, out


def compare(runner, reference: ModelSource, prompts: list[list[int]], new_tokens: int = 32,
            reference_cache: dict | None = None, ops=None) -> list[PromptParity]:
    """Parity of `runner` (a TargetRunner) against the reference runtime on `reference`.
    `reference_cache` (a dict kept by the caller) saves the reference's results across exports
    of the same weights; `ops` are the reference's ops (None = plain float32)."""
    from edgeflash.runtime.reference import ReferenceEngine

    engine = None
    results = []
    for i, prompt in enumerate(prompts):
        key = (i, tuple(prompt), new_tokens)
        if reference_cache is not None and key in reference_cache:
            want_logits, want_tokens = reference_cache[key]
        else:
            engine = engine or ReferenceEngine(reference, ops=ops)
            want_logits, want_tokens = reference_greedy(engine, prompt, new_tokens)
            if reference_cache is not None:
                reference_cache[key] = (want_logits, want_tokens)
        runner.reset()
        got = runner.logits_each(prompt)  # [T, vocab]
        runner.reset()
        prefill = runner.feed(prompt)
        got_tokens = runner.generate(prompt, new_tokens, stop_ids=set()).tokens
        err = float(np.abs(got - want_logits).max())
        common = next((j for j, (a, b) in enumerate(zip(got_tokens, want_tokens)) if a != b), len(want_tokens))
        results.append(PromptParity(
            prompt_tokens=len(prompt), max_abs_error=err,
            relative_error=err / float(np.abs(want_logits).max()),
            prefill_max_abs_error=float(np.abs(prefill - want_logits[-1]).max()),
            top1_agreement=float(np.mean(np.argmax(got, axis=1) == np.argmax(want_logits, axis=1))),
            same_continuation=got_tokens == want_tokens, common_prefix=common))
    return results


def summarize(results: list[PromptParity]) -> dict[str, object]:
    return {
        "prompts": len(results),
        "max_abs_error": round(max(r.max_abs_error for r in results), 5),
        "max_relative_error": round(max(r.relative_error for r in results), 6),
        "prefill_max_abs_error": round(max(r.prefill_max_abs_error for r in results), 5),
        "min_top1_agreement": round(min(r.top1_agreement for r in results), 4),
        "same_continuation": sum(r.same_continuation for r in results),
        "mean_common_prefix": round(float(np.mean([r.common_prefix for r in results])), 2),
        "per_prompt": [asdict(r) for r in results],
    }


def reference_model(source, target: str, quant="q4_0", *, target_arithmetic: bool = True):
    """(model, ops) of the reference runtime for an export of `source` to `target` with `quant`
    (no calibration): the same quantize stage and target form as `export_target`, so its weights
    are the numbers the export computes with; with `target_arithmetic`, `ops` also round the
    activations as the target's kernels do (None when they do not)."""
    from edgeflash.export.quant import resolve_config
    from edgeflash.export.sources import load_source
    from edgeflash.export.targets import target_module
    from edgeflash.export.targets.prepare import prepare

    module = target_module(target)
    model = load_source(source)
    prepared = prepare(model, resolve_config(quant, None), module.FORMATS, target,
                       adapt=getattr(module, "adapt", None))
    ops = module.reference_ops(prepared) if target_arithmetic and hasattr(module, "reference_ops") else None
    return prepared.reference_source(), ops
