"""The OpenAI response and stream-chunk objects for chat completions and text completions."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Sequence

from edgeflash.runtime.generate import GenerationResult, TokenLogprob
from edgeflash.server.validate import GenerationRequest


@dataclass
class ResponseIds:
    """What every object of one response shares."""

    kind: str  # "chat" or "completion"
    model: str
    fingerprint: str
    id: str = ""
    created: int = field(default_factory=lambda: int(time.time()))

    def __post_init__(self) -> None:
        if not self.id:
            self.id = ("chatcmpl-" if self.kind == "chat" else "cmpl-") + uuid.uuid4().hex[:24]

    def header(self, stream: bool) -> dict[str, Any]:
        if self.kind == "chat":
            obj = "chat.completion.chunk" if stream else "chat.completion"
        else:
            obj = "text_completion"
        return {"id": self.id, "object": obj, "created": self.created, "model": self.model,
                "system_fingerprint": self.fingerprint}


def usage(results: Sequence[GenerationResult]) -> dict[str, int]:
    prompt = int(results[0].stats.get("prompt_tokens", 0)) if results else 0
    completion = sum(len(r.tokens) for r in results)
    return {"prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion}


class LogprobWriter:
    """Log-probabilities in OpenAI's two shapes: chat's `content` list and completions' columns."""

    def __init__(self, tokenizer: Any):
        self.tok = tokenizer

    def _token(self, token_id: int) -> tuple[str, list[int]]:
        data = self.tok.token_bytes(token_id)
        return data.decode("utf-8", errors="replace"), list(data)

    def chat(self, entries: Sequence[TokenLogprob]) -> dict[str, Any]:
        content = []
        for e in entries:
            text, data = self._token(e.token)
            top = []
            for token_id, logprob in e.top:
                t, d = self._token(token_id)
                top.append({"token": t, "logprob": logprob, "bytes": d})
            content.append({"token": text, "logprob": e.logprob, "bytes": data, "top_logprobs": top})
        return {"content": content, "refusal": None}

    def completion(self, entries: Sequence[TokenLogprob], offset: int = 0) -> dict[str, Any]:
        tokens, offsets, top = [], [], []
        for e in entries:
            text = self._token(e.token)[0]
            tokens.append(text)
            offsets.append(offset)
            offset += len(text)
            alternatives: dict[str, float] = {}
            for token_id, logprob in e.top:
                alternatives.setdefault(self._token(token_id)[0], logprob)
            top.append(alternatives)
        return {"tokens": tokens, "token_logprobs": [e.logprob for e in entries],
                "top_logprobs": top, "text_offset": offsets}


def choice(ids: ResponseIds, index: int, result: GenerationResult, logprobs: LogprobWriter | None) -> dict[str, Any]:
    """One finished choice of a whole (not streamed) response."""
    entries = result.logprobs if logprobs is not None and result.logprobs is not None else None
    if ids.kind == "chat":
        message: dict[str, Any] = {"role": "assistant", "content": result.text}
        if result.tool_calls:
            message["content"] = result.text or None
            message["tool_calls"] = result.tool_calls
        return {"index": index, "message": message,
                "logprobs": logprobs.chat(entries) if entries is not None else None,
                "finish_reason": result.finish_reason}
    return {"index": index, "text": result.text,
            "logprobs": logprobs.completion(entries) if entries is not None else None,
            "finish_reason": result.finish_reason}


def full_response(ids: ResponseIds, results: Sequence[GenerationResult], stats: dict[str, Any],
                  logprobs: LogprobWriter | None = None) -> dict[str, Any]:
    return {**ids.header(stream=False), "choices": [choice(ids, i, r, logprobs) for i, r in enumerate(results)],
            "usage": usage(results), "edgeflash": stats}


def chunk(ids: ResponseIds, req: GenerationRequest, *, index: int = 0, text: str | None = None, first: bool = False,
          finish_reason: str | None = None, logprobs: dict[str, Any] | None = None,
          tool_calls: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """One streamed choice update: the assistant role (chat, first), a piece of text, tool calls,
    or the finish."""
    if ids.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None or first:
            delta["content"] = text or ""
        if tool_calls:
            delta["tool_calls"] = [{"index": i, **call} for i, call in enumerate(tool_calls)]
        body = {"index": index, "delta": delta, "logprobs": logprobs, "finish_reason": finish_reason}
    else:
        body = {"index": index, "text": text or "", "logprobs": logprobs, "finish_reason": finish_reason}
    out = {**ids.header(stream=True), "choices": [body]}
    if req.include_usage:
        out["usage"] = None  # the OpenAI shape: null on every chunk but the last
    return out


def usage_chunk(ids: ResponseIds, results: Sequence[GenerationResult]) -> dict[str, Any]:
    return {**ids.header(stream=True), "choices": [], "usage": usage(results)}
