"""The evaluate stage: perplexities on held-out text, side by side, for the quality report.

Every model here runs the same op set (FastOps) over the same token windows, so differences
between the numbers are differences between the weights (or the sparsity), not the arithmetic.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from edgeflash.export.forward import token_nll
from edgeflash.export.ops import FastOps, SparseFFNOps
from edgeflash.export.progress import bar
from edgeflash.runtime.source import ModelSource


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


def perplexity(model: ModelSource, windows: list[list[int]], ops: FastOps, desc: str, progress: bool) -> Perplexity:
    per_window = []
    for ids in bar(windows, desc, progress, unit="window"):
        nll = token_nll(model, ops, ids)
        per_window.append((float(nll.sum()), len(nll)))
    return _from_windows(per_window)


def delta_pct(value: float, reference: float) -> float:
    return round(100.0 * (value / reference - 1.0), 3)


def sparse_perplexities(model: ModelSource, windows: list[list[int]], thresholds: dict[float, list[float]],
                        dense: Perplexity, shared: FastOps, progress: bool) -> list[dict]:
    """Perplexity at each target sparsity (CATS thresholds), with the sparsity actually reached,
    against the dense model's perplexity on the same windows (`dense` may cover more of them)."""
    rows = []
    dense_here = dense.first(len(windows))
    for target, layer_thresholds in thresholds.items():
        ops = SparseFFNOps(layer_thresholds, shared=shared)
        p = perplexity(model, windows, ops, f"evaluate: sparsity {target:.0%}", progress)
        rows.append({"target": target, "measured": round(1.0 - ops.kept / max(ops.seen, 1), 4),
                     "tokens": p.tokens, "perplexity": round(p.perplexity, 4),
                     "dense_perplexity": round(dense_here.perplexity, 4),
                     "delta_pct": delta_pct(p.perplexity, dense_here.perplexity)})
    return rows


def windows_tokens(windows: list[list[int]]) -> int:
    return int(np.sum([len(w) - 1 for w in windows]))
