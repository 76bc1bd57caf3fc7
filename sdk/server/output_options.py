"""Request fields that shape the output beyond sampling: `n`, `logprobs`/`top_logprobs`,
`response_format` (JSON by schema) and `tools`/`tool_choice`, checked into `OutputOptions`.

Grammars are compiled here, so a bad schema is a 400 naming the field before the request waits
in the queue."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.server.errors import invalid

MAX_N = 8  # choices per request: each is a generation of its own, one after the other
MAX_TOP_LOGPROBS = 20  # chat's top_logprobs (OpenAI's limit)
MAX_COMPLETION_LOGPROBS = 5  # completions' logprobs (OpenAI's limit)
TOOL_CHOICES = ("none", "auto", "required")


@dataclass
class OutputOptions:
    n: int = 1
    logprobs: int | None = None  # None: not asked; else how many alternatives per token
    grammar: str | None = None  # llguidance grammar every choice follows
    grammar_field: str | None = None  # the request field it came from, for errors
    tools: list[dict[str, Any]] | None = None
    tool_choice: str = "auto"  # "none", "auto", "required" or a tool's name
    parallel_tool_calls: bool = True


def chat_output_options(body: dict[str, Any], model: Any) -> OutputOptions:
    out = OutputOptions(n=_n(body))
    logprobs = body.get("logprobs")
    if logprobs is not None and not isinstance(logprobs, bool):
        raise invalid(f"logprobs = {logprobs!r:.40}: expected true or false", "logprobs", "invalid_type")
    top = body.get("top_logprobs")
    if top is not None:
        if not _is_int(top):
            raise invalid(f"top_logprobs = {top!r:.40}: expected an integer", "top_logprobs", "invalid_type")
        if not 0 <= top <= MAX_TOP_LOGPROBS:
            raise invalid(f"top_logprobs = {top}: expected an integer in [0, {MAX_TOP_LOGPROBS}]", "top_logprobs")
        if not logprobs:
            raise invalid("top_logprobs needs logprobs: true", "top_logprobs")
    if logprobs:
        out.logprobs = top or 0
    _response_format(body, model, out)
    _tools(body, model, out)
    return out


def completion_output_options(body: dict[str, Any], model: Any) -> OutputOptions:
    out = OutputOptions(n=_n(body))
    for name in ("tools", "tool_choice"):
        if body.get(name) is not None:
            raise invalid(f"{name} is a chat field: send it to /v1/chat/completions", name, "unsupported_value")
    logprobs = body.get("logprobs")
    if logprobs is not None:
        if not _is_int(logprobs):
            raise invalid(f"logprobs = {logprobs!r:.40}: expected an integer", "logprobs", "invalid_type")
        if not 0 <= logprobs <= MAX_COMPLETION_LOGPROBS:
            raise invalid(f"logprobs = {logprobs}: expected an integer in [0, {MAX_COMPLETION_LOGPROBS}]", "logprobs")
        out.logprobs = logprobs
    _response_format(body, model, out)
    return out


def _n(body: dict[str, Any]) -> int:
    n = body.get("n")
    if n is None:
        return 1
    if not _is_int(n):
        raise invalid(f"n = {n!r:.40}: expected an integer", "n", "invalid_type")
    if not 1 <= n <= MAX_N:
        raise invalid(f"n = {n}: expected an integer in [1, {MAX_N}] (choices are generated one after the other)", "n")
    return n


def _response_format(body: dict[str, Any], model: Any, out: OutputOptions) -> None:
    from edgeflash.runtime.structured import JSON_OBJECT, json_grammar

    fmt = body.get("response_format")
    if fmt is None:
        return
    if not isinstance(fmt, dict):
        raise invalid(f"response_format = {fmt!r:.60}: expected an object with a 'type'", "response_format",
                      "invalid_type")
    kind = fmt.get("type")
    if kind == "text":
        return
    if kind == "json_object":
        schema, where = JSON_OBJECT, "response_format"
    elif kind == "json_schema":
        spec = fmt.get("json_schema")
        if not isinstance(spec, dict):
            raise invalid("response_format.json_schema is required with type 'json_schema': an object with "
                          "'name' and 'schema'", "response_format.json_schema", "invalid_type")
        schema, where = spec.get("schema", {}), "response_format.json_schema.schema"
        if not isinstance(schema, dict):
            raise invalid(f"{where} = {schema!r:.60}: expected a JSON schema object", where, "invalid_type")
    else:
        raise invalid(f"response_format.type = {kind!r:.40}: expected 'text', 'json_object' or 'json_schema'",
                      "response_format.type")
    out.grammar, out.grammar_field = json_grammar(schema), where
    _compile(model, out)


def _tools(body: dict[str, Any], model: Any, out: OutputOptions) -> None:
    from edgeflash.runtime.structured.tool_calls import check_tools

    tools, choice = body.get("tools"), body.get("tool_choice")
    parallel = body.get("parallel_tool_calls", True)
    if parallel is not None and not isinstance(parallel, bool):
        raise invalid(f"parallel_tool_calls = {parallel!r:.40}: expected true or false", "parallel_tool_calls",
                      "invalid_type")
    if tools is None or tools == []:
        if choice not in (None, "none", "auto"):
            raise invalid("tool_choice needs tools", "tool_choice")
        return
    try:
        names = check_tools(tools)
    except UserError as e:
        raise invalid(str(e), "tools") from None
    if model.tool_call_format is None:
        raise invalid(f"tools: the chat template of {model.name} has no tool calling (serve a model whose template "
                      "renders tools, such as Qwen2.5)", "tools", "unsupported_value")
    if out.grammar is not None:
        raise invalid("tools and a JSON response_format cannot be combined", "response_format", "unsupported_value")
    if choice is None:
        choice = "auto"
    elif isinstance(choice, dict):
        function = choice.get("function")
        name = function.get("name") if isinstance(function, dict) else None
        if choice.get("type") != "function" or not isinstance(name, str):
            raise invalid(f"tool_choice = {choice!r:.60}: expected {{'type': 'function', 'function': "
                          "{'name': ...}}", "tool_choice", "invalid_type")
        if name not in names:
            raise invalid(f"tool_choice names {name!r:.40}, which is not among the tools", "tool_choice")
        choice = name
    elif choice not in TOOL_CHOICES:
        raise invalid(f"tool_choice = {choice!r:.40}: expected 'none', 'auto', 'required' or a function object",
                      "tool_choice")
    out.tools, out.tool_choice, out.parallel_tool_calls = list(tools), choice, parallel is not False
    out.grammar, out.grammar_field = model.tool_grammar(tools, choice, out.parallel_tool_calls), "tools"
    _compile(model, out)


def _compile(model: Any, out: OutputOptions) -> None:
    """Compile the grammar once now: a schema llguidance cannot follow is the client's 400."""
    try:
        constraint(model, out)
    except UserError as e:
        raise invalid(str(e), out.grammar_field) from None


def constraint(model: Any, out: OutputOptions) -> Any:
    """A fresh constraint for one choice (None when the output is free)."""
    if out.grammar is None:
        return None
    from edgeflash.runtime.structured import Constraint

    return Constraint(model.tokenizer, model.spec.vocab_size, out.grammar, what=out.grammar_field or "grammar")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
