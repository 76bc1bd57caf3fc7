"""Added tokens: strings matched whole in the text before any other processing.

Control tokens such as `<start_of_turn>` or `<|im_start|>` and user-defined tokens such as
Gemma's runs of newlines are cut out of the text first, so BPE never splits them. Matching is
leftmost-longest: the earliest match wins, and the longest token among those starting there.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

import regex

_END = ""  # trie key marking "a token ends here" (no character is the empty string)
_WORD_AT_END = regex.compile(r"\w$")
_WORD_AT_START = regex.compile(r"\w")  # used with match(text, pos)
_SPACES_AT_END = regex.compile(r"\s*$")
_SPACES_AT_START = regex.compile(r"\s*")  # used with match(text, pos): anchored there


@dataclass(frozen=True)
class AddedToken:
    id: int
    content: str
    special: bool = False  # special tokens are skipped by decode(skip_special=True)
    normalized: bool = False  # matched in the normalized text instead of the raw text
    lstrip: bool = False  # swallow whitespace on the left
    rstrip: bool = False  # swallow whitespace on the right
    single_word: bool = False  # only match when not inside a word

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str) -> AddedToken:
        try:
            token_id, content = data["id"], data["content"]
        except (KeyError, TypeError):
            raise ValueError(f"{where}: an added token needs 'id' and 'content', got {data!r}") from None
        if not isinstance(token_id, int) or token_id < 0 or not isinstance(content, str):
            raise ValueError(f"{where}: added token id {token_id!r} / content {content!r} is not an int >= 0 / a string")
        flags = {name: bool(data.get(name, False)) for name in ("special", "lstrip", "rstrip", "single_word")}
        return cls(id=token_id, content=content, normalized=bool(data.get("normalized", not flags["special"])), **flags)


class AddedTokenMatcher:
    """Finds added tokens in a string (a character trie; no regex alternation of thousands)."""

    def __init__(self, tokens: list[tuple[str, AddedToken]]) -> None:
        # `tokens` pairs the string to look for with its token (they differ for normalized tokens).
        self._root: dict[str, Any] = {}
        first_chars: set[str] = set()
        for pattern, token in tokens:
            if not pattern:
                continue
            node = self._root
            for char in pattern:
                node = node.setdefault(char, {})
            node[_END] = token
            first_chars.add(pattern[0])
        self._first_char = (
            regex.compile("[" + "".join(regex.escape(char) for char in sorted(first_chars)) + "]") if first_chars else None
        )

    def __bool__(self) -> bool:
        return self._first_char is not None

    def _leftmost_longest(self, text: str) -> list[tuple[int, int, AddedToken]]:
        found: list[tuple[int, int, AddedToken]] = []
        if self._first_char is None:
            return found
        search, length, position = self._first_char.search, len(text), 0
        while True:
            hit = search(text, position)
            if hit is None:
                return found
            start = hit.start()
            node, cursor, best = self._root, start, None
            while cursor < length:
                node = node.get(text[cursor])
                if node is None:
                    break
                cursor += 1
                if _END in node:
                    best = (start, cursor, node[_END])
            if best is None:
                position = start + 1
            else:
                found.append(best)
                position = best[1]

    def split(self, text: str, *, parse_special: bool) -> list[tuple[str, AddedToken | None]]:
        """Cut `text` into (piece, token) parts: token is None for plain text pieces.

        With parse_special=False, special tokens are not recognised (their text is encoded as
        ordinary text) while non-special added tokens still are.
        """
        parts: list[tuple[str, AddedToken | None]] = []
        done = 0
        for start, stop, token in self._leftmost_longest(text):
            if token.special and not parse_special:
                continue
            if token.single_word:
                left_ok = start == 0 or not _WORD_AT_END.search(text, 0, start)
                right_ok = stop == len(text) or not _WORD_AT_START.match(text, stop)
                if not (left_ok and right_ok):
                    continue
            if token.lstrip:
                start = max(_SPACES_AT_END.search(text, 0, start).start(), done)
            if token.rstrip:
                stop = _SPACES_AT_START.match(text, stop).end()
            if done < start:
                parts.append((text[done:start], None))
            parts.append((text[start:stop], token))
            done = stop
        if done < len(text) or not parts:
            parts.append((text[done:], None))
        return parts
