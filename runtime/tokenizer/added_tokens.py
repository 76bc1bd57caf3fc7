"""Added tokens: strings matched whole in the text before any other processing.

Control tokens such as `<start_of_turn>` or `<|im_start|>` and user-defined tokens such as
Gemma's runs of newlines are cut out of the text first, so BPE never splits them. Matching is
leftmost-longest: the earliest match wins, and the longest token among those starting there.
"""

from __future__ import annotations

from array import array
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import regex

from .normalizers import compile_pattern
from .vocab import Vocabulary

_WORD_AT_END = regex.compile(r"\w$")
_WORD_AT_START = regex.compile(r"\w")  # used with match(text, pos)
_SPACES_AT_END = regex.compile(r"\s*$")
_SPACES_AT_START = regex.compile(r"\s*")  # used with match(text, pos): anchored there


@dataclass(frozen=True, slots=True)
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


_FLAGS = ("special", "normalized", "lstrip", "rstrip", "single_word")  # bit i of a flags byte
_HEAD = 4  # characters of a pattern that pick its group in AddedTokenMatcher
_TOKEN_CACHE_LIMIT = 256


class AddedTokenTable:
    """The added tokens of a tokenizer, in spec order, without an object per token (Gemma has
    over 6000): contents in a blob, ids and flags in arrays. `token(i)` rebuilds one."""

    __slots__ = ("_contents", "_flags", "_ids")

    def __init__(self, parts: dict[str, Any]) -> None:
        self._contents = Vocabulary(parts["contents"])
        self._ids: array = parts["ids"]  # [A] int64
        self._flags: array = parts["flags"]  # [A] uint8, bit i = _FLAGS[i]

    def parts(self) -> dict[str, Any]:
        return {"contents": self._contents.parts(), "ids": self._ids, "flags": self._flags}

    @classmethod
    def from_dicts(cls, entries: Sequence[Any], where: str = "added_tokens") -> tuple[AddedTokenTable, list[str]]:
        """The table of spec entries, and the entries' content strings (the same str objects)."""
        contents: list[str] = []
        ids, flags = array("q"), array("B")
        for index, entry in enumerate(entries):
            token = AddedToken.from_dict(entry, f"{where}[{index}]")
            contents.append(token.content)
            ids.append(token.id)
            flags.append(sum(1 << bit for bit, name in enumerate(_FLAGS) if getattr(token, name)))
        table = cls({"contents": Vocabulary.build(contents, indexed=False).parts(), "ids": ids, "flags": flags})
        return table, contents

    def __len__(self) -> int:
        return len(self._ids)

    def token(self, index: int) -> AddedToken:
        flags = self._flags[index]
        return AddedToken(self._ids[index], self._contents.text(index) or "",
                          **{name: bool(flags >> bit & 1) for bit, name in enumerate(_FLAGS)})

    def __iter__(self) -> Iterator[AddedToken]:
        return (self.token(index) for index in range(len(self)))

    def max_id(self) -> int:
        """The largest token id among the added tokens (-1 when there are none)."""
        return max(self._ids, default=-1)

    def id(self, index: int) -> int:
        return self._ids[index]

    def has_flag(self, index: int, name: str) -> bool:
        return bool(self._flags[index] >> _FLAGS.index(name) & 1)

    def ids_with_flag(self, name: str) -> np.ndarray:
        """[K] ids of the tokens that have flag `name`."""
        ids, flags = np.frombuffer(self._ids, dtype=np.int64), np.frombuffer(self._flags, dtype=np.uint8)
        return ids[(flags >> _FLAGS.index(name)) & 1 == 1]


class AddedTokenMatcher:
    """Finds added tokens in a string.

    Patterns sit in a compact hashed vocabulary (no trie of dicts, no regex alternation of
    thousands). They are grouped by their first `_HEAD` characters (shorter patterns form a
    group each): at a position where a pattern can start, the text's head picks the group and
    its lengths are tried longest first, then the shorter heads are, so the first hit is the
    longest match.
    """

    def __init__(self, parts: dict[str, Any], table: AddedTokenTable) -> None:
        self._table = table
        self._patterns = Vocabulary(parts["patterns"])
        self._entry_tokens: array = parts["tokens"]  # [P] uint32: index in `table` of each pattern's token
        # Head -> lengths of the patterns starting with it, longest first.
        self._lengths: dict[str, tuple[int, ...]] = {start: tuple(found) for start, found in parts["lengths"].items()}
        self._token_cache: dict[int, AddedToken] = {}  # the tokens matched lately, by table index
        first_chars = parts["first_chars"]
        self._first_char = (
            compile_pattern("[" + "".join(regex.escape(char) for char in first_chars) + "]") if first_chars else None
        )

    def parts(self) -> dict[str, Any]:
        return {"patterns": self._patterns.parts(), "tokens": self._entry_tokens,
                "lengths": {start: list(found) for start, found in self._lengths.items()},
                "first_chars": "".join(sorted({start[0] for start in self._lengths}))}

    @classmethod
    def build(cls, table: AddedTokenTable, patterns: Sequence[str], indices: Sequence[int]) -> AddedTokenMatcher:
        """patterns[k] is the string to look for, indices[k] its token's index in `table` (the
        string differs from the token's content for normalized tokens). A repeated string keeps
        the last token given for it; empty strings never match."""
        keep = [k for k, pattern in enumerate(patterns) if pattern]
        if len(keep) < len(patterns):
            patterns, indices = [patterns[k] for k in keep], [indices[k] for k in keep]
        lengths: dict[str, set[int]] = {}
        for pattern in patterns:
            lengths.setdefault(pattern[:_HEAD], set()).add(len(pattern))
        return cls({"patterns": Vocabulary.build(patterns).parts(), "tokens": array("I", indices),
                    "lengths": {start: sorted(found, reverse=True) for start, found in lengths.items()},
                    "first_chars": "".join(sorted({pattern[0] for pattern in patterns}))}, table)

    def _token(self, index: int) -> AddedToken:
        token = self._token_cache.get(index)
        if token is None:
            if len(self._token_cache) >= _TOKEN_CACHE_LIMIT:
                self._token_cache.clear()
            token = self._token_cache[index] = self._table.token(index)
        return token

    def __bool__(self) -> bool:
        return self._first_char is not None

    def _longest_at(self, text: str, start: int) -> tuple[int, int] | None:
        """(end, pattern index) of the longest pattern starting at `start`, or None."""
        find, lengths, size = self._patterns.find, self._lengths, len(text)
        for head_length in range(min(_HEAD, size - start), 0, -1):
            for length in lengths.get(text[start:start + head_length], ()):
                if start + length <= size:
                    found = find(text[start:start + length])
                    if found is not None:
                        return start + length, found
        return None

    def _leftmost_longest(self, text: str) -> list[tuple[int, int, AddedToken]]:
        found: list[tuple[int, int, AddedToken]] = []
        if self._first_char is None:
            return found
        search, position = self._first_char.search, 0
        while True:
            hit = search(text, position)
            if hit is None:
                return found
            start = hit.start()
            match = self._longest_at(text, start)
            if match is None:
                position = start + 1
            else:
                end, pattern = match
                found.append((start, end, self._token(self._entry_tokens[pattern])))
                position = end

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
