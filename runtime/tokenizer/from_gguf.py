"""A tokenizer spec from GGUF metadata (the `tokenizer.ggml.*` keys).

The spec is built the way transformers builds its tokenizer from the same file, so that both
produce the same token ids:
- `llama` (SentencePiece-style BPE with byte fallback). Gemma files store runs of spaces as real
  spaces and list no merges; their merges are ranked by the order of the tokens in the file.
  Other files rank the vocabulary-implied merges by `scores` and use a Metaspace prefix space.
- `gpt2` (byte-level BPE with an explicit merge list); the word-splitting regex depends on
  `tokenizer.ggml.pre`.
Tokens of type CONTROL become special added tokens and USER_DEFINED ones plain added tokens:
both are matched whole in the text.
"""

from __future__ import annotations

from typing import Any

from .byte_level import is_spelled, spell_bytes
from .spec import SPEC_FORMAT, SPEC_VERSION, is_merge_string
from .special import END_OF_TURN_TOKENS

TOKEN_TYPE_CONTROL = 3
TOKEN_TYPE_USER_DEFINED = 4

_GEMMA_ARCHITECTURES = ("gemma", "gemma2", "gemma3")
_METASPACE = "\u2581"

# Word-splitting regexes for byte-level vocabularies, by `tokenizer.ggml.pre`. A name that is not
# listed (GPT-2 itself, "smollm", "default"...) uses the GPT-2 regex of the ByteLevel step.
_LLAMA3_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN2_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_QWEN35_SPLIT = (
    r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}"
    r"| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_TEKKEN_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*"
    r"|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
_GPT4O_SPLIT = (
    r"[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?"
    r"|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+"
)
PRE_TOKENIZER_SPLITS: dict[str, str] = {
    **dict.fromkeys(
        ("llama3", "llama-v3", "llama-bpe", "falcon3", "falcon-h1", "pixtral", "midm-2.0", "lfm2",
         "jina-v5-nano", "dbrx", "smaug-bpe"),
        _LLAMA3_SPLIT,
    ),
    "tekken": _TEKKEN_SPLIT,
    **dict.fromkeys(("qwen2", "deepseek-r1-qwen", "kormo", "f2llmv2", "megrez"), _QWEN2_SPLIT),
    "qwen35": _QWEN35_SPLIT,
    **dict.fromkeys(("gpt-4o", "llama4", "kanana2", "talkie", "minimax-m2"), _GPT4O_SPLIT),
}


def _require_list(meta: dict[str, Any], key: str, length: int | None = None) -> list[Any]:
    value = meta.get(key)
    if not isinstance(value, list) or not value:
        raise ValueError(f"GGUF field {key} is missing or empty (got {type(value).__name__})")
    if length is not None and len(value) != length:
        raise ValueError(f"GGUF field {key} has {len(value)} entries; expected {length} (one per token)")
    return value


def _token_id(meta: dict[str, Any], key: str, vocab_size: int) -> int | None:
    value = meta.get(key)
    if value is None:
        return None
    if not isinstance(value, int) or not 0 <= value < vocab_size:
        raise ValueError(f"GGUF field {key} = {value!r} is not a token id in [0, {vocab_size})")
    return value


def _replace(pattern: str, content: str) -> dict[str, Any]:
    return {"type": "Replace", "pattern": {"String": pattern}, "content": content}


def _sentencepiece_decoder(strip_prefix_space: bool) -> dict[str, Any]:
    steps = [_replace(_METASPACE, " "), {"type": "ByteFallback"}, {"type": "Fuse"}]
    if strip_prefix_space:
        steps.append({"type": "Strip", "content": " ", "start": 1, "stop": 0})
    return {"type": "Sequence", "decoders": steps}


def _llama_pipeline(meta: dict[str, Any], tokens: list[str]) -> tuple[list[str], dict[str, Any]]:
    """SentencePiece-style vocabularies: the vocabulary as the model sees it and the pipeline."""
    architecture = meta.get("general.architecture")
    prefix_space = meta.get("tokenizer.ggml.add_space_prefix")
    common = {"merges": None, "byte_fallback": True, "fuse_unk": True, "ignore_merges": False}
    if architecture in _GEMMA_ARCHITECTURES:
        # Runs of spaces are stored as spaces but looked up as metaspace runs.
        vocab = [_METASPACE * len(token) if " " in token and not token.strip() else token for token in tokens]
        to_metaspace = _replace(" ", _METASPACE)
        normalizer = (
            {"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": _METASPACE}, to_metaspace]}
            if prefix_space else to_metaspace
        )
        return vocab, {
            "model": {"merge_order": "token_order", **common},
            "normalizer": normalizer,
            "pre_tokenizer": None,
            "decoder": _sentencepiece_decoder(bool(prefix_space)),
        }
    scores = _require_list(meta, "tokenizer.ggml.scores", len(tokens))
    model = {"merge_order": "scores", "scores": [float(score) for score in scores], **common}
    add_prefix = True if prefix_space is None else bool(prefix_space)
    if architecture == "phi3":
        # Phi-3 puts the prefix space on every text piece with a normalizer.
        return list(tokens), {
            "model": model,
            "normalizer": {"type": "Sequence", "normalizers": [
                {"type": "Prepend", "prepend": _METASPACE}, _replace(" ", _METASPACE)]},
            "pre_tokenizer": None,
            "decoder": _sentencepiece_decoder(True),
        }
    return list(tokens), {
        "model": model,
        "normalizer": None,
        "pre_tokenizer": {"type": "Metaspace", "replacement": _METASPACE,
                          "prepend_scheme": "first" if add_prefix else "never", "split": False},
        "decoder": _sentencepiece_decoder(add_prefix),
    }


def _byte_level_pipeline(meta: dict[str, Any], tokens: list[str]) -> tuple[list[str], dict[str, Any]]:
    vocab = [token if is_spelled(token) else spell_bytes(token) for token in tokens]
    # The "left right" strings go into the spec as they are: splitting tens of thousands of them
    # into pairs here would only make short-lived objects.
    merges = _require_list(meta, "tokenizer.ggml.merges")
    for index, merge in enumerate(merges):
        if not is_merge_string(merge):
            raise ValueError(f"GGUF field tokenizer.ggml.merges[{index}] = {merge!r} is not 'left right'")
    split = PRE_TOKENIZER_SPLITS.get(meta.get("tokenizer.ggml.pre"))
    if split is None:
        pre_tokenizer = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
    else:
        pre_tokenizer = {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False},
        ]}
    return vocab, {
        "model": {"merge_order": "merges", "merges": merges, "byte_fallback": False, "fuse_unk": False,
                  "ignore_merges": False},
        "normalizer": None,
        "pre_tokenizer": pre_tokenizer,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
    }


def spec_from_gguf(meta: dict[str, Any]) -> dict[str, Any]:
    kind = meta.get("tokenizer.ggml.model")
    if kind not in ("llama", "gpt2"):
        raise ValueError(
            f"GGUF field tokenizer.ggml.model = {kind!r} is not supported; expected 'llama' (SentencePiece BPE) "
            "or 'gpt2' (byte-level BPE)"
        )
    tokens = _require_list(meta, "tokenizer.ggml.tokens")
    if not all(isinstance(token, str) for token in tokens):
        raise ValueError("GGUF field tokenizer.ggml.tokens holds non-string entries")
    count = len(tokens)
    types = meta.get("tokenizer.ggml.token_type") or [1] * count
    if len(types) != count:
        raise ValueError(f"GGUF field tokenizer.ggml.token_type has {len(types)} entries; expected {count}")

    vocab, pipeline = (_llama_pipeline if kind == "llama" else _byte_level_pipeline)(meta, tokens)
    named = {
        name: _token_id(meta, f"tokenizer.ggml.{key}", count)
        for name, key in (("bos", "bos_token_id"), ("eos", "eos_token_id"), ("unk", "unknown_token_id"),
                          ("pad", "padding_token_id"))
    }
    # Ids of the few texts looked up below; the last id wins, as in a dict built from the vocabulary.
    # (No dict over the whole vocabulary: for 262k tokens it costs more than the tokenizer itself.)
    added_types = (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED)
    wanted = {token for token, token_type in zip(tokens, types) if token_type in added_types}
    wanted.update(tokens[token_id] for token_id in named.values() if token_id is not None)
    wanted.add("<unk>")
    id_of = {token: index for index, token in enumerate(vocab) if token in wanted}
    unk_id = named["unk"]
    if kind == "llama":
        pipeline["model"]["unk_token"] = vocab[unk_id] if unk_id is not None else ("<unk>" if "<unk>" in id_of else None)
    else:
        pipeline["model"]["unk_token"] = None

    flags = {"normalized": False, "lstrip": False, "rstrip": False, "single_word": False}
    added: dict[str, dict[str, Any]] = {}
    for token, token_type in zip(tokens, types):
        if token_type not in added_types or token not in id_of:
            continue  # not added, or respelled (Gemma space runs): the reference cannot match it whole either
        if token_type == TOKEN_TYPE_CONTROL and (kind == "llama" or is_spelled(token)):
            added[token] = {"id": id_of[token], "content": token, "special": True, **flags}
        elif token_type == TOKEN_TYPE_USER_DEFINED and token not in added:
            added[token] = {"id": id_of[token], "content": token, "special": False, **flags}
    for token_id in named.values():
        token = tokens[token_id] if token_id is not None else None
        if token is not None and token not in added and token in id_of:
            added[token] = {"id": id_of[token], "content": token, "special": True, **flags}
    added_tokens = sorted(added.values(), key=lambda entry: entry["id"])

    add_bos = meta.get("tokenizer.ggml.add_bos_token")
    if add_bos is None:
        # A SentencePiece vocabulary that does not say otherwise gets BOS (llama.cpp's rule too).
        add_bos = kind == "llama"
    add_eos = bool(meta.get("tokenizer.ggml.add_eos_token", False))
    bos_id, eos_id = named["bos"], named["eos"]

    special_contents = {entry["content"] for entry in added_tokens if entry["special"]}
    end_ids = {token_id for token_id in (eos_id,
                                          _token_id(meta, "tokenizer.ggml.eot_token_id", count),
                                          _token_id(meta, "tokenizer.ggml.eom_token_id", count)) if token_id is not None}
    end_ids |= {id_of[token] for token in END_OF_TURN_TOKENS if token in special_contents}

    def name(token_id: int | None) -> str | None:
        return tokens[token_id] if token_id is not None else None

    return {
        "format": SPEC_FORMAT,
        "version": SPEC_VERSION,
        "source": f"gguf:{kind}:{meta.get('general.architecture')}",
        "model": {"type": "BPE", "vocab": vocab, **pipeline["model"]},
        "added_tokens": added_tokens,
        "normalizer": pipeline["normalizer"],
        "pre_tokenizer": pipeline["pre_tokenizer"],
        "decoder": pipeline["decoder"],
        "prefix_ids": [bos_id] if add_bos and bos_id is not None else [],
        "suffix_ids": [eos_id] if add_eos and eos_id is not None else [],
        "special_tokens": {"bos_token": name(bos_id), "eos_token": name(eos_id),
                           "unk_token": name(unk_id), "pad_token": name(named["pad"])},
        "end_ids": sorted(end_ids),
        "chat_template": meta.get("tokenizer.chat_template"),
    }
