"""The tokenizer spec: one JSON-serializable dict that describes a tokenizer completely.

Both readers (GGUF metadata, tokenizer.json) produce it and a bundle stores it, so a device
needs neither file to tokenize. Pipeline steps (`normalizer`, `pre_tokenizer`, `decoder`) and
`added_tokens` use the tokenizer.json vocabulary of types and fields.

    format, version      "edgeflash.tokenizer", 1
    source               where it came from, for messages ("gguf:llama:gemma3", "tokenizer.json")
    model                {"type": "BPE", "vocab": [token or null by id], "merge_order":
                          "merges" | "token_order" | "scores", "merges": [[left, right] or "left right",
                          ...] | null (the string form is GGUF's; neither piece holds a space),
                          "scores": [...] (for "scores"), "byte_fallback", "unk_token", "fuse_unk",
                          "ignore_merges"}
    added_tokens         [{"id", "content", "special", "normalized", "lstrip", "rstrip", "single_word"}]
    normalizer, pre_tokenizer, decoder    step specs or null
    prefix_ids, suffix_ids                ids put around every encoded text by default (BOS / EOS)
    special_tokens       {"bos_token", "eos_token", "unk_token", "pad_token"}: strings or null
    end_ids              ids that end generation: eos and end-of-turn tokens
    chat_template        Jinja source or null
"""

from __future__ import annotations

from typing import Any

SPEC_FORMAT = "edgeflash.tokenizer"
SPEC_VERSION = 1

_REQUIRED = ("model", "added_tokens", "normalizer", "pre_tokenizer", "decoder", "prefix_ids", "suffix_ids",
             "special_tokens", "end_ids", "chat_template")


def check_spec(spec: Any) -> dict[str, Any]:
    """Raise ValueError naming the first field that is missing or of the wrong kind."""
    if not isinstance(spec, dict):
        raise ValueError(f"tokenizer spec is a {type(spec).__name__}; expected a dict")
    if spec.get("format") != SPEC_FORMAT:
        raise ValueError(f"tokenizer spec field format = {spec.get('format')!r}; expected {SPEC_FORMAT!r}")
    if spec.get("version") != SPEC_VERSION:
        raise ValueError(f"tokenizer spec field version = {spec.get('version')!r}; this reader knows {SPEC_VERSION}")
    for field in _REQUIRED:
        if field not in spec:
            raise ValueError(f"tokenizer spec has no field {field!r}")
    model = spec["model"]
    if not isinstance(model, dict) or model.get("type") != "BPE":
        raise ValueError(f"tokenizer spec field model.type = {getattr(model, 'get', lambda _: None)('type')!r}; expected 'BPE'")
    if not isinstance(model.get("vocab"), list) or not model["vocab"]:
        raise ValueError("tokenizer spec field model.vocab is missing or empty")
    for field in ("added_tokens", "prefix_ids", "suffix_ids", "end_ids"):
        if not isinstance(spec[field], list):
            raise ValueError(f"tokenizer spec field {field} = {spec[field]!r} is not a list")
    if not isinstance(spec["special_tokens"], dict):
        raise ValueError(f"tokenizer spec field special_tokens = {spec['special_tokens']!r} is not a dict")
    if spec["chat_template"] is not None and not isinstance(spec["chat_template"], str):
        raise ValueError("tokenizer spec field chat_template is neither a string nor null")
    return spec


def is_merge_string(merge: Any) -> bool:
    """Whether `merge` is a merge written as one "left right" string (GGUF's form)."""
    if not isinstance(merge, str):
        return False
    left, space, right = merge.partition(" ")
    return bool(space and left and right and " " not in right)


def merge_pair(merge: Any, index: int) -> tuple[str, str]:
    """(left, right) of model.merges[index], given as [left, right] or "left right"."""
    if isinstance(merge, str):
        if is_merge_string(merge):
            left, _, right = merge.partition(" ")
            return left, right
    elif isinstance(merge, (list, tuple)) and len(merge) == 2 and all(isinstance(part, str) and part for part in merge):
        return merge[0], merge[1]
    raise ValueError(f"tokenizer spec field model.merges[{index}] = {merge!r:.80} is not [left, right] or 'left right'")
