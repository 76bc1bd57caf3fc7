"""Grammars in llguidance's Lark dialect: JSON by schema, and a model's tool calls.

JSON is written compactly on one line with ", " and ": " separators: small models follow that
shape well, and it leaves them no room to stall in endless whitespace."""

from __future__ import annotations

import json
from typing import Any

JSON_OBJECT: dict[str, Any] = {"type": "object"}  # response_format {"type": "json_object"}
FENCE = "```json"  # a Markdown code fence around a call
JSON_LAYOUT = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


def _with_layout(schema: dict[str, Any]) -> dict[str, Any]:
    return {**schema, "x-guidance": {**JSON_LAYOUT, **schema.get("x-guidance", {})}}


def json_grammar(schema: dict[str, Any]) -> str:
    """A grammar for one JSON value that validates against `schema`, and nothing after it."""
    return f"%llguidance {{}}\nstart: %json {json.dumps(_with_layout(schema))}\n"


def call_schema(tool: dict[str, Any]) -> dict[str, Any]:
    """The JSON object a model writes to call `tool` ({"type": "function", "function": {...}})."""
    function = tool["function"]
    parameters = function.get("parameters") or {"type": "object", "properties": {}}
    return {"type": "object", "properties": {"name": {"const": function["name"]}, "arguments": parameters},
            "required": ["name", "arguments"], "additionalProperties": False}


def tool_grammar(tools: list[dict[str, Any]], choice: str, *, opener: str, closer: str,
                 parallel: bool = True) -> str:
    """What a reply may be when `tools` are offered, in a format that wraps each call's JSON in
    `opener` ... `closer` (Hermes/Qwen: <tool_call> and </tool_call>). A bare call object, or one
    in a ```json fence, is accepted too: small models trained on the format often write those.

    choice: "auto" (text, or tool calls), "none" (text that does not start a call), "required"
    (one or more calls), or a function name (exactly one call of that function). Text may not
    begin with "{", "```json" or the opener: that is how a call begins."""
    if choice == "none":
        return f"%llguidance {{}}\nstart: TEXT\n{_text_rule(opener)}"
    offered = tools if choice in ("auto", "required") else [t for t in tools if t["function"]["name"] == choice]
    calls = json.dumps(_with_layout({"anyOf": [call_schema(t) for t in offered]}))
    repeat = ' ("\\n" call)*' if parallel and choice in ("auto", "required") else ""
    lines = ["%llguidance {}",
             "start: TEXT | calls" if choice == "auto" else "start: calls",
             f"calls: call{repeat}",
             f"call: {json.dumps(opener + chr(10))} call_json {json.dumps(chr(10) + closer)} | call_json"
             f" | {json.dumps(FENCE + chr(10))} call_json {json.dumps(chr(10) + '```')}",
             f"call_json: %json {calls}"]
    if choice == "auto":
        lines.append(_text_rule(opener).rstrip("\n"))
    return "\n".join(lines) + "\n"


def _text_rule(opener: str) -> str:
    """Any non-empty text that does not begin the way a call does."""
    starts = "|".join(_regex_escape(s) for s in (opener, "{", FENCE))
    return f"TEXT: /(?s:.+)/ & ~/({starts})(?s:.*)/\n"


def _regex_escape(text: str) -> str:
    return "".join("\\" + c if c in r"\.^$|?*+()[]{}/" else c for c in text)
