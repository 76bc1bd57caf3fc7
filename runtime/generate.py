"""The generation loop shared by every engine: prefill, sample, decode, stop, stream, time; and,
when asked, a grammar that masks the logits and the log-probabilities of every chosen token."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.base.rss import peak_rss_bytes
from edgeflash.runtime.engine import Engine
from edgeflash.runtime.sampler import Sampler, SamplingParams


@dataclass
class TokenLogprob:
    """A chosen token's log-probability under the model (log-softmax of its logits, before
    penalties, temperature, filters and constraints), and the `top` most likely tokens'."""

    token: int
    logprob: float
    top: list[tuple[int, float]] = field(default_factory=list)


@dataclass
class GenerationResult:
    text: str
    tokens: list[int]
    finish_reason: str  # "stop" (EOS or stop string), "length" (max_tokens or context full), "tool_calls"
    stats: dict[str, Any] = field(default_factory=dict)
    logprobs: list[TokenLogprob] | None = None  # one per token when asked for
    tool_calls: list[dict[str, Any]] = field(default_factory=list)  # OpenAI's shape, from Model.chat(tools=...)


class Generation:
    """Iterate to receive text pieces as they are decoded; afterwards `.result()` has everything.

    Text that might be the start of a stop string is held back until it is known not to be."""

    def __init__(self, engine: Engine, prompt_ids: Sequence[int], max_tokens: int, sampling: SamplingParams,
                 stop: Sequence[str] = (), drafter: Any = None, *, constraint: Any = None,
                 logprobs: int | None = None):
        """constraint: an `edgeflash.runtime.structured.Constraint` the text must follow.
        logprobs: record every chosen token's log-probability and the `logprobs` best alternatives'.
        Either turns speculative decoding off (drafts are verified without them)."""
        if max_tokens < 0:
            raise UserError(f"max_tokens = {max_tokens}: expected an integer >= 0")
        if not prompt_ids:
            raise UserError("the prompt is empty (no tokens to condition on)")
        if len(prompt_ids) >= engine.context_length:
            raise UserError(f"the prompt has {len(prompt_ids)} tokens but the context holds {engine.context_length}")
        self.engine, self.prompt_ids, self.max_tokens = engine, list(prompt_ids), max_tokens
        if logprobs is not None and logprobs < 0:
            raise UserError(f"logprobs = {logprobs}: expected an integer >= 0")
        self.sampler = Sampler(sampling, exempt=engine.tokenizer.eos_ids)
        self.stop = [s for s in stop if s]
        self.constraint = constraint
        self.top_logprobs = logprobs
        self.logprobs: list[TokenLogprob] | None = [] if logprobs is not None else None
        self.speculative = None
        if drafter is not None and constraint is None and logprobs is None:
            from edgeflash.runtime.speculative import SpeculativeDecoder

            self.speculative = SpeculativeDecoder(engine, drafter, self.sampler)
        self.tokens: list[int] = []
        self.text = ""
        self.finish_reason = "length"
        self.stats: dict[str, Any] = {}
        self._done = False

    def __iter__(self) -> Iterator[str]:
        from edgeflash.runtime.tokenizer import StreamDecoder

        engine, tok = self.engine, self.engine.tokenizer
        decoder = StreamDecoder(tok)
        eos = set(tok.eos_ids)
        emitted = 0  # characters of self.text already yielded
        io_start = _io_counters(engine)
        t_start = time.perf_counter()
        reused = _reuse_prefix(engine, self.prompt_ids)
        logits = engine.forward(self.prompt_ids[reused:])[-1]
        t_first = time.perf_counter()
        io_decode_start = _io_counters(engine)
        prefill_s = t_first - t_start
        ttft = None
        stopped_by_string = False
        history = list(self.prompt_ids)
        pending = [self._choose(logits, history)]  # decided tokens not yet emitted
        while pending and len(self.tokens) < self.max_tokens:
            token = pending.pop(0)
            if ttft is None:
                ttft = time.perf_counter() - t_start
            if token in eos:
                self.finish_reason = "stop"
                break
            self.tokens.append(token)
            history.append(token)
            self.text += decoder.push(token)
            cut = _find_stop(self.text, self.stop)
            if cut is not None:
                self.text = self.text[:cut]
                self.finish_reason = "stop"
                stopped_by_string = True
                break
            safe = len(self.text) - _stop_prefix_len(self.text, self.stop)
            if safe > emitted:
                yield self.text[emitted:safe]
                emitted = safe
            if pending or len(self.tokens) >= self.max_tokens:
                continue
            if len(engine.tokens) + 1 >= engine.context_length:
                self.finish_reason = "length"
                break
            pending = self._decode_step(history)
        steps = max(0, len(self.tokens) - 1)  # tokens that decode steps produced (the first came from prefill)
        if not stopped_by_string:
            self.text += decoder.flush()  # bytes of an unfinished character, if any
        if len(self.text) > emitted:
            yield self.text[emitted:]
        t_end = time.perf_counter()
        decode_s = t_end - t_first
        self.stats = {
            "engine": engine.name,
            "prompt_tokens": len(self.prompt_ids),
            "prompt_tokens_reused": reused,
            "generated_tokens": len(self.tokens),
            "prefill_s": round(prefill_s, 6),
            "prefill_tok_s": round((len(self.prompt_ids) - reused) / prefill_s, 3) if prefill_s > 0 else None,
            "decode_s": round(decode_s, 6),
            "decode_tok_s": round(steps / decode_s, 3) if steps and decode_s > 0 else None,
            "ttft_s": round(ttft, 6) if ttft is not None else None,
            "peak_rss_bytes": peak_rss_bytes(),
            "finish_reason": self.finish_reason,
            **engine.stats(),
        }
        if self.speculative is not None:
            self.stats.update(self.speculative.stats.to_dict())
            self.speculative.finish()
        if io_start is not None:  # flash reads of this generation (the engine counts since loading)
            io_end = _io_counters(engine)
            read, wait = io_end[0] - io_start[0], io_end[1] - io_start[1]
            self.stats.update({
                "flash_bytes_read": read, "io_wait_s": round(wait, 6),
                "io_wait_share": round(min(1.0, wait / (prefill_s + decode_s)), 4) if prefill_s + decode_s > 0 else None,
                "flash_bytes_per_token": (io_end[0] - io_decode_start[0]) // steps if steps else None,
            })
        self._done = True

    def _decode_step(self, history: list[int]) -> list[int]:
        """The next decided tokens after history[-1]: one from a plain step, or several from a
        speculative verification (never more than fit in the context)."""
        # Every node of a verified tree takes a cache slot until the pass is committed; near the
        # end of the context the trees get smaller rather than stopping.
        # Plain decoding stops with one cache slot free; a tree commits up to its size, so it leaves
        # that slot free too (the same tokens, the same length), and stays where the engine scores
        # its nodes as plain decoding would (tree_room).
        room = self.engine.context_length - len(self.engine.tokens) - 1
        if self.speculative is not None:
            room = min(room, self.engine.tree_room())
        if self.speculative is not None and room >= 2:
            return self.speculative.step(history, room=room, wanted=self.max_tokens - len(self.tokens))
        logits = self.engine.forward([history[-1]])[-1]
        return [self._choose(logits, history)]

    def _choose(self, logits: np.ndarray, history: list[int]) -> int:
        """The next token: masked by the constraint, sampled, recorded."""
        allowed = self.constraint.mask(logits) if self.constraint is not None else logits
        token = self.sampler(allowed, history)
        if self.logprobs is not None:
            self.logprobs.append(_logprob(logits, token, self.top_logprobs or 0))
        if self.constraint is not None:
            self.constraint.accept(token)
        return token

    def result(self) -> GenerationResult:
        if not self._done:
            for _ in self:
                pass
        # An EOS the generation stopped at has an entry but is not a token of the text.
        logprobs = self.logprobs[:len(self.tokens)] if self.logprobs is not None else None
        return GenerationResult(self.text, list(self.tokens), self.finish_reason, dict(self.stats), logprobs)


def _logprob(logits: np.ndarray, token: int, top: int) -> TokenLogprob:
    x = np.asarray(logits, dtype=np.float64)
    peak = x.max()
    log_total = peak + np.log(np.exp(x - peak).sum())
    best: list[tuple[int, float]] = []
    if top:
        ids = np.argpartition(-x, top - 1)[:top] if top < x.size else np.arange(x.size)
        ids = ids[np.argsort(-x[ids], kind="stable")]
        best = [(int(i), float(x[i] - log_total)) for i in ids]
    return TokenLogprob(int(token), float(x[token] - log_total), best)


def _io_counters(engine: Engine) -> tuple[int, float] | None:
    """(bytes read from flash, seconds waited) so far, for engines that stream weights."""
    stats = engine.stats()
    if stats.get("flash_bytes_read") is None:
        return None
    return int(stats["flash_bytes_read"]), float(stats.get("io_wait_s") or 0.0)


def _reuse_prefix(engine: Engine, prompt: list[int]) -> int:
    """Keep the cached tokens the new prompt starts with; at least one prompt token is recomputed
    so there are logits to sample from."""
    common = 0
    for a, b in zip(engine.tokens, prompt):
        if a != b:
            break
        common += 1
    common = min(common, len(prompt) - 1)
    engine.truncate(common)
    return len(engine.tokens)  # an engine may keep fewer (a ring buffer cannot roll back far)


def _find_stop(text: str, stops: list[str]) -> int | None:
    hits = [i for i in (text.find(s) for s in stops) if i >= 0]
    return min(hits) if hits else None


def _stop_prefix_len(text: str, stops: list[str]) -> int:
    """Length of the longest suffix of `text` that is a proper prefix of a stop string."""
    best = 0
    for s in stops:
        for k in range(min(len(s) - 1, len(text)), best, -1):
            if text.endswith(s[:k]):
                best = k
                break
    return best
