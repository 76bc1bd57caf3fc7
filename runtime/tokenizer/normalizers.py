"""Normalizers: text -> text rewrites applied before splitting (tokenizer.json `normalizer`).

Specs use the tokenizer.json vocabulary of types, so a file's normalizer and the one built for
a GGUF vocabulary are described the same way.
"""

from __future__ import annotations

import unicodedata
from collections.abc import Callable
from typing import Any

import regex

Normalizer = Callable[[str], str]


def compile_pattern(pattern: str) -> regex.Pattern:
    """A compiled regex that is not kept in the `regex` module's cache: a tokenizer is built
    beside a model's metadata, and a cached copy would be a long-lived object made among the
    metadata's objects (see `packing`). The tokenizer holds its patterns itself."""
    return regex.compile(pattern, cache_pattern=False)


def string_or_regex(pattern: Any, where: str) -> regex.Pattern:
    """A tokenizer.json pattern `{"String": s}` or `{"Regex": r}` as a compiled regex."""
    if isinstance(pattern, dict) and len(pattern) == 1:
        kind, value = next(iter(pattern.items()))
        if kind == "String" and isinstance(value, str):
            return compile_pattern(regex.escape(value))
        if kind == "Regex" and isinstance(value, str):
            try:
                return compile_pattern(value)
            except regex.error as error:
                raise ValueError(f"{where}: regex {value!r} does not compile: {error}") from None
    raise ValueError(f"{where}: pattern {pattern!r} is not {{'String': ...}} or {{'Regex': ...}}")


def replacer(pattern: Any, compiled: regex.Pattern, content: str) -> Callable[[str], str]:
    """A function replacing every match of a tokenizer.json pattern (`compiled` is
    `string_or_regex(pattern)`) by `content`. A plain string pattern uses str.replace, which
    does the same as the escaped regex, faster."""
    if isinstance(pattern, dict) and "String" in pattern:
        literal = pattern["String"]
        return lambda text: text.replace(literal, content)
    return lambda text: compiled.sub(lambda _: content, text)


def _field(spec: dict[str, Any], name: str, kind: type | tuple[type, ...], where: str) -> Any:
    if name not in spec or not isinstance(spec[name], kind):
        raise ValueError(f"{where}.{name} = {spec.get(name)!r} is missing or of the wrong type")
    return spec[name]


def _replace(spec: dict[str, Any], where: str) -> Normalizer:
    pattern = string_or_regex(spec.get("pattern"), f"{where}.pattern")
    content = _field(spec, "content", str, where)
    return replacer(spec["pattern"], pattern, content)


def _prepend(spec: dict[str, Any], where: str) -> Normalizer:
    prefix = _field(spec, "prepend", str, where)
    return lambda text: prefix + text if text else text


def _strip(spec: dict[str, Any], where: str) -> Normalizer:
    left, right = bool(spec.get("strip_left", True)), bool(spec.get("strip_right", True))
    lead, trail = compile_pattern(r"^\s+"), compile_pattern(r"\s+$")

    def strip(text: str) -> str:
        if left:
            text = lead.sub("", text)
        if right:
            text = trail.sub("", text)
        return text

    return strip


def _unicode(form: str) -> Callable[[dict[str, Any], str], Normalizer]:
    return lambda spec, where: lambda text: unicodedata.normalize(form, text)


def _sequence(spec: dict[str, Any], where: str) -> Normalizer:
    steps = [build_normalizer(step, f"{where}.normalizers[{index}]")
             for index, step in enumerate(_field(spec, "normalizers", list, where))]

    def run(text: str) -> str:
        for step in steps:
            text = step(text)
        return text

    return run


_BUILDERS: dict[str, Callable[[dict[str, Any], str], Normalizer]] = {
    "Sequence": _sequence,
    "Replace": _replace,
    "Prepend": _prepend,
    "Strip": _strip,
    "Lowercase": lambda spec, where: str.lower,
    "NFC": _unicode("NFC"),
    "NFD": _unicode("NFD"),
    "NFKC": _unicode("NFKC"),
    "NFKD": _unicode("NFKD"),
}


def build_normalizer(spec: dict[str, Any] | None, where: str = "normalizer") -> Normalizer | None:
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in _BUILDERS:
        raise ValueError(f"{where}.type = {kind!r} is not supported; expected one of {sorted(_BUILDERS)}")
    return _BUILDERS[kind](spec, where)
