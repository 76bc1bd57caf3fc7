"""A tokenizer spec from a Hugging Face tokenizer.json (+ tokenizer_config.json).

Supported: a BPE model (byte-level or with byte fallback), the normalizers, pre-tokenizers and
decoders the step modules list, added tokens, and TemplateProcessing / ByteLevel / Roberta /
Bert post-processors (which decide the default BOS / EOS). Anything else raises ValueError
naming the field and its value.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from .added_tokens import AddedToken
from .spec import SPEC_FORMAT, SPEC_VERSION
from .special import END_OF_TURN_TOKENS


def _load(source: str | Path | dict[str, Any],
          tokenizer_config: dict[str, Any] | None) -> tuple[dict[str, Any], dict[str, Any], str]:
    if isinstance(source, dict):
        return source, dict(tokenizer_config or {}), "tokenizer.json"
    path = Path(source)
    folder = path if path.is_dir() else path.parent
    if path.is_dir():
        path = path / "tokenizer.json"
    if not path.is_file():
        raise ValueError(f"{path}: no such tokenizer.json file")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as error:
        raise ValueError(f"{path}: not valid JSON ({error})") from None
    if tokenizer_config is None:
        config_path = folder / "tokenizer_config.json"
        tokenizer_config = json.loads(config_path.read_text(encoding="utf-8")) if config_path.is_file() else {}
    config = dict(tokenizer_config)
    template_path = folder / "chat_template.jinja"
    if config.get("chat_template") is None and template_path.is_file():
        config["chat_template"] = template_path.read_text(encoding="utf-8")
    return data, config, str(path)


def _token_name(value: Any) -> str | None:
    """A special token as tokenizer_config.json writes it: a string or {"content": ...}."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


def _vocab_list(vocab: Any, where: str) -> list[str | None]:
    if not isinstance(vocab, dict) or not vocab:
        raise ValueError(f"{where}: model.vocab is {type(vocab).__name__}; expected a non-empty {{token: id}} object")
    size = 0
    for token, token_id in vocab.items():
        if not isinstance(token_id, int) or token_id < 0:
            raise ValueError(f"{where}: model.vocab[{token!r}] = {token_id!r} is not a token id >= 0")
        size = max(size, token_id + 1)
    listed: list[str | None] = [None] * size
    for token, token_id in vocab.items():
        if listed[token_id] is not None:
            raise ValueError(f"{where}: model.vocab gives id {token_id} to both {listed[token_id]!r} and {token!r}")
        listed[token_id] = token
    return listed


def _merges(merges: Any, where: str) -> list[list[str]]:
    if not isinstance(merges, list):
        raise ValueError(f"{where}: model.merges is {type(merges).__name__}; expected a list")
    pairs: list[list[str]] = []
    for index, merge in enumerate(merges):
        if isinstance(merge, str):
            left, space, right = merge.partition(" ")
            pair = [left, right] if space else None
        elif isinstance(merge, list) and len(merge) == 2 and all(isinstance(part, str) for part in merge):
            pair = list(merge)
        else:
            pair = None
        if pair is None or not pair[0] or not pair[1]:
            raise ValueError(f"{where}: model.merges[{index}] = {merge!r} is not 'left right' or [left, right]")
        pairs.append(pair)
    return pairs


def _model(data: dict[str, Any], where: str) -> dict[str, Any]:
    model = data.get("model")
    if not isinstance(model, dict):
        raise ValueError(f"{where}: field model is {type(model).__name__}; expected an object")
    kind = model.get("type", "BPE" if "merges" in model else None)
    if kind != "BPE":
        raise ValueError(f"{where}: model.type = {kind!r} is not supported; expected 'BPE'")
    if model.get("dropout") not in (None, 0, 0.0):
        raise ValueError(f"{where}: model.dropout = {model['dropout']!r} is not supported (encoding must be deterministic)")
    for field in ("continuing_subword_prefix", "end_of_word_suffix"):
        if model.get(field):
            raise ValueError(f"{where}: model.{field} = {model[field]!r} is not supported; expected null or ''")
    unk = model.get("unk_token")
    if unk is not None and not isinstance(unk, str):
        raise ValueError(f"{where}: model.unk_token = {unk!r} is not a string")
    vocab = _vocab_list(model.get("vocab"), where)
    if unk is not None and unk not in vocab:
        raise ValueError(f"{where}: model.unk_token = {unk!r} is not in model.vocab")
    return {
        "type": "BPE",
        "vocab": vocab,
        "merge_order": "merges",
        "merges": _merges(model.get("merges", []), where),
        "byte_fallback": bool(model.get("byte_fallback", False)),
        "unk_token": unk,
        "fuse_unk": bool(model.get("fuse_unk", False)),
        "ignore_merges": bool(model.get("ignore_merges", False)),
    }


def _place_added_tokens(tokens: list[AddedToken], vocab_id_of: dict[str, int]) -> list[dict[str, Any]]:
    """Ids of added tokens as the reference assigns them when it reads a file: a token whose text
    is in the vocabulary takes that id; the others take new ids after the vocabulary, in order.
    A repeated text keeps its first id and its last flags. (Consistent files keep their ids.)"""
    placed: dict[int, dict[str, Any]] = {}
    id_of: dict[str, int] = {}
    next_id = len(vocab_id_of)
    for token in tokens:
        if not token.content:
            continue
        token_id = id_of.get(token.content, vocab_id_of.get(token.content))
        if token_id is None:
            token_id, next_id = next_id, next_id + 1
        id_of[token.content] = token_id
        placed[token_id] = {**token.to_dict(), "id": token_id}
    return [placed[token_id] for token_id in sorted(placed)]


def _post_processor_ids(spec: Any, where: str) -> tuple[list[int], list[int]]:
    """(prefix ids, suffix ids) a post-processor puts around a single sequence."""
    if spec is None:
        return [], []
    kind = spec.get("type") if isinstance(spec, dict) else None
    if kind == "ByteLevel":
        return [], []
    if kind == "Sequence":
        prefix: list[int] = []
        suffix: list[int] = []
        for index, step in enumerate(spec.get("processors") or []):
            step_prefix, step_suffix = _post_processor_ids(step, f"{where}.processors[{index}]")
            prefix, suffix = step_prefix + prefix, suffix + step_suffix
        return prefix, suffix
    if kind in ("RobertaProcessing", "BertProcessing"):
        try:
            return [int(spec["cls"][1])], [int(spec["sep"][1])]
        except (KeyError, IndexError, TypeError, ValueError):
            raise ValueError(f"{where}: cls/sep = {spec.get('cls')!r}/{spec.get('sep')!r} are not [token, id]") from None
    if kind == "TemplateProcessing":
        single, specials = spec.get("single"), spec.get("special_tokens") or {}
        if not isinstance(single, list):
            raise ValueError(f"{where}.single = {single!r} is not a list")
        prefix, suffix = [], []
        seen_sequence = False
        for item in single:
            if isinstance(item, dict) and "Sequence" in item:
                seen_sequence = True
                continue
            name = item.get("SpecialToken", {}).get("id") if isinstance(item, dict) else None
            entry = specials.get(name)
            if not isinstance(entry, dict) or not isinstance(entry.get("ids"), list):
                raise ValueError(f"{where}.single: special token {name!r} is not in {where}.special_tokens")
            (suffix if seen_sequence else prefix).extend(int(token_id) for token_id in entry["ids"])
        return prefix, suffix
    raise ValueError(
        f"{where}.type = {kind!r} is not supported; expected TemplateProcessing, ByteLevel, "
        "RobertaProcessing, BertProcessing or Sequence"
    )


def _chat_template(value: Any, where: str) -> str | None:
    if value is None or isinstance(value, str):
        return value
    if isinstance(value, list):  # [{"name": ..., "template": ...}]: the default one
        named = {entry.get("name"): entry.get("template") for entry in value if isinstance(entry, dict)}
        template = named.get("default")
        if isinstance(template, str) or template is None:
            return template
    raise ValueError(f"{where}: chat_template = {value!r:.80} is not a string or a list of named templates")


def spec_from_tokenizer_json(source: str | Path | dict[str, Any],
                             tokenizer_config: dict[str, Any] | None = None) -> dict[str, Any]:
    data, config, where = _load(source, tokenizer_config)
    if not isinstance(data, dict):
        raise ValueError(f"{where}: top level is {type(data).__name__}; expected an object")
    model = _model(data, where)
    added_raw = data.get("added_tokens") or []
    if not isinstance(added_raw, list):
        raise ValueError(f"{where}: added_tokens is {type(added_raw).__name__}; expected a list")
    id_of: dict[str, int] = {token: index for index, token in enumerate(model["vocab"]) if token is not None}
    added = _place_added_tokens(
        [AddedToken.from_dict(entry, f"{where}: added_tokens[{index}]") for index, entry in enumerate(added_raw)], id_of)
    id_of.update({entry["content"]: entry["id"] for entry in added})
    special_tokens = {name: _token_name(config.get(name)) for name in ("bos_token", "eos_token", "unk_token", "pad_token")}
    for name, token in special_tokens.items():
        if token is not None and token not in id_of:
            raise ValueError(f"{where}: tokenizer_config {name} = {token!r} is not in the vocabulary")

    prefix, suffix = _post_processor_ids(data.get("post_processor"), f"{where}: post_processor")
    # transformers rebuilds the post-processor when the config states add_bos_token / add_eos_token.
    if "add_bos_token" in config or "add_eos_token" in config:
        bos, eos = special_tokens["bos_token"], special_tokens["eos_token"]
        prefix = [id_of[bos]] if config.get("add_bos_token") and bos is not None else []
        suffix = [id_of[eos]] if config.get("add_eos_token") and eos is not None else []

    special_contents = {entry["content"] for entry in added if entry["special"]}
    end_ids = {id_of[token] for token in END_OF_TURN_TOKENS if token in special_contents}
    if special_tokens["eos_token"] is not None:
        end_ids.add(id_of[special_tokens["eos_token"]])

    return {
        "format": SPEC_FORMAT,
        "version": SPEC_VERSION,
        "source": where,
        "model": model,
        "added_tokens": added,
        "normalizer": data.get("normalizer"),
        "pre_tokenizer": data.get("pre_tokenizer"),
        "decoder": data.get("decoder"),
        "prefix_ids": prefix,
        "suffix_ids": suffix,
        "special_tokens": special_tokens,
        "end_ids": sorted(end_ids),
        "chat_template": _chat_template(config.get("chat_template"), where),
    }
