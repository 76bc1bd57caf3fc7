"""Turn an OpenAI request body into a checked `GenerationRequest`, or an `ApiError` naming the field.

Fields that would change what the client gets back in ways this server cannot honour (n > 1,
logprobs, tools, penalties other than 0...) are refused rather than silently ignored; fields
that do not change the output (user, metadata, store...) are accepted and ignored.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.server.config import ServerConfig
from edgeflash.server.errors import ApiError, invalid

CHAT_ROLES = {"system": "system", "developer": "system", "user": "user", "assistant": "assistant"}
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


def served_model(body: dict[str, Any], config: ServerConfig, model_id: str) -> str:
    """The served id if the request names this model (or none); 404 for any other name."""
    name = body.get("model", model_id)
    if name is None:
        return model_id
    if not isinstance(name, str):
        raise invalid(f"model = {name!r:.60}: expected a string", "model", "invalid_type")
    if name not in (model_id, *config.aliases):
        raise ApiError(404, f"The model '{name}' does not exist; this server serves '{model_id}'",
                       param="model", code="model_not_found")
    return model_id


def parse_chat(body: dict[str, Any], model: Any, config: ServerConfig, model_id: str) -> GenerationRequest:
    served = served_model(body, config, model_id)
    messages = _messages(body)
    _refuse_unsupported(body, chat=True)
    try:
        ids = model.chat_prompt(messages)
    except (UserError, ValueError) as e:
        raise invalid(f"messages cannot be rendered with the model's chat format: {e}", "messages") from None
    _check_prompt_length(ids, model, config, "messages")
    max_tokens = _max_tokens(body, config, ("max_completion_tokens", "max_tokens"))
    return GenerationRequest("chat", served, ids, max_tokens, _sampling(body, config), _stop(body, config),
                             *_stream(body))


def parse_completion(body: dict[str, Any], model: Any, config: ServerConfig, model_id: str) -> GenerationRequest:
    served = served_model(body, config, model_id)
    ids = _prompt_ids(body, model)
    _refuse_unsupported(body, chat=False)
    _check_prompt_length(ids, model, config, "prompt")
    max_tokens = _max_tokens(body, config, ("max_tokens",))
    return GenerationRequest("completion", served, ids, max_tokens, _sampling(body, config), _stop(body, config),
                             *_stream(body))


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
        if m.get("tool_calls") or m.get("function_call"):
            raise invalid(f"{param}: tool calls are not supported by this server", f"{param}.tool_calls")
        out.append({"role": CHAT_ROLES[role], "content": _content_text(m.get("content"), f"{param}.content")})
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
    d = config.sampling_defaults
    return {
        "temperature": _number(body, "temperature", d.get("temperature", 0.0), lambda v: 0 <= v <= 2, "in [0, 2]"),
        "top_p": _number(body, "top_p", d.get("top_p", 1.0), lambda v: 0 < v <= 1, "in (0, 1]"),
        "top_k": _integer(body, "top_k", d.get("top_k", 0), lambda v: v >= 0, ">= 0"),
        "min_p": _number(body, "min_p", d.get("min_p", 0.0), lambda v: 0 <= v < 1, "in [0, 1)"),
        "repetition_penalty": _number(body, "repetition_penalty", d.get("repetition_penalty", 1.0),
                                      lambda v: 0 < v <= 10, "in (0, 10]"),
        "seed": _integer(body, "seed", d.get("seed"), lambda v: True, ""),
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
    "n": (lambda v: v == 1 and _is_int(v), "only n = 1"),
    "best_of": (lambda v: v == 1 and _is_int(v), "only best_of = 1"),
    "logprobs": (lambda v: v is False or v == 0, "no logprobs"),
    "top_logprobs": (lambda v: v == 0, "no logprobs"),
    "echo": (lambda v: v is False, "no echo"),
    "suffix": (lambda v: v == "", "no suffix (insertion)"),
    "presence_penalty": (lambda v: v == 0, "presence_penalty 0 (use repetition_penalty)"),
    "frequency_penalty": (lambda v: v == 0, "frequency_penalty 0 (use repetition_penalty)"),
    "logit_bias": (lambda v: v == {}, "no logit_bias"),
    "tools": (lambda v: v == [], "no tools"),
    "functions": (lambda v: v == [], "no functions"),
    "tool_choice": (lambda v: v == "none", "tool_choice 'none'"),
    "response_format": (lambda v: isinstance(v, dict) and v.get("type") == "text", "response_format 'text'"),
}
_CHAT_ONLY = {"tools", "functions", "tool_choice", "response_format", "top_logprobs"}
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
