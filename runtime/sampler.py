"""Turning logits into the next token: penalties (repetition, frequency, presence), then greedy or
temperature with top-k, top-p and min-p.

`SamplingParams()` is plain greedy decoding with every filter and penalty off: what the Python API
does unless told otherwise. `SAMPLING_DEFAULTS` is what the command line, the server and the web
page use for options a user leaves out (llama.cpp's defaults)."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np
import numpy.random  # noqa: F401  (imported with the runtime, not at the first sample)
from edgeflash.base.errors import UserError

# llama.cpp's defaults: sampled, with a mild repetition penalty over the last 64 tokens, so that a
# small model's answer neither loops (greedy without a penalty does) nor wanders.
SAMPLING_DEFAULTS: dict[str, Any] = {
    "temperature": 0.8, "top_k": 40, "top_p": 0.95, "min_p": 0.05, "repetition_penalty": 1.1,
    "repeat_last_n": 64, "frequency_penalty": 0.0, "presence_penalty": 0.0,
}


@dataclass
class SamplingParams:
    temperature: float = 0.0  # 0 = greedy (the best token after the penalties)
    top_k: int = 0  # 0 = no limit
    top_p: float = 1.0
    min_p: float = 0.0  # drop tokens below min_p * p(best token)
    repetition_penalty: float = 1.0  # >1 discourages tokens already in the window (CTRL-style)
    seed: int | None = None
    frequency_penalty: float = 0.0  # subtracted from a logit once per occurrence in the window (OpenAI)
    presence_penalty: float = 0.0  # subtracted once from the logit of every token in the window (OpenAI)
    repeat_last_n: int = 64  # the penalties' window: the last N tokens of the context; 0 = none, -1 = all

    def __post_init__(self) -> None:
        checks = [
            (self.temperature >= 0, "temperature", self.temperature, "a number >= 0"),
            (self.top_k >= 0, "top_k", self.top_k, "an integer >= 0"),
            (0 < self.top_p <= 1, "top_p", self.top_p, "a number in (0, 1]"),
            (0 <= self.min_p < 1, "min_p", self.min_p, "a number in [0, 1)"),
            (self.repetition_penalty > 0, "repetition_penalty", self.repetition_penalty, "a number > 0"),
            (-2 <= self.frequency_penalty <= 2, "frequency_penalty", self.frequency_penalty, "a number in [-2, 2]"),
            (-2 <= self.presence_penalty <= 2, "presence_penalty", self.presence_penalty, "a number in [-2, 2]"),
            (self.repeat_last_n >= -1, "repeat_last_n", self.repeat_last_n, "an integer >= -1"),
        ]
        for ok, name, value, expected in checks:
            if not ok:
                raise UserError(f"{name} = {value!r}: expected {expected}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0.0

    @property
    def penalized(self) -> bool:
        """Whether any penalty changes the logits (then greedy is not the model's own argmax)."""
        return self.repeat_last_n != 0 and (self.repetition_penalty != 1.0 or self.frequency_penalty != 0.0
                                            or self.presence_penalty != 0.0)


class Sampler:
    """`exempt`: tokens no penalty touches (a model's end-of-turn tokens: a chat template writes one
    after every message, and penalizing them would keep a reply from ending)."""

    def __init__(self, params: SamplingParams, exempt: Iterable[int] = ()):
        self.params = params
        self.rng = np.random.default_rng(params.seed)
        self.exempt = np.array(sorted(set(exempt)), dtype=np.int64)

    def window(self, history: Sequence[int]) -> Sequence[int]:
        n = self.params.repeat_last_n
        if n == 0:
            return ()
        return history if n < 0 else history[-n:]

    def adjusted_logits(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """Logits after the penalties over the window: repetition (divide positive, multiply
        negative), then frequency (per occurrence) and presence (once), as llama.cpp applies them."""
        p = self.params
        if not p.penalized:
            return logits
        recent = self.window(history)
        if not len(recent):
            return logits
        seen, counts = np.unique(np.asarray(recent, dtype=np.int64), return_counts=True)
        if self.exempt.size:
            keep = ~np.isin(seen, self.exempt)
            seen, counts = seen[keep], counts[keep]
        seen_ok = seen < logits.shape[-1]
        seen, counts = seen[seen_ok], counts[seen_ok]
        if not seen.size:
            return logits
        logits = logits.astype(np.float32, copy=True)
        vals = logits[seen]
        if p.repetition_penalty != 1.0:
            vals = np.where(vals > 0, vals / p.repetition_penalty, vals * p.repetition_penalty)
        vals = vals - counts * np.float32(p.frequency_penalty) - np.float32(p.presence_penalty)
        logits[seen] = vals
        return logits

    def distribution(self, logits: np.ndarray, history: Sequence[int] = ()) -> tuple[np.ndarray, np.ndarray]:
        """The tokens sampling can draw and their probabilities after every filter (ids ascending;
        float64, summing to 1). Only top-k's candidates are worked on past the penalties: a
        vocabulary-sized float64 array per filter would be about 1.2 MB each on Qwen2.5's 151,936
        tokens, a few a token, which a memory budget does not count."""
        p = self.params
        adjusted = self.adjusted_logits(logits, history)
        if p.greedy:
            return np.array([int(np.argmax(adjusted))]), np.ones(1)
        finite = np.isfinite(adjusted)  # a constraint's mask leaves -inf on the tokens it forbids
        if p.top_k and p.top_k < adjusted.size:
            # dividing by the temperature keeps the order, so the k-th value is found before it
            kth = np.partition(adjusted, -p.top_k)[-p.top_k]
            finite &= adjusted >= kth
        ids = np.flatnonzero(finite)
        scaled = adjusted[ids].astype(np.float64) / p.temperature
        probs = np.exp(scaled - scaled.max())
        probs /= probs.sum()
        if p.min_p > 0:
            probs[probs < p.min_p * probs.max()] = 0.0
        if p.top_p < 1.0:
            order = np.argsort(-probs, kind="stable")
            cumulative = np.cumsum(probs[order])
            cut = int(np.searchsorted(cumulative, p.top_p)) + 1  # smallest prefix reaching top_p
            probs[order[cut:]] = 0.0
        kept = probs > 0
        return ids[kept], probs[kept] / probs[kept].sum()

    def probabilities(self, logits: np.ndarray, history: Sequence[int] = ()) -> np.ndarray:
        """The distribution sampling draws from as a vocabulary-sized array (float64, sums to 1)."""
        ids, probs = self.distribution(logits, history)
        out = np.zeros(logits.shape[-1])
        out[ids] = probs
        return out

    def __call__(self, logits: np.ndarray, history: Sequence[int] = ()) -> int:
        if self.params.greedy:
            return int(np.argmax(self.adjusted_logits(logits, history)))
        ids, probs = self.distribution(logits, history)
        return int(ids[self.rng.choice(ids.size, p=probs)])
