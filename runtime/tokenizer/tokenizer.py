"""Tokenizer: text <-> token ids, in pure Python (stdlib + `regex`), from GGUF metadata, a
tokenizer.json or a stored spec.

Encoding runs the same stages as the reference `tokenizers` library: cut out added tokens,
normalize each remaining piece, cut out added tokens that match normalized text, split into
words, BPE each word, then put the prefix (BOS) and suffix ids around the result.

The vocabulary, merges and added tokens are held in compact arrays (see `vocab`), since a
tokenizer's resident memory counts against the device's budget. Construction has two stages
for the same reason (see `packing`): `_build` turns the spec into compact parts and packs them
into one bytes object; `_assemble` makes the objects the tokenizer keeps from that.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from .added_tokens import AddedTokenMatcher, AddedTokenTable
from .bpe import BPEModel
from .chat import detect_chat_format
from .decoders import build_decoder
from .from_gguf import spec_from_gguf
from .from_tokenizer_json import spec_from_tokenizer_json
from .heap import release_free_heap
from .normalizers import build_normalizer
from .packing import pack, unpack
from .pre_tokenizers import build_pre_tokenizer
from .spec import check_spec

# Bump when `_build`'s parts or `packing`'s layout change: bundles carry the tables (`tables()`),
# and a bundle with another format is read from its tokenizer.json instead.
TABLES_FORMAT = 1

_ASSEMBLY_LOCK = threading.RLock()  # reentrant: assembling may read attributes it has set

# Spec fields kept in compact form and written back out by `to_dict`.
_COMPACT_FIELDS = ("model", "added_tokens")
_COMPACT_MODEL_FIELDS = ("vocab", "merges", "scores")


def _json_without(fields: dict[str, Any], compact: tuple[str, ...], where: str) -> str:
    """`fields` as JSON, with the compact ones as null placeholders that keep their place."""
    try:
        return json.dumps({key: None if key in compact else value for key, value in fields.items()},
                          ensure_ascii=False, separators=(",", ":"))
    except (TypeError, ValueError) as error:
        raise ValueError(f"tokenizer spec {where} is not JSON-serializable: {error}") from None


def _build(spec: dict[str, Any]) -> bytes:
    """Everything the tokenizer keeps, as compact parts packed into one bytes object."""
    check_spec(spec)
    model = spec["model"]
    bpe = BPEModel.build(
        model["vocab"],
        merge_order=model.get("merge_order", "merges"),
        merges=model["merges"] if model.get("merges") is not None else None,
        scores=model.get("scores"),
        byte_fallback=bool(model.get("byte_fallback", False)),
        unk_token=model.get("unk_token"),
        fuse_unk=bool(model.get("fuse_unk", False)),
        ignore_merges=bool(model.get("ignore_merges", False)),
    )
    # The steps are built again on first use: building them here checks the spec now.
    normalizer = build_normalizer(spec["normalizer"])
    build_pre_tokenizer(spec["pre_tokenizer"])
    build_decoder(spec["decoder"])
    added, contents = AddedTokenTable.from_dicts(spec["added_tokens"])
    vocab = bpe.vocab
    model_size = len(vocab)
    vocab_size = max(model_size, added.max_id() + 1)
    normalized = [index for index in range(len(added)) if added.has_flag(index, "normalized")]
    as_is = [index for index in range(len(added)) if not added.has_flag(index, "normalized")]
    normalize = normalizer or (lambda text: text)
    normalized_contents = [normalize(contents[index]) for index in normalized]
    raw_matcher = AddedTokenMatcher.build(added, [contents[index] for index in as_is], as_is)
    normalized_matcher = AddedTokenMatcher.build(added, normalized_contents, normalized)
    # Id -> text is the model vocabulary, overlaid by added tokens whose text differs from it
    # (ids beyond the vocabulary, or a normalized token, which decodes as its normalized form
    # as in the reference). The overlay is small: most added tokens are vocabulary tokens.
    overlay: dict[int, str] = {}
    for index in as_is:
        overlay[added.id(index)] = contents[index]
    for index, text in zip(normalized, normalized_contents):
        overlay[added.id(index)] = text
    special = np.zeros(vocab_size, dtype=bool)
    special[added.ids_with_flag("special")] = True

    for field in ("prefix_ids", "suffix_ids", "end_ids"):
        for token_id in spec[field]:
            if not isinstance(token_id, int) or not 0 <= token_id < vocab_size:
                raise ValueError(f"tokenizer spec field {field} holds {token_id!r}, not a token id in [0, {vocab_size})")
    return pack({
        "model": bpe.parts(),
        "added": added.parts(),
        "raw_matcher": raw_matcher.parts(),
        "normalized_matcher": normalized_matcher.parts(),
        "overlay": [[token_id, text] for token_id, text in sorted(overlay.items())
                    if token_id >= model_size or vocab.text(token_id) != text],
        "special_bits": np.packbits(special, bitorder="little").tobytes(),  # bit i: id i is special
        "vocab_size": vocab_size,
        "spec": _json_without(spec, _COMPACT_FIELDS, "fields"),
        "model_fields": _json_without(model, _COMPACT_MODEL_FIELDS, "field model"),
    })


class Tokenizer:
    """Text <-> token ids. The objects it is made of are assembled from its packed form on first
    use: loading a model builds the tokenizer while the model file's metadata -- hundreds of
    thousands of small objects -- is alive, and small objects created then would keep that
    metadata's memory resident after it is dropped (see `packing`)."""

    def __init__(self, spec: dict[str, Any]) -> None:
        self._packed: bytes | None = _build(spec)
        release_free_heap()

    @classmethod
    def _from_packed(cls, data: bytes) -> Tokenizer:
        """A tokenizer from `_build`'s output (its spec can be gone already)."""
        tok = cls.__new__(cls)
        tok._packed = data
        release_free_heap()
        return tok

    def __getattr__(self, name: str) -> Any:
        # Called only for attributes not set: before the first use, everything but `_packed`.
        with _ASSEMBLY_LOCK:
            data = self.__dict__.pop("_packed", None)
            if data is not None:
                try:
                    self._assemble(unpack(data))
                except BaseException:
                    self.__dict__["_packed"] = data
                    raise
                del data
                release_free_heap()  # the packed copy is gone
        return object.__getattribute__(self, name)

    def _assemble(self, parts: dict[str, Any]) -> None:
        self._spec_json: str = parts["spec"]
        self._model_json: str = parts["model_fields"]
        spec = json.loads(self._spec_json)
        self._model = BPEModel(parts["model"])
        self._vocab_text = self._model.vocab.text
        self._model_size = len(self._model.vocab)
        self._normalizer = build_normalizer(spec["normalizer"])
        self._pre_tokenizer = build_pre_tokenizer(spec["pre_tokenizer"])
        self._decoder = build_decoder(spec["decoder"])
        self._added = AddedTokenTable(parts["added"])
        self._raw_matcher = AddedTokenMatcher(parts["raw_matcher"], self._added)
        self._normalized_matcher = AddedTokenMatcher(parts["normalized_matcher"], self._added)
        self._overlay: dict[int, str] = {token_id: text for token_id, text in parts["overlay"]}
        self._overlay_ids: dict[str, int] = {text: token_id for token_id, text in parts["overlay"]}  # later ids win
        self._special_bits: bytes = parts["special_bits"]
        self.vocab_size: int = parts["vocab_size"]

        self._prefix_ids: list[int] = spec["prefix_ids"]
        self._suffix_ids: list[int] = spec["suffix_ids"]
        self.special_tokens: dict[str, str | None] = spec["special_tokens"]
        self.bos_id = self.token_to_id(self.special_tokens.get("bos_token"))
        self.eos_id = self.token_to_id(self.special_tokens.get("eos_token"))
        self.eos_ids: set[int] = set(spec["end_ids"]) | ({self.eos_id} if self.eos_id is not None else set())
        self.chat_template: str | None = spec["chat_template"]
        self.chat_format = detect_chat_format(self.chat_template, lambda text: self.token_to_id(text) is not None)
        self.source: str = spec.get("source", "")

    # -- construction ---------------------------------------------------------------------------

    @classmethod
    def from_gguf_metadata(cls, meta: dict[str, Any]) -> Tokenizer:
        """`meta` as returned by `edgeflash.runtime.sources.gguf.read_metadata`."""
        return cls._from_packed(_build(spec_from_gguf(meta)))

    @classmethod
    def from_tokenizer_json(cls, source: str | Path | dict[str, Any],
                            tokenizer_config: dict[str, Any] | None = None) -> Tokenizer:
        """`source`: a tokenizer.json path, a directory holding one (its tokenizer_config.json
        and chat_template.jinja are read too), or the parsed JSON."""
        spec = spec_from_tokenizer_json(source, tokenizer_config)
        where = spec["source"]
        try:
            data = _build(spec)
            del spec
            return cls._from_packed(data)
        except ValueError as error:  # a step the file describes is malformed: say which file
            raise ValueError(f"{where}: {error}") from None

    @classmethod
    def from_dict(cls, spec: dict[str, Any]) -> Tokenizer:
        return cls(spec)

    def to_dict(self) -> dict[str, Any]:
        """The complete spec, JSON-serializable; `Tokenizer.from_dict` rebuilds this tokenizer.
        The vocabulary, merges, scores and added tokens are written back from their compact
        form: an unused field (scores under another merge order) comes back as null, and a
        merge listed twice comes back once, at the rank that counts."""
        spec = json.loads(self._spec_json)
        model = json.loads(self._model_json)
        model["vocab"] = self._model.vocab.to_list()
        if "merges" in model or self._model.merge_order == "merges":
            model["merges"] = self._model.merges_list() if self._model.merge_order == "merges" else None
        if "scores" in model or self._model.merge_order == "scores":
            model["scores"] = self._model.scores_list()
        spec["model"] = model
        spec["added_tokens"] = [token.to_dict() for token in self._added]
        return spec

    def tables(self) -> bytes:
        """The compact tables this tokenizer is assembled from (format `TABLES_FORMAT`), for
        `from_tables`: a reader then skips building them from the spec."""
        return _build(self.to_dict())

    @classmethod
    def from_tables(cls, data: bytes) -> Tokenizer:
        """A tokenizer from `tables()` output of the same `TABLES_FORMAT`."""
        return cls._from_packed(data)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), ensure_ascii=False, separators=(",", ":"))

    # -- vocabulary -----------------------------------------------------------------------------

    def token_to_id(self, token: str | None) -> int | None:
        """The id of a token text (the largest, should a text appear twice), or None."""
        if token is None:
            return None
        overlay = self._overlay
        if not overlay:
            return self._model.vocab.find(token)
        # A vocabulary id whose text the overlay replaced does not count.
        found = next((token_id for token_id in self._model.vocab.find_all(token) if token_id not in overlay), None)
        listed = self._overlay_ids.get(token)
        return listed if found is None or (listed is not None and listed > found) else found

    def id_to_token(self, token_id: int) -> str | None:
        self._check_id(token_id)
        return self._text(token_id)

    def is_special(self, token_id: int) -> bool:
        return 0 <= token_id < self.vocab_size and bool(self._special_bits[token_id >> 3] >> (token_id & 7) & 1)

    def _text(self, token_id: int) -> str | None:
        if token_id in self._overlay:
            return self._overlay[token_id]
        return self._vocab_text(token_id) if token_id < self._model_size else None

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

    def split_special(self, text: str) -> list[tuple[str, bool]]:
        """`text` cut at the special (control) tokens `encode` would recognise in it: (piece, True)
        for each such token's text, (piece, False) for the text between them."""
        if not self._raw_matcher:
            return [(text, False)]
        return [(piece, token is not None and token.special)
                for piece, token in self._raw_matcher.split(text, parse_special=True)]

    def encode_rendered(self, text: str, literals: Mapping[str, str]) -> list[int]:
        """Token ids of a rendered chat prompt, without BOS or EOS. Special tokens are taken from
        the template's own text only: every text piece between them is encoded with special-token
        parsing off, after each placeholder character of `literals` in it is put back to the
        text it stands for (special-token text a message carried, see `chat.chat_ids`)."""
        ids: list[int] = []
        pieces = self._raw_matcher.split(text, parse_special=True) if self._raw_matcher else [(text, None)]
        offset = 0
        for piece, token in pieces:
            if token is not None:
                ids.append(token.id)
            elif piece:
                if literals:
                    piece = "".join(literals.get(ch, ch) for ch in piece)
                self._encode_plain(piece, offset == 0, False, ids)
            offset += len(piece)
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
            text = self._text(token_id)
            if text is None or (skip_special and self.is_special(token_id)):
                continue
            texts.append(text)
        return self._decoder.decode(texts)

    def token_bytes(self, token_id: int, first: bool = False) -> bytes:
        """The raw bytes token `token_id` adds to a text. A byte-fallback or byte-level token may
        hold part of a UTF-8 character. first=True gives the bytes it adds as the first token of
        a text (a SentencePiece prefix space is dropped there)."""
        self._check_id(token_id)
        text = self._text(token_id)
        return b"" if text is None else self._decoder.token_bytes(text, first)
