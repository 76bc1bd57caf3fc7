"""`sparsity="auto"`: the fastest measured FFN setting for a bundle and budget.

The first auto load at a budget measures, in this process and one after another, exact flash and
each calibrated sparsity level with the windows in AUTO_WINDOWS: decode tokens/s of a short greedy
generation (a setting clearly slower than exact flash after a few tokens is not run further), and
for each sparse setting that keeps up, how often its top-1 token equals exact flash's,
teacher-forced on exact flash's own output. Settings whose agreement is under AUTO_MIN_AGREEMENT are not
candidates; of the rest, and exact flash, the fastest wins. Tokens/s are remembered
(edgeflash.memory.sparsity_profile), so later loads at that budget pick without measuring, and an
explicit `sparsity=` that measured slower than exact flash falls back too.
"""

from __future__ import annotations

import gc
from pathlib import Path
from typing import Any, Callable

import numpy as np
from edgeflash.base.heap import release_free_heap
from edgeflash.memory import sparsity_profile
from edgeflash.runtime.generate import Generation
from edgeflash.runtime.sampler import SamplingParams

AUTO_WINDOWS = (0, 4)
AUTO_MIN_AGREEMENT = 0.9  # top-1 agreement with exact flash a sparse setting needs to be a candidate
TUNE_PROMPT = "def parse_arguments(argv):\n    \"\"\"Parse the command line and return the options.\"\"\"\n"
TUNE_TOKENS = 16
PROBE_TOKENS = 4
CLEARLY_SLOWER = 0.7  # under this share of exact flash's tokens/s after PROBE_TOKENS, a setting is not finished


def choose(weights_path: Path, budget: int, levels: list[float], load: Callable[..., Any],
           tokens: int = TUNE_TOKENS) -> tuple[float | None, int, str]:
    """(sparsity or None, window, why) for this budget. `load(sparsity, window)` loads the model
    at this budget with that FFN setting and no fallback."""
    measured = sparsity_profile.measurements(weights_path, budget)
    wanted = [sparsity_profile.config_name(s, k) for s in levels for k in AUTO_WINDOWS]
    if "exact" not in measured or any(name not in measured for name in wanted):
        measured = measure(weights_path, budget, levels, load, tokens)
    pool = {name: tok_s for name, tok_s in measured.items() if name == "exact" or name in wanted}
    best = max(pool, key=pool.get)
    sparsity, window = sparsity_profile.parse_config(best)
    table = ", ".join(f"{n} {v:.2f}" for n, v in sorted(pool.items(), key=lambda kv: -kv[1]))
    what = "exact flash" if sparsity is None else f"sparse FFN at {sparsity:.0%}, window {window}"
    return sparsity, window, f"--ffn-sparsity auto chose {what}, the fastest measured at this budget (tok/s: {table})"


def measure(weights_path: Path, budget: int, levels: list[float], load: Callable[..., Any],
            tokens: int) -> dict[str, float]:
    """Tokens/s of exact flash and of each sparse setting that agrees with it well enough; remembered.
    A setting that agrees too little is remembered at 0 tok/s, so it is never picked."""
    results: dict[str, float] = {}
    tok_s, reference, _ = _run_one(load, None, 0, tokens, None)
    results["exact"] = tok_s
    for sparsity in levels:
        for window in AUTO_WINDOWS:
            # a few tokens first: a setting far slower than exact flash is recorded as measured, not finished
            tok_s, _, _ = _run_one(load, sparsity, window, PROBE_TOKENS, None)
            if tok_s >= CLEARLY_SLOWER * results["exact"]:
                tok_s, _, agreement = _run_one(load, sparsity, window, tokens, reference)
                tok_s = tok_s if agreement >= AUTO_MIN_AGREEMENT else 0.0
            results[sparsity_profile.config_name(sparsity, window)] = tok_s
    sparsity_profile.record(weights_path, budget, results)
    return results


def _greedy(model: Any, prompt: list[int], tokens: int) -> Any:
    generation = Generation(model.engine, prompt, tokens, SamplingParams())
    for _ in generation:
        pass
    return generation.result()


def _agreement(model: Any, prompt: list[int], reference: list[int]) -> float:
    """Share of positions where the model's top-1 equals the reference's next token, teacher-forced
    on the reference, one token a pass (as decoding runs)."""
    engine = model.engine
    engine.reset()
    logits = engine.forward(prompt)[-1]
    same = 0
    for i, token in enumerate(reference):
        same += int(np.argmax(logits)) == token
        if i + 1 < len(reference):
            logits = engine.forward([token])[-1]
    return same / max(1, len(reference))


def _run_one(load: Callable[..., Any], sparsity: float | None, window: int, tokens: int,
             reference: list[int] | None) -> tuple[float, list[int], float]:
    """(decode tok/s, greedy tokens, top-1 agreement with `reference`) of one setting; the model is
    gone when this returns, so the next one loads into the same budget."""
    model = load(sparsity, window)
    prompt = model.source.tokenizer.encode(TUNE_PROMPT)
    result = _greedy(model, prompt, tokens)
    agreement = _agreement(model, prompt, reference) if reference is not None else 1.0
    model.engine.close()
    del model
    gc.collect()
    release_free_heap()  # what the setting freed leaves the process: the next load starts from its own RSS
    return result.stats["decode_tok_s"], list(result.tokens), agreement
