"""Pre-tokenizers: cut normalized text into the words BPE encodes one at a time
(tokenizer.json `pre_tokenizer`).

A piece is (text, at_start): at_start says the piece begins at the very start of the input,
which Metaspace's `prepend_scheme: "first"` needs. Empty pieces are dropped.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import regex

from .byte_level import spell_bytes
from .normalizers import compile_pattern, string_or_regex

Piece = tuple[str, bool]
PreTokenizer = Callable[[Piece], list[Piece]]

GPT2_SPLIT = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
_GPT2_SPLIT_RE = regex.compile(GPT2_SPLIT)

BEHAVIORS = ("Removed", "Isolated", "MergedWithPrevious", "MergedWithNext", "Contiguous")


def _spans(text: str, pattern: regex.Pattern, invert: bool = False) -> list[tuple[int, int, bool]]:
    """The whole text as consecutive (start, end, is_delimiter) spans."""
    spans: list[tuple[int, int, bool]] = []
    done = 0
    for match in pattern.finditer(text):
        start, end = match.span()
        if done != start:
            spans.append((done, start, invert))
        spans.append((start, end, not invert))
        done = end
    if done != len(text):
        spans.append((done, len(text), invert))
    return spans


def _apply_behavior(spans: list[tuple[int, int, bool]], behavior: str) -> list[tuple[int, int]]:
    """Which (start, end) slices survive a split with the given delimiter behavior."""
    if behavior == "Removed":
        return [(start, end) for start, end, is_delimiter in spans if not is_delimiter]
    if behavior == "Isolated":
        return [(start, end) for start, end, _ in spans]
    slices: list[list[int]] = []
    if behavior == "MergedWithNext":
        previous = False
        for start, end, is_delimiter in reversed(spans):
            if is_delimiter and not previous and slices:
                slices[-1][0] = start
            else:
                slices.append([start, end])
            previous = is_delimiter
        slices.reverse()
        return [(start, end) for start, end in slices]
    previous = False
    for start, end, is_delimiter in spans:
        # MergedWithPrevious glues a delimiter to the piece before it; Contiguous glues runs of
        # the same kind together.
        glue = (is_delimiter and not previous) if behavior == "MergedWithPrevious" else (is_delimiter == previous)
        if glue and slices:
            slices[-1][1] = end
        else:
            slices.append([start, end])
        previous = is_delimiter
    return [(start, end) for start, end in slices]


def _cut(piece: Piece, slices: list[tuple[int, int]]) -> list[Piece]:
    text, at_start = piece
    return [(text[start:end], at_start and start == 0) for start, end in slices if end > start]


def _split(spec: dict[str, Any], where: str) -> PreTokenizer:
    pattern = string_or_regex(spec.get("pattern"), f"{where}.pattern")
    behavior = spec.get("behavior")
    if behavior not in BEHAVIORS:
        raise ValueError(f"{where}.behavior = {behavior!r} is not one of {BEHAVIORS}")
    invert = bool(spec.get("invert", False))
    return lambda piece: _cut(piece, _apply_behavior(_spans(piece[0], pattern, invert), behavior))


def _byte_level(spec: dict[str, Any], where: str) -> PreTokenizer:
    add_prefix_space = bool(spec.get("add_prefix_space", True))
    use_regex = bool(spec.get("use_regex", True))

    def run(piece: Piece) -> list[Piece]:
        text, at_start = piece
        if add_prefix_space and not text.startswith(" "):
            text = " " + text
        pieces = [(text, at_start)]
        if use_regex:
            pieces = _cut(pieces[0], _apply_behavior(_spans(text, _GPT2_SPLIT_RE), "Isolated"))
        return [(spell_bytes(part), part_at_start) for part, part_at_start in pieces]

    return run


def _metaspace(spec: dict[str, Any], where: str) -> PreTokenizer:
    replacement = spec.get("replacement", "\u2581")
    if not isinstance(replacement, str) or len(replacement) != 1:
        raise ValueError(f"{where}.replacement = {replacement!r} is not a single character")
    scheme = spec.get("prepend_scheme", "always")
    if spec.get("add_prefix_space") is False:
        scheme = "never"
    if scheme not in ("always", "first", "never"):
        raise ValueError(f"{where}.prepend_scheme = {scheme!r} is not 'always', 'first' or 'never'")
    split = bool(spec.get("split", True))
    marker = compile_pattern(regex.escape(replacement))

    def run(piece: Piece) -> list[Piece]:
        text, at_start = piece
        text = text.replace(" ", replacement)
        if not text.startswith(replacement) and (scheme == "always" or (scheme == "first" and at_start)):
            text = replacement + text
        if not split:
            return [(text, at_start)] if text else []
        return _cut((text, at_start), _apply_behavior(_spans(text, marker), "MergedWithNext"))

    return run


def _digits(spec: dict[str, Any], where: str) -> PreTokenizer:
    behavior = "Isolated" if spec.get("individual_digits", False) else "Contiguous"
    digit = compile_pattern(r"\p{N}")
    return lambda piece: _cut(piece, _apply_behavior(_spans(piece[0], digit), behavior))


def _whitespace(spec: dict[str, Any], where: str) -> PreTokenizer:
    words = compile_pattern(r"\w+|[^\w\s]+")
    return lambda piece: _cut(piece, _apply_behavior(_spans(piece[0], words, invert=True), "Removed"))


def _whitespace_split(spec: dict[str, Any], where: str) -> PreTokenizer:
    spaces = compile_pattern(r"\s+")
    return lambda piece: _cut(piece, _apply_behavior(_spans(piece[0], spaces), "Removed"))


def _sequence(spec: dict[str, Any], where: str) -> PreTokenizer:
    steps = spec.get("pretokenizers")
    if not isinstance(steps, list):
        raise ValueError(f"{where}.pretokenizers = {steps!r} is not a list")
    built = [build_pre_tokenizer(step, f"{where}.pretokenizers[{index}]") for index, step in enumerate(steps)]

    def run(piece: Piece) -> list[Piece]:
        pieces = [piece]
        for step in built:
            pieces = [part for current in pieces for part in step(current)]  # type: ignore[misc]
        return pieces

    return run


_BUILDERS: dict[str, Callable[[dict[str, Any], str], PreTokenizer]] = {
    "Sequence": _sequence,
    "Split": _split,
    "ByteLevel": _byte_level,
    "Metaspace": _metaspace,
    "Digits": _digits,
    "Whitespace": _whitespace,
    "WhitespaceSplit": _whitespace_split,
}


def build_pre_tokenizer(spec: dict[str, Any] | None, where: str = "pre_tokenizer") -> PreTokenizer | None:
    if spec is None:
        return None
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind not in _BUILDERS:
        raise ValueError(f"{where}.type = {kind!r} is not supported; expected one of {sorted(_BUILDERS)}")
    return _BUILDERS[kind](spec, where)
