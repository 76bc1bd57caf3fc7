"""Chat prompts: the model's own Jinja chat template when it carries one, else a turn format
its vocabulary shows it was trained on (Gemma turns, ChatML), else a plain transcript.

Templates come from model files, so they are untrusted code: they run in Jinja's immutable
sandbox with the helpers chat templates expect (`raise_exception`, `strftime_now`, a `tojson`
that does not HTML-escape) and with `bos_token`, `eos_token`, `add_generation_prompt`.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from functools import lru_cache
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .tokenizer import Tokenizer

CHAT_FORMATS = ("template", "gemma", "chatml", "plain")


def detect_chat_format(chat_template: str | None, has_token: Callable[[str], bool]) -> str:
    if chat_template:
        return "template"
    if has_token("<start_of_turn>") and has_token("<end_of_turn>"):
        return "gemma"
    if has_token("<|im_start|>") and has_token("<|im_end|>"):
        return "chatml"
    return "plain"


def _check_messages(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    checked = []
    for index, message in enumerate(messages):
        if not isinstance(message, Mapping) or not isinstance(message.get("role"), str):
            raise ValueError(f"chat message {index} = {message!r:.80} is not a {{'role': str, 'content': ...}} mapping")
        checked.append(dict(message))
    return checked


def _text(message: Mapping[str, Any]) -> str:
    content = message.get("content")
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # [{"type": "text", "text": ...}, ...]
        return "".join(part.get("text", "") for part in content if isinstance(part, Mapping))
    raise ValueError(f"chat message content {content!r:.80} is not a string or a list of text parts")


@lru_cache(maxsize=8)
def _compile(template: str) -> Any:
    import jinja2
    import jinja2.ext
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message: str) -> None:
        raise jinja2.exceptions.TemplateError(message)

    def tojson(value: Any, ensure_ascii: bool = False, indent: int | None = None,
               separators: Any = None, sort_keys: bool = False) -> str:
        return json.dumps(value, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    try:
        return env.from_string(template)
    except jinja2.exceptions.TemplateSyntaxError as error:
        raise ValueError(f"chat_template does not compile: {error} (line {error.lineno})") from None


def _template_message(message: dict[str, Any]) -> dict[str, Any]:
    """A message as chat templates expect it. OpenAI clients send a tool call's arguments as JSON
    text, while templates write them with `tojson` (Qwen2.5, Hermes): they get the object, or the
    call would be written as a quoted string the model never saw in training."""
    calls = message.get("tool_calls")
    if not calls:
        return message
    fixed = []
    for call in calls:
        if isinstance(call, Mapping) and isinstance(call.get("function"), Mapping):
            function = dict(call["function"])
            if isinstance(function.get("arguments"), str):
                try:
                    function["arguments"] = json.loads(function["arguments"])
                except json.JSONDecodeError:
                    pass  # written as the text it is
            call = {**call, "function": function}
        fixed.append(call)
    return {**message, "tool_calls": fixed}


def _render_template(tok: Tokenizer, messages: list[dict[str, Any]], add_generation_prompt: bool,
                     extra: Mapping[str, Any]) -> str:
    import jinja2

    variables = {name: value for name, value in tok.special_tokens.items() if value is not None}
    variables.update(extra)
    messages = [_template_message(m) for m in messages]
    variables.update(messages=messages, add_generation_prompt=add_generation_prompt)
    try:
        return _compile(tok.chat_template).render(**variables)
    except jinja2.exceptions.TemplateError as error:
        raise ValueError(f"chat_template failed: {error}") from None


def _render_gemma(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    system = ""
    if messages and messages[0]["role"] == "system":
        system, messages = _text(messages[0]) + "\n\n", messages[1:]
    parts = []
    for index, message in enumerate(messages):
        role = {"assistant": "model"}.get(message["role"], message["role"])
        prefix = system if index == 0 else ""
        parts.append(f"<start_of_turn>{role}\n{prefix}{_text(message).strip()}<end_of_turn>\n")
    if add_generation_prompt:
        parts.append("<start_of_turn>model\n")
    return "".join(parts)


def _render_chatml(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    parts = [f"<|im_start|>{message['role']}\n{_text(message)}<|im_end|>\n" for message in messages]
    if add_generation_prompt:
        parts.append("<|im_start|>assistant\n")
    return "".join(parts)


def _render_plain(messages: list[dict[str, Any]], add_generation_prompt: bool) -> str:
    parts = [f"{message['role'].capitalize()}: {_text(message)}\n" for message in messages]
    if add_generation_prompt:
        parts.append("Assistant:")
    return "".join(parts)


def render_chat(tok: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True,
                **template_variables: Any) -> str:
    """The prompt text for a conversation, in the format `tok.chat_format` names.

    `template_variables` reach the model's own template: `tools=[...]` (OpenAI's tool objects)
    renders the tools the way the model was trained to see them. The text holds no BOS of its own unless the model's template writes one; encode it with
    `chat_ids` to get BOS exactly once.
    """
    checked = _check_messages(messages)
    if tok.chat_format == "template":
        return _render_template(tok, checked, add_generation_prompt, template_variables)
    if tok.chat_format == "gemma":
        return _render_gemma(checked, add_generation_prompt)
    if tok.chat_format == "chatml":
        return _render_chatml(checked, add_generation_prompt)
    return _render_plain(checked, add_generation_prompt)


def chat_ids(tok: Tokenizer, messages: Sequence[Mapping[str, Any]], add_generation_prompt: bool = True) -> list[int]:
    """Token ids of the rendered conversation: the model's default BOS is added unless the
    template already wrote it."""
    ids = tok.encode(render_chat(tok, messages, add_generation_prompt), add_bos=False)
    prefix = tok.encode("", add_bos=None, add_eos=False)
    if prefix and ids[: len(prefix)] != prefix:
        ids = prefix + ids
    return ids
