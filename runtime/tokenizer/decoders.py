"""Decoders: token strings -> text (tokenizer.json `decoder`).

Two views of the same chain:
- `decode(tokens)` follows the reference chain exactly, including how invalid byte sequences
  turn into U+FFFD, so that `Tokenizer.decode` equals the reference tokenizer's decode.
- `token_bytes(token, first)` gives the raw bytes one token contributes to the text, so that a
  stream of tokens can be turned into text one token at a time and stop strings can be matched
  on bytes. `first` marks the first token of a text, which some chains treat differently (a
  SentencePiece prefix space is dropped there).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from .byte_level import unspell
from .normalizers import replacer, string_or_regex

Piece = str | bytes


def _byte_token(token: str) -> int | None:
    """The byte a `<0xXX>` token stands for, or None."""
    if len(token) == 6 and token.startswith("<0x") and token.endswith(">"):
        try:
            return int(token[3:5], 16)
        except ValueError:
            return None
    return None


class Step:
    """One decoder of a chain. `fuses` says the step joins all tokens into one string."""

    fuses = False

    def decode(self, tokens: list[str]) -> list[str]:
        raise NotImplementedError

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        """This step applied to one token; whole_text says an earlier step has fused the tokens,
        so a position-dependent step sees the token as part of one text."""
        raise NotImplementedError


class Replace(Step):
    def __init__(self, spec: dict[str, Any], where: str) -> None:
        pattern = string_or_regex(spec.get("pattern"), f"{where}.pattern")
        content = spec.get("content")
        if not isinstance(content, str):
            raise ValueError(f"{where}.content = {content!r} is not a string")
        self._apply: Callable[[str], str] = replacer(spec["pattern"], pattern, content)

    def decode(self, tokens: list[str]) -> list[str]:
        return [self._apply(token) for token in tokens]

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        return self._apply(piece) if isinstance(piece, str) else piece


class ByteFallback(Step):
    def decode(self, tokens: list[str]) -> list[str]:
        out: list[str] = []
        pending = bytearray()

        def flush() -> None:
            if pending:
                try:
                    out.append(pending.decode("utf-8"))
                except UnicodeDecodeError:
                    out.extend("\ufffd" for _ in pending)  # one replacement per byte, as the reference
                pending.clear()

        for token in tokens:
            byte = _byte_token(token)
            if byte is None:
                flush()
                out.append(token)
            else:
                pending.append(byte)
        flush()
        return out

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        if isinstance(piece, str):
            byte = _byte_token(piece)
            if byte is not None:
                return bytes([byte])
        return piece


class Fuse(Step):
    fuses = True

    def decode(self, tokens: list[str]) -> list[str]:
        return ["".join(tokens)]

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        return piece


class Strip(Step):
    def __init__(self, spec: dict[str, Any], where: str) -> None:
        self.content = spec.get("content")
        if not isinstance(self.content, str) or len(self.content) != 1:
            raise ValueError(f"{where}.content = {self.content!r} is not a single character")
        self.start, self.stop = int(spec.get("start", 0)), int(spec.get("stop", 0))

    def _strip(self, token: str, start: int, stop: int) -> str:
        begin = 0
        while begin < min(start, len(token)) and token[begin] == self.content:
            begin += 1
        end = len(token)
        while len(token) - end < min(stop, len(token)) and end > begin and token[end - 1] == self.content:
            end -= 1
        return token[begin:end]

    def decode(self, tokens: list[str]) -> list[str]:
        return [self._strip(token, self.start, self.stop) for token in tokens]

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        if isinstance(piece, bytes):
            return piece
        if whole_text:  # stripping the ends of the whole text: only its start is known here
            return self._strip(piece, self.start, 0) if first else piece
        return self._strip(piece, self.start, self.stop)


class Metaspace(Step):
    def __init__(self, spec: dict[str, Any], where: str) -> None:
        self.replacement = spec.get("replacement", "\u2581")
        if not isinstance(self.replacement, str) or len(self.replacement) != 1:
            raise ValueError(f"{where}.replacement = {self.replacement!r} is not a single character")
        scheme = spec.get("prepend_scheme", "always")
        self.drops_first = scheme != "never" and spec.get("add_prefix_space") is not False

    def _apply(self, token: str, first: bool) -> str:
        # The reference drops every replacement character of the first token, not just one.
        return token.replace(self.replacement, "" if first and self.drops_first else " ")

    def decode(self, tokens: list[str]) -> list[str]:
        return [self._apply(token, index == 0) for index, token in enumerate(tokens)]

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        return self._apply(piece, first) if isinstance(piece, str) else piece


class ByteLevel(Step):
    fuses = True

    def decode(self, tokens: list[str]) -> list[str]:
        return [b"".join(unspell(token) for token in tokens).decode("utf-8", errors="replace")]

    def token_piece(self, piece: Piece, first: bool, whole_text: bool) -> Piece:
        return unspell(piece) if isinstance(piece, str) else piece


_STEPS: dict[str, Callable[[dict[str, Any], str], Step]] = {
    "Replace": Replace,
    "ByteFallback": lambda spec, where: ByteFallback(),
    "Fuse": lambda spec, where: Fuse(),
    "Strip": Strip,
    "Metaspace": Metaspace,
    "ByteLevel": lambda spec, where: ByteLevel(),
}


class Decoder:
    def __init__(self, steps: list[Step]) -> None:
        self.steps = steps

    def decode(self, tokens: list[str]) -> str:
        for step in self.steps:
            tokens = step.decode(tokens)
        return "".join(tokens)

    def token_bytes(self, token: str, first: bool) -> bytes:
        piece: Piece = token
        whole_text = False
        for step in self.steps:
            piece = step.token_piece(piece, first, whole_text)
            whole_text = whole_text or step.fuses
        return piece if isinstance(piece, bytes) else piece.encode("utf-8")


def _flatten(spec: Any, where: str) -> list[tuple[dict[str, Any], str]]:
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "Sequence":
        steps = spec.get("decoders")
        if not isinstance(steps, list):
            raise ValueError(f"{where}.decoders = {steps!r} is not a list")
        return [item for index, step in enumerate(steps) for item in _flatten(step, f"{where}.decoders[{index}]")]
    if kind not in _STEPS:
        raise ValueError(f"{where}.type = {kind!r} is not supported; expected one of {sorted(['Sequence', *_STEPS])}")
    return [(spec, where)]


def build_decoder(spec: dict[str, Any] | None, where: str = "decoder") -> Decoder:
    """No decoder joins the tokens as they are (the reference joins them with spaces, which no
    BPE model wants)."""
    if spec is None:
        return Decoder([Fuse()])
    return Decoder([_STEPS[step["type"]](step, step_where) for step, step_where in _flatten(spec, where)])
