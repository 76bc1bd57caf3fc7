"""Tokenizer: text <-> token ids, in pure Python (stdlib + `regex`), from GGUF metadata, a
tokenizer.json or a stored spec.

Encoding runs the same stages as the reference `tokenizers` library: cut out added tokens,
normalize each remaining piece, cut out added tokens that match normalized text, split into
words, BPE each word, then put the prefix (BOS) and suffix ids around the result.
"""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

from .added_tokens import AddedToken, AddedTokenMatcher
from .bpe import BPEModel
from .chat import detect_chat_format
from .decoders import build_decoder
from .from_gguf import spec_from_gguf
from .from_tokenizer_json import spec_from_tokenizer_json
from .normalizers import build_normalizer
from .pre_tokenizers import build_pre_tokenizer
from .spec import check_spec


class Tokenizer:
    def __init__(self, spec: dict[str, Any]) -> None:
        self._spec = check_spec(spec)
        model = spec["model"]
        self._model = BPEModel(
            model["vocab"],
            merge_order=model.get("merge_order", "merges"),
            merges=[tuple(pair) for pair in model["merges"]] if model.get("merges") is not None else None,
            scores=model.get("scores"),
            byte_fallback=bool(model.get("byte_fallback", False)),
            unk_token=model.get("unk_token"),
            fuse_unk=bool(model.get("fuse_unk", False)),
            ignore_merges=bool(model.get("ignore_merges", False)),
        )
        self._normalizer = build_normalizer(spec["normalizer"])
        self._pre_tokenizer = build_pre_tokenizer(spec["pre_tokenizer"])
        self._decoder = build_decoder(spec["decoder"])

        added = [AddedToken.from_dict(entry, f"added_tokens[{index}]") for index, entry in enumerate(spec["added_tokens"])]
        # Id -> text: the model vocabulary, extended by added tokens that lie beyond it.
        texts: list[str | None] = list(model["vocab"])
        top = max((token.id for token in added), default=-1)
        texts.extend([None] * max(0, top + 1 - len(texts)))
        for token in added:
            texts[token.id] = token.content
        self.vocab_size = len(texts)
        self._special_ids = frozenset(token.id for token in added if token.special)
        normalize = self._normalizer or (lambda text: text)
        self._raw_matcher = AddedTokenMatcher([(token.content, token) for token in added if not token.normalized])
        self._normalized_matcher = AddedTokenMatcher([(normalize(token.content), token) for token in added if token.normalized])
        # A normalized added token decodes as its normalized form, as in the reference.
        for token in added:
            if token.normalized:
                texts[token.id] = normalize(token.content)
        self._texts = texts
        self._id_of = {text: index for index, text in enumerate(texts) if text is not None}

        for field in ("prefix_ids", "suffix_ids", "end_ids"):
            for token_id in spec[field]:
                if not isinstance(token_id, int) or not 0 <= token_id < self.vocab_size:
                    raise ValueError(f"tokenizer spec field {field} holds {token_id!r}, not a token id in [0, {self.vocab_size})")
        self._prefix_ids = list(spec["prefix_ids"])
        self._suffix_ids = list(spec["suffix_ids"])
        self.special_tokens: dict[str, str | None] = dict(spec["special_tokens"])
        self.bos_id = self.token_to_id(self.special_tokens.get("bos_token"))
        self.eos_id = self.token_to_id(self.special_tokens.get("eos_token"))
        self.eos_ids: set[int] = set(spec["end_ids"]) | ({self.eos_id} if self.eos_id is not None else set())
        self.chat_template: str | None = spec["chat_template"]
        self.chat_format = detect_chat_format(self.chat_template, self._id_of)
        self.source: str = spec.get("source", "")

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """`meta` as returned by `edgeflash.export.sources.gguf.read_metadata`."""
        return cls(spec_from_gguf(meta))

    @classmethod
    def from_tokenizer_json(cls, source: str | Path | dict[str, Any],
                            tokenizer_config: dict[str, Any] | None = None) -> Tokenizer:
        """`source`: a tokenizer.json path, a directory holding one (its tokenizer_config.json
        and chat_template.jinja are read too), or the parsed JSON."""
        spec = spec_from_tokenizer_json(source, tokenizer_config)
        try:
            return cls(spec)
        except ValueError as error:  # a step the file describes is malformed: say which file
            raise ValueError(f"{spec['source']}: {error}") from None

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Tokenizer:
        return cls(spec)

    def to_dict(self) -> dict[str, Any]:
        """The complete spec, JSON-serializable; `Tokenizer.from_dict` rebuilds this tokenizer."""
        return copy.deepcopy(self._spec)

    def to_json(self) -> str:
        return json.dumps(self._spec, ensure_ascii=False, separators=(",", ":"))

    # -- vocabulary -----------------------------------------------------------------------------

    def token_to_id(self, token: str | None) -> int | None:
        return None if token is None else self._id_of.get(token)

    def id_to_token(self, token_id: int) -> str | None:
        self._check_id(token_id)
        return self._texts[token_id]

    def is_special(self, token_id: int) -> bool:
        return token_id in self._special_ids

    def _check_id(self, token_id: int) -> None:
        if not 0 <= token_id < self.vocab_size:
            raise ValueError(f"token id {token_id} is outside the vocabulary [0, {self.vocab_size})")

    # -- encode ---------------------------------------------------------------------------------

    def encode(self, text: str, add_bos: bool | None = None, parse_special: bool = True,
               add_eos: bool | None = None) -> list[int]:
        """Token ids of `text`.

        add_bos / add_eos: None uses the model's default (e.g. Gemma adds BOS, SmolLM2 does
        not); True/False forces it. parse_special=False encodes special-token text such as
        `<start_of_turn>` as ordinary characters (user text that must not inject control tokens).
        """
        if not isinstance(text, str):
            raise TypeError(f"encode() takes a str, got {type(text).__name__}")
        ids: list[int] = []
        if add_bos is None:
            ids.extend(self._prefix_ids)
        elif add_bos:
            if self._prefix_ids:
                ids.extend(self._prefix_ids)
            elif self.bos_id is not None:
                ids.append(self.bos_id)
            else:
                raise ValueError(f"add_bos=True but the tokenizer ({self.source}) has no BOS token")
        pieces = self._raw_matcher.split(text, parse_special=parse_special) if self._raw_matcher else [(text, None)]
        offset = 0
        for piece, token in pieces:
            if token is not None:
                ids.append(token.id)
            elif piece:
                self._encode_plain(piece, offset == 0, parse_special, ids)
            offset += len(piece)
        if add_eos is None:
            ids.extend(self._suffix_ids)
        elif add_eos:
            if self.eos_id is None:
                raise ValueError(f"add_eos=True but the tokenizer ({self.source}) has no EOS token")
            ids.append(self.eos_id)
        return ids

    def _encode_plain(self, text: str, at_start: bool, parse_special: bool, out: list[int]) -> None:
        if self._normalizer is not None:
            text = self._normalizer(text)
        parts = (self._normalized_matcher.split(text, parse_special=parse_special)
                 if self._normalized_matcher else [(text, None)])
        encode_word = self._model.encode_word
        for index, (part, token) in enumerate(parts):
            if token is not None:
                out.append(token.id)
                continue
            if not part:
                continue
            words = (self._pre_tokenizer((part, at_start and index == 0)) if self._pre_tokenizer is not None
                     else [(part, at_start and index == 0)])
            for word, _ in words:
                out.extend(encode_word(word))

    # -- decode ---------------------------------------------------------------------------------

    def decode(self, ids: list[int], skip_special: bool = False) -> str:
        texts: list[str] = []
        for token_id in ids:
            self._check_id(token_id)
            text = self._texts[token_id]
            if text is None or (skip_special and token_id in self._special_ids):
                continue
            texts.append(text)
        return self._decoder.decode(texts)

    def token_bytes(self, token_id: int, first: bool = False) -> bytes:
        """The raw bytes token `token_id` adds to a text. A byte-fallback or byte-level token may
        hold part of a UTF-8 character. first=True gives the bytes it adds as the first token of
        a text (a SentencePiece prefix space is dropped there)."""
        self._check_id(token_id)
        text = self._texts[token_id]
        return b"" if text is None else self._decoder.token_bytes(text, first)
