"""Tool calls in a model's own format: which format a chat template speaks, the grammar that
keeps a reply inside it, and the calls parsed out of the reply's text.

One format so far, Hermes' (Qwen2.5, Hermes, and others trained on it): each call is a JSON
object {"name": ..., "arguments": {...}} on its own line between <tool_call> and </tool_call>;
small models often write the object without the tags, or in a ```json fence, and those are
read as calls too."""

from __future__ import annotations

import json
import re
import uuid
from dataclasses import dataclass
from typing import Any

from edgeflash.base.errors import UserError

from .grammars import tool_grammar


@dataclass(frozen=True)
class ToolCallFormat:
    name: str
    opener: str
    closer: str

    def grammar(self, tools: list[dict[str, Any]], choice: str, parallel: bool = True) -> str:
        return tool_grammar(tools, choice, opener=self.opener, closer=self.closer, parallel=parallel)

    def parse(self, text: str, tools: list[dict[str, Any]]) -> tuple[str | None, list[dict[str, Any]]]:
        """(the text outside the calls or None, the calls in OpenAI's shape). A block whose JSON
        does not parse, or names no offered tool, stays in the text."""
        names = {t["function"]["name"] for t in tools}
        pattern = re.compile(re.escape(self.opener) + r"\s*(.*?)\s*(?:" + re.escape(self.closer) + r"|$)", re.S)
        calls: list[dict[str, Any]] = []
        kept: list[str] = []
        at = 0
        for match in pattern.finditer(text):
            call = _call(match.group(1), names)
            if call is None:
                continue
            kept.append(text[at:match.start()])
            at = match.end()
            calls.append(call)
        kept.append(text[at:])
        content = "".join(kept).strip()
        if not calls and content.startswith("```json"):
            fenced = re.fullmatch(r"```json\s*(.*?)\s*```", content, re.S)
            if fenced:
                rest, calls = _bare_calls(fenced.group(1), names)
                content = content if rest else ""
                calls = calls if not rest else []
        if not calls and content.startswith("{"):
            content, calls = _bare_calls(content, names)
        return (content or None), calls


def _bare_calls(text: str, names: set[str]) -> tuple[str, list[dict[str, Any]]]:
    """Calls written as bare JSON objects one after another (the tags left out)."""
    decoder = json.JSONDecoder()
    calls, at = [], 0
    while at < len(text) and text[at] == "{":
        try:
            obj, end = decoder.raw_decode(text, at)
        except json.JSONDecodeError:
            break
        call = _call(obj, names)
        if call is None:
            break
        calls.append(call)
        at = end
        while at < len(text) and text[at].isspace():
            at += 1
    return text[at:], calls


def _call(body: str | Any, names: set[str]) -> dict[str, Any] | None:
    try:
        obj = json.loads(body) if isinstance(body, str) else body
    except json.JSONDecodeError:
        return None
    if not isinstance(obj, dict) or obj.get("name") not in names:
        return None
    arguments = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(arguments, str):  # some models write the arguments as a JSON string
        try:
            arguments = json.loads(arguments)
        except json.JSONDecodeError:
            return None
    return {"id": "call_" + uuid.uuid4().hex[:24], "type": "function",
            "function": {"name": obj["name"], "arguments": json.dumps(arguments, ensure_ascii=False)}}


HERMES = ToolCallFormat("hermes", "<tool_call>", "</tool_call>")


def tool_call_format(tok: Any) -> ToolCallFormat | None:
    """The format the model's chat template renders tools and calls in, or None when its template
    has no place for tools (then the model was not trained to call them)."""
    template = getattr(tok, "chat_template", None) or ""
    if tok.chat_format != "template" or "tools" not in template:
        return None
    if HERMES.opener in template and tok.token_to_id(HERMES.opener) is not None:
        return HERMES
    return None


def check_tools(tools: Any) -> list[str]:
    """The tools' names, after checking each is {"type": "function", "function": {"name": str,
    "description"?: str, "parameters"?: object}}; a UserError names the first bad field."""
    if not isinstance(tools, (list, tuple)) or not tools:
        raise UserError(f"tools = {tools!r:.60}: expected a non-empty list of tool objects")
    names: list[str] = []
    for i, tool in enumerate(tools):
        where = f"tools[{i}]"
        if not isinstance(tool, dict) or tool.get("type", "function") != "function":
            raise UserError(f"{where} = {tool!r:.60}: expected {{'type': 'function', 'function': {{...}}}}")
        function = tool.get("function")
        if not isinstance(function, dict):
            raise UserError(f"{where}.function = {function!r:.60}: expected an object with a 'name'")
        name = function.get("name")
        if not isinstance(name, str) or not re.fullmatch(r"[A-Za-z0-9_.-]{1,64}", name):
            raise UserError(f"{where}.function.name = {name!r:.60}: expected 1-64 letters, digits, '_', '.' or '-'")
        if name in names:
            raise UserError(f"{where}.function.name = {name!r}: two tools have this name")
        parameters = function.get("parameters")
        if parameters is not None and not isinstance(parameters, dict):
            raise UserError(f"{where}.function.parameters = {parameters!r:.60}: expected a JSON schema object")
        names.append(name)
    return names
