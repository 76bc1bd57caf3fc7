"""Turn an OpenAI request body into a checked `GenerationRequest`, or an `ApiError` naming the field.

Fields that would change what the client gets back in ways this server cannot honour (echo,
suffix, logit_bias, best_of > 1...) are refused rather than silently ignored; fields that do not
change the output (user, metadata, store...) are accepted and ignored. What shapes the output
beyond sampling (n, logprobs, response_format, tools) is read in `output_options`.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.runtime.sampler import SAMPLING_DEFAULTS
from edgeflash.server.config import ServerConfig
from edgeflash.server.errors import invalid
from edgeflash.server.output_options import OutputOptions, chat_output_options, completion_output_options

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant", "tool": "tool"}
MAX_STOP_STRINGS = 4


@dataclass
class GenerationRequest:
    kind: str  # "chat" or "completion"
    model_id: str
    prompt_ids: list[int]
    max_tokens: int
    sampling: dict[str, Any]  # keyword arguments of Model.generation besides stop
    stop: list[str] = field(default_factory=list)
    stream: bool = False
    include_usage: bool = False  # stream_options.include_usage: a last chunk with usage
    output: OutputOptions = field(default_factory=OutputOptions)


def served_model(body: dict[str, Any], model_id: str) -> str:
    """The served id, whatever name the request gives: one model is loaded, so a client written
    for another server's model name (gpt-4o-mini, ...) works unchanged, as with llama-server."""
    name = body.get("model")
    if name is not None and not isinstance(name, str):
        raise invalid(f"model = {name!r:.60}: expected a string", "model", "invalid_type")
    return model_id


def parse_chat(body: dict[str, Any], model: Any, config: ServerConfig, model_id: str) -> GenerationRequest:
    served = served_model(body, model_id)
    messages = _messages(body)
    _refuse_unsupported(body, chat=True)
    output = chat_output_options(body, model)
    try:
        ids = model.chat_prompt(messages, output.tools)
    except (UserError, ValueError) as e:
        raise invalid(f"messages cannot be rendered with the model's chat format: {e}", "messages") from None
    _check_prompt_length(ids, model, config, "messages")
    max_tokens = _max_tokens(body, config, ("max_completion_tokens", "max_tokens"))
    return GenerationRequest("chat", served, ids, max_tokens, _sampling(body, config), _stop(body, config),
                             *_stream(body), output)


def parse_completion(body: dict[str, Any], model: Any, config: ServerConfig, model_id: str) -> GenerationRequest:
    served = served_model(body, model_id)
    ids = _prompt_ids(body, model)
    _refuse_unsupported(body, chat=False)
    output = completion_output_options(body, model)
    _check_prompt_length(ids, model, config, "prompt")
    max_tokens = _max_tokens(body, config, ("max_tokens",))
    return GenerationRequest("completion", served, ids, max_tokens, _sampling(body, config), _stop(body, config),
                             *_stream(body), output)


def _messages(body: dict[str, Any]) -> list[dict[str, str]]:
    if "messages" not in body:
        raise invalid("messages is required: a list of {'role', 'content'} objects", "messages",
                      "missing_required_parameter")
    raw = body["messages"]
    if not isinstance(raw, list) or not raw:
        raise invalid(f"messages = {raw!r:.60}: expected a non-empty list of messages", "messages", "invalid_type")
    out = []
    for i, m in enumerate(raw):
        param = f"messages[{i}]"
        if not isinstance(m, dict):
            raise invalid(f"{param} = {m!r:.60}: expected an object with 'role' and 'content'", param, "invalid_type")
        role = m.get("role")
        if role not in CHAT_ROLES:
            expected = ", ".join(repr(r) for r in CHAT_ROLES)
            raise invalid(f"{param}.role = {role!r:.40}: expected one of {expected}", f"{param}.role")
        if m.get("function_call"):
            raise invalid(f"{param}.function_call: the legacy function_call is not supported; send tool_calls",
                          f"{param}.function_call", "unsupported_value")
        message: dict[str, Any] = {"role": CHAT_ROLES[role]}
        calls = m.get("tool_calls")
        if calls is not None and role != "assistant":
            raise invalid(f"{param}.tool_calls: only assistant messages carry tool calls", f"{param}.tool_calls")
        if calls:
            message["tool_calls"] = _tool_calls(calls, f"{param}.tool_calls")
            content = m.get("content")
            message["content"] = None if content is None else _content_text(content, f"{param}.content")
        else:
            message["content"] = _content_text(m.get("content"), f"{param}.content")
        if role == "tool":
            call_id = m.get("tool_call_id")
            if not isinstance(call_id, str):
                raise invalid(f"{param}.tool_call_id = {call_id!r:.40}: a tool message needs the id of the call it "
                              "answers", f"{param}.tool_call_id", "invalid_type")
            message["tool_call_id"] = call_id
        out.append(message)
    return out


def _tool_calls(calls: Any, param: str) -> list[dict[str, Any]]:
    if not isinstance(calls, list):
        raise invalid(f"{param} = {calls!r:.60}: expected a list of tool calls", param, "invalid_type")
    out = []
    for j, call in enumerate(calls):
        where = f"{param}[{j}]"
        function = call.get("function") if isinstance(call, dict) else None
        if not isinstance(function, dict) or not isinstance(function.get("name"), str):
            raise invalid(f"{where} = {call!r:.60}: expected {{'id', 'type': 'function', 'function': {{'name', "
                          "'arguments'}}}}", where, "invalid_type")
        arguments = function.get("arguments", "{}")
        if not isinstance(arguments, (str, dict)):
            raise invalid(f"{where}.function.arguments = {arguments!r:.40}: expected a JSON string",
                          f"{where}.function.arguments", "invalid_type")
        out.append({"id": call.get("id"), "type": "function",
                    "function": {"name": function["name"], "arguments": arguments}})
    return out


def _content_text(content: Any, param: str) -> str:
    """A message's text: a string, or a list of {"type": "text", "text": ...} parts joined."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = []
        for j, part in enumerate(content):
            if not isinstance(part, dict) or part.get("type") != "text" or not isinstance(part.get("text"), str):
                raise invalid(f"{param}[{j}] = {part!r:.60}: only text parts ({{'type': 'text', 'text': str}}) "
                              "are supported", f"{param}[{j}]")
            texts.append(part["text"])
        return "".join(texts)
    raise invalid(f"{param} = {content!r:.60}: expected a string or a list of text parts", param, "invalid_type")


def _prompt_ids(body: dict[str, Any], model: Any) -> list[int]:
    """`prompt` as a string, a one-string list, or a list of token ids (batches are refused)."""
    if "prompt" not in body:
        raise invalid("prompt is required: a string or a list of token ids", "prompt", "missing_required_parameter")
    prompt = body["prompt"]
    if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], (str, list)):
        prompt = prompt[0]
    if isinstance(prompt, str):
        if not prompt:
            raise invalid("prompt is empty: expected at least one character", "prompt")
        return model.encode(prompt)
    if isinstance(prompt, list) and prompt and all(_is_int(t) for t in prompt):
        vocab = model.spec.vocab_size
        bad = [t for t in prompt if not 0 <= t < vocab]
        if bad:
            raise invalid(f"prompt token id {bad[0]} is outside the vocabulary 0..{vocab - 1}", "prompt")
        return [int(t) for t in prompt]
    if isinstance(prompt, list) and len(prompt) > 1 and all(isinstance(p, str) for p in prompt):
        raise invalid(f"prompt is a batch of {len(prompt)} strings: this server completes one prompt per "
                      "request", "prompt", "unsupported_value")
    raise invalid(f"prompt = {prompt!r:.60}: expected a non-empty string or list of token ids", "prompt",
                  "invalid_type")


def _check_prompt_length(ids: list[int], model: Any, config: ServerConfig, param: str) -> None:
    context = model.engine.context_length
    limit = min(config.max_prompt_tokens, context - 1)
    if len(ids) > limit:
        why = "this server's --max-prompt-tokens" if limit == config.max_prompt_tokens else "the context length - 1"
        raise invalid(f"the prompt has {len(ids)} tokens; the limit is {limit} ({why})", param,
                      "context_length_exceeded")


def _max_tokens(body: dict[str, Any], config: ServerConfig, names: tuple[str, ...]) -> int:
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if not _is_int(value):
            raise invalid(f"{name} = {value!r:.40}: expected an integer", name, "invalid_type")
        if value < 1:
            raise invalid(f"{name} = {value}: expected an integer >= 1", name)
        if value > config.max_tokens:
            raise invalid(f"{name} = {value}: this server allows at most {config.max_tokens} "
                          "(its --max-tokens)", name)
        return value
    return config.max_tokens


def _sampling(body: dict[str, Any], config: ServerConfig) -> dict[str, Any]:
    """Sampling fields; omitted ones take the server's defaults (its flags over SAMPLING_DEFAULTS)."""
    d = {**SAMPLING_DEFAULTS, "seed": None, **config.sampling_defaults}
    return {
        "temperature": _number(body, "temperature", d["temperature"], lambda v: 0 <= v <= 2, "in [0, 2]"),
        "top_p": _number(body, "top_p", d["top_p"], lambda v: 0 < v <= 1, "in (0, 1]"),
        "top_k": _integer(body, "top_k", d["top_k"], lambda v: v >= 0, ">= 0"),
        "min_p": _number(body, "min_p", d["min_p"], lambda v: 0 <= v < 1, "in [0, 1)"),
        "repetition_penalty": _number(body, "repetition_penalty", d["repetition_penalty"],
                                      lambda v: 0 < v <= 10, "in (0, 10]"),
        "frequency_penalty": _number(body, "frequency_penalty", d["frequency_penalty"], lambda v: -2 <= v <= 2,
                                     "in [-2, 2]"),
        "presence_penalty": _number(body, "presence_penalty", d["presence_penalty"], lambda v: -2 <= v <= 2,
                                    "in [-2, 2]"),
        "repeat_last_n": _integer(body, "repeat_last_n", d["repeat_last_n"], lambda v: v >= -1, ">= -1"),
        "seed": _integer(body, "seed", d["seed"], lambda v: True, ""),
    }


def _stop(body: dict[str, Any], config: ServerConfig) -> list[str]:
    stop = body.get("stop")
    if stop is None:
        return list(config.sampling_defaults.get("stop") or [])
    if isinstance(stop, str):
        stop = [stop]
    if not isinstance(stop, list) or not all(isinstance(s, str) for s in stop):
        raise invalid(f"stop = {stop!r:.60}: expected a string or a list of strings", "stop", "invalid_type")
    if len(stop) > MAX_STOP_STRINGS:
        raise invalid(f"stop has {len(stop)} strings: expected at most {MAX_STOP_STRINGS}", "stop")
    return [s for s in stop if s]


def _stream(body: dict[str, Any]) -> tuple[bool, bool]:
    stream = body.get("stream", False)
    if stream is None:
        stream = False
    if not isinstance(stream, bool):
        raise invalid(f"stream = {stream!r:.40}: expected true or false", "stream", "invalid_type")
    options = body.get("stream_options")
    if options is None:
        return stream, False
    if not isinstance(options, dict):
        raise invalid(f"stream_options = {options!r:.40}: expected an object", "stream_options", "invalid_type")
    if not stream:
        raise invalid("stream_options is only allowed when stream is true", "stream_options")
    usage = options.get("include_usage", False)
    if not isinstance(usage, bool):
        raise invalid(f"stream_options.include_usage = {usage!r:.40}: expected true or false",
                      "stream_options.include_usage", "invalid_type")
    return stream, usage


# field -> (is the value harmless?, what the message says is supported)
_UNSUPPORTED: dict[str, tuple[Callable[[Any], bool], str]] = {
    "best_of": (lambda v: v == 1 and _is_int(v), "only best_of = 1"),
    "echo": (lambda v: v is False, "no echo"),
    "suffix": (lambda v: v == "", "no suffix (insertion)"),
    "logit_bias": (lambda v: v == {}, "no logit_bias"),
    "functions": (lambda v: v == [], "no functions (send tools)"),
    "function_call": (lambda v: v == "none", "no function_call (send tool_choice)"),
}
_CHAT_ONLY = {"functions", "function_call"}
_COMPLETION_ONLY = {"echo", "suffix", "best_of"}


def _refuse_unsupported(body: dict[str, Any], chat: bool) -> None:
    for name, (harmless, supported) in _UNSUPPORTED.items():
        if name in (_COMPLETION_ONLY if chat else _CHAT_ONLY):
            continue
        value = body.get(name)
        if value is not None and not harmless(value):
            raise invalid(f"{name} = {value!r:.40} is not supported: this server supports {supported}", name,
                          "unsupported_value")


def _is_int(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _number(body: dict[str, Any], name: str, default: Any, ok: Callable[[float], bool], expected: str) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not _is_number(value):
        raise invalid(f"{name} = {value!r:.40}: expected a number {expected}", name, "invalid_type")
    if not ok(value):
        raise invalid(f"{name} = {value}: expected a number {expected}", name)
    return float(value)


def _integer(body: dict[str, Any], name: str, default: Any, ok: Callable[[int], bool], expected: str) -> Any:
    value = body.get(name)
    if value is None:
        return default
    if not _is_int(value):
        raise invalid(f"{name} = {value!r:.40}: expected an integer {expected}".rstrip(), name, "invalid_type")
    if not ok(value):
        raise invalid(f"{name} = {value}: expected an integer {expected}", name)
    return value
