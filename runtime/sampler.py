"""Turning logits into the next token: greedy, temperature, top-k, top-p, min-p, repetition penalty."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import numpy.random  # noqa: F401  (imported with the runtime, not at the first sample)
from edgeflash.base.errors import UserError


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens below min_p * p(best token)
    repetition_penalty: float = 1.0  # >1 discourages tokens already in the context
    seed: int | None = None

    def __post_init__(self) -> None:
        checks = [
            (self.temperature >= 0, "temperature", self.temperature, "a number >= 0"),
            (self.top_k >= 0, "top_k", self.top_k, "an integer >= 0"),
            (0 < self.top_p <= 1, "top_p", self.top_p, "a number in (0, 1]"),
            (0 <= self.min_p < 1, "min_p", self.min_p, "a number in [0, 1)"),
            (self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "a number > 0"),
        ]
        for ok, name, value, expected in checks:
            if not ok:
                raise UserError(f"{name} = {value!r}: expected {expected}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0


class Sampler:
    def __init__(self, params: SamplingParams):
        self.params = params
        self.rng = np.random.default_rng(params.seed)

    def adjusted_logits(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """Logits after the repetition penalty (CTRL-style: divide positive, multiply negative)."""
        penalty = self.params.repetition_penalty
        if penalty == 1.0 or not len(history):
            return logits
        logits = logits.astype(np.float32, copy=True)
        seen = np.unique(np.asarray(history, dtype=np.int64))
        vals = logits[seen]
        logits[seen] = np.where(vals > 0, vals / penalty, vals * penalty)
        return logits

    def probabilities(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The distribution sampling draws from, after every filter (float64, sums to 1).
        Speculative decoding uses it to accept or reject drafts without changing the output law."""
        p = self.params
        logits = self.adjusted_logits(logits, history).astype(np.float64)
        if p.greedy:
            out = np.zeros_like(logits)
            out[int(np.argmax(logits))] = 1.0
            return out
        logits = logits / p.temperature
        keep = np.ones(logits.shape, dtype=bool)
        if p.top_k and p.top_k < logits.size:
            kth = np.partition(logits, -p.top_k)[-p.top_k]
            keep &= logits >= kth
        probs = np.exp(logits - logits.max())
        probs[~keep] = 0.0
        probs /= probs.sum()
        if p.min_p > 0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            cut = int(np.searchsorted(cumulative, p.top_p)) + 1  # smallest prefix reaching top_p
            probs[order[cut:]] = 0.0
        return probs / probs.sum()

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.params.greedy:
            return int(np.argmax(self.adjusted_logits(logits, history)))
        probs = self.probabilities(logits, history)
        return int(self.rng.choice(probs.size, p=probs))
