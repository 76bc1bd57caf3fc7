"""The OpenAI response and stream-chunk objects for chat completions and text completions."""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field
from typing import Any

from edgeflash.runtime.generate import GenerationResult
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


def usage(result: GenerationResult) -> dict[str, int]:
    prompt = int(result.stats.get("prompt_tokens", 0))
    return {"prompt_tokens": prompt, "completion_tokens": len(result.tokens),
            "total_tokens": prompt + len(result.tokens)}


def full_response(ids: ResponseIds, result: GenerationResult, stats: dict[str, Any]) -> dict[str, Any]:
    if ids.kind == "chat":
        choice = {"index": 0, "message": {"role": "assistant", "content": result.text}, "logprobs": None,
                  "finish_reason": result.finish_reason}
    else:
        choice = {"index": 0, "text": result.text, "logprobs": None, "finish_reason": result.finish_reason}
    return {**ids.header(stream=False), "choices": [choice], "usage": usage(result), "edgeflash": stats}


def chunk(ids: ResponseIds, req: GenerationRequest, *, text: str | None = None, first: bool = False,
          finish_reason: str | None = None) -> dict[str, Any]:
    """One streamed choice update: the assistant role (chat, first), a piece of text, or the finish."""
    if ids.kind == "chat":
        delta: dict[str, Any] = {}
        if first:
            delta["role"] = "assistant"
        if text is not None or first:
            delta["content"] = text or ""
        choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish_reason}
    else:
        choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
    out = {**ids.header(stream=True), "choices": [choice]}
    if req.include_usage:
        out["usage"] = None  # the OpenAI shape: null on every chunk but the last
    return out


def usage_chunk(ids: ResponseIds, result: GenerationResult) -> dict[str, Any]:
    return {**ids.header(stream=True), "choices": [], "usage": usage(result)}
