"""One choice of a streamed response: its text pieces and log-probabilities as chunks, and, when
tools are offered, text held back until it is known whether the reply is a tool call.

A reply with tools is either text or calls (the grammar allows nothing else), and a call begins
with "{", "```json" or the format's opener: while the text so far could still be such a beginning it is
held; once it cannot, it streams as content; a call is sent whole, as one `tool_calls` delta,
when the choice ends."""

from __future__ import annotations

from typing import Any

from edgeflash.runtime.structured.grammars import FENCE
from edgeflash.server.responses import LogprobWriter, ResponseIds, chunk


class ChoiceStream:
    def __init__(self, ids: ResponseIds, req: Any, index: int, writer: LogprobWriter | None, model: Any):
        self.ids, self.req, self.index, self.writer = ids, req, index, writer
        self.tools = req.output.tools
        self.call_starts = ("{", FENCE, model.tool_call_format.opener) if self.tools else ()
        self.mode = "undecided" if self.tools else "text"  # then "text" or "calls"
        self.held_text = ""
        self.held_logprobs: list[Any] = []
        self.offset = 0  # characters streamed so far (completions' text_offset)
        self.logprobs_sent = 0

    def first_chunk(self) -> dict[str, Any]:
        return chunk(self.ids, self.req, index=self.index, first=True)

    def _logprobs(self, entries: list[Any], text: str) -> dict[str, Any] | None:
        if self.writer is None or entries is None:
            return None
        if self.ids.kind == "chat":
            return self.writer.chat(entries)
        return self.writer.completion(entries, self.offset)

    def _text_chunk(self, text: str, entries: list[Any] | None) -> dict[str, Any]:
        event = chunk(self.ids, self.req, index=self.index, text=text, logprobs=self._logprobs(entries, text))
        self.offset += len(text)
        self.logprobs_sent += len(entries or [])
        return event

    def piece(self, text: str, entries: list[Any] | None) -> list[dict[str, Any]]:
        if self.mode == "text":
            return [self._text_chunk(text, entries)]
        self.held_text += text
        self.held_logprobs += entries or []
        if self.mode == "undecided":
            start = self.held_text.lstrip()
            if start.startswith(self.call_starts):
                self.mode = "calls"
            elif start and not any(s.startswith(start) for s in self.call_starts):
                self.mode = "text"
                text, entries, self.held_text, self.held_logprobs = self.held_text, self.held_logprobs, "", []
                return [self._text_chunk(text, entries if self.writer else None)]
        return []

    def finish(self, result: Any) -> list[dict[str, Any]]:
        """The choice's last chunks; the last of them carries the finish_reason."""
        events = []
        if result.tool_calls:
            if result.text:
                events.append(self._text_chunk(result.text, None))
            events.append(chunk(self.ids, self.req, index=self.index, tool_calls=result.tool_calls))
        elif self.held_text:  # a held beginning that turned out not to be a call
            events.append(self._text_chunk(self.held_text, self.held_logprobs if self.writer else None))
        rest = None  # entries of tokens whose text was held back (the start of a stop string)
        if self.writer and result.logprobs and not result.tool_calls:
            rest = result.logprobs[self.logprobs_sent:]
        events.append(chunk(self.ids, self.req, index=self.index, finish_reason=result.finish_reason,
                            logprobs=self._logprobs(rest, "") if rest else None))
        return events
