"""The evaluate stage: held-out perplexity with teacher forcing, on the native engine.

The source model and the written bundle run on the same engine (edgeflash's NativeEngine, the one
users run) over the same token windows, so the difference between their perplexities is the
export's. Logits are computed a batch of tokens at a time: a window's full `[T, vocab]` logits
never exist at once (151,936-wide rows for Qwen2.5).
"""

from __future__ import annotations

import gc
import math
from dataclasses import dataclass

import numpy as np
from edgeflash.export.progress import bar
from edgeflash.runtime.source import ModelSource

EVAL_BATCH = 64  # tokens per engine call: all_logits keeps [this, vocab] floats (half the engine's default)
# Weights an evaluation keeps resident; a larger model streams the rest from its file each batch
# (with direct I/O, about 1 GB/s here), so evaluating a 7B model takes no more memory than a 1B one.
EVAL_RESIDENT_BYTES = 512 << 20


@dataclass
class Perplexity:
    perplexity: float
    tokens: int  # scored tokens
    mean_nll: float
    windows: list[tuple[float, int]]  # per window: (sum of NLL, scored tokens)

    def first(self, n_windows: int) -> Perplexity:
        """The same measurement restricted to the first `n_windows` windows."""
        return _from_windows(self.windows[:n_windows])


def _from_windows(windows: list[tuple[float, int]]) -> Perplexity:
    total = sum(w[0] for w in windows)
    count = sum(w[1] for w in windows)
    mean = total / max(count, 1)
    return Perplexity(perplexity=math.exp(mean), tokens=count, mean_nll=mean, windows=list(windows))


def perplexity(model: ModelSource, windows: list[list[int]], desc: str = "evaluate", progress: bool = False,
               threads: int = 2, act_thresholds: list[float] | None = None) -> Perplexity:
    """Perplexity of `model` on the windows (each scored from its second token on). With
    `act_thresholds` (per layer), FFN neurons whose |act(gate . x)| falls below the layer's threshold
    are skipped (a bundle's arenas only): the quality of activation sparsity at that level."""
    engine = evaluation_engine(model, max(len(w) for w in windows), threads)
    if act_thresholds is not None:
        engine._engine.set_ffn_thresholds([float(t) for t in act_thresholds])
    per_window = []
    for ids in bar(windows, desc, progress, unit="window"):
        engine.reset()
        nll = 0.0
        for start in range(0, len(ids) - 1, EVAL_BATCH):
            chunk = ids[start:start + EVAL_BATCH]
            targets = np.asarray(ids[start + 1:start + 1 + len(chunk)], dtype=np.int64)
            logits = engine.forward(chunk, all_logits=True)[:len(targets)]  # [n, vocab] float32
            nll += _nll(logits, targets)
        per_window.append((nll, len(ids) - 1))
    engine.close()
    del engine
    gc.collect()
    return _from_windows(per_window)


def evaluation_engine(model: ModelSource, context: int, threads: int):
    """A native engine for `model`: every weight resident when the model is small, else under a
    budget of EVAL_RESIDENT_BYTES of resident weights plus the engine's own buffers."""
    from edgeflash.memory.planner import BudgetError
    from edgeflash.runtime.budgeted import BudgetedWeights
    from edgeflash.runtime.native_config import engine_memory, engine_options
    from edgeflash.runtime.native_engine import NativeEngine

    options = engine_options(model.spec, context_length=max(context, 2), max_batch=EVAL_BATCH)
    if model.kind not in ("gguf", "bundle") or model.weight_bytes <= EVAL_RESIDENT_BYTES:
        return NativeEngine(model, threads=threads, options=options)
    mem = engine_memory(model.spec, options)
    budget = EVAL_RESIDENT_BYTES + mem.kv_cache + mem.activations + model.spec.vocab_size * 4
    for _ in range(8):
        try:
            weights = BudgetedWeights(model, budget=budget, options=options, strategy="flash", verify=False)
            return NativeEngine(model, weights=weights, threads=threads, options=options)
        except BudgetError as e:  # the plan's own minimum (staging for the largest unit...) is more
            budget = max(budget, e.minimum_bytes or 0) + (64 << 20)
    raise BudgetError(f"{model.path}: no memory plan for evaluating this model")


def _nll(logits: np.ndarray, targets: np.ndarray, rows: int = 8) -> float:
    """Sum of -log softmax(logits)[target], a few rows at a time (float64 copies of a whole batch
    of 151,936-wide rows were 150 MB of an export's peak)."""
    total = 0.0
    for r in range(0, len(targets), rows):
        z = logits[r:r + rows].astype(np.float64)
        top = z.max(axis=1)
        lse = top + np.log(np.exp(z - top[:, None]).sum(axis=1))
        total += float((lse - z[np.arange(len(z)), targets[r:r + rows]]).sum())
    return total


def delta_pct(value: float, reference: float) -> float:
    return round(100.0 * (value / reference - 1.0), 3)


def windows_for(windows: list[list[int]], tokens: int) -> int:
    """How many leading windows hold `tokens` tokens (at least one)."""
    total = 0
    for i, w in enumerate(windows):
        total += len(w)
        if total >= tokens:
            return i + 1
    return len(windows)
