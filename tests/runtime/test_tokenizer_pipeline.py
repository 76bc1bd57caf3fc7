"""Tokenizer pipeline steps beyond what the two real models use, against the `tokenizers`
library (the engine under transformers), plus chat fallbacks, the spec and error messages.

The vocabularies are real: SmolLM2's byte-level BPE as transformers writes it, and Gemma's
SentencePiece vocabulary (cut to its first 20000 tokens plus every single character, so that
words are built by merges rather than bytes) ranked by scores, the way other SentencePiece GGUF
files are.
"""

from __future__ import annotations

import copy
import json
import random

import pytest
from edgeflash.export.corpus import heldout_text
from edgeflash.runtime.sources.gguf import read_metadata
from edgeflash.runtime.tokenizer import StreamDecoder, Tokenizer, render_chat

SENTENCEPIECE_TOKENS = 20_000


def _sample_texts(count: int, seed: int) -> list[str]:
    held = heldout_text()
    rng = random.Random(seed)
    texts = []
    for index in range(count):
        start = rng.randrange(len(held) - 400)
        text = held[start:start + rng.randrange(0, 300)]
        if index % 3 == 0:
            text = " " + text
        if index % 4 == 0:
            text += " 2024 😀 日本語 <start_of_turn>x  y <|im_start|>"
        texts.append(text)
    return texts + ["", " ", "  two", "a\u2581b c", "\u2581\u2581x \u2581", "KING  Lear the thE other  KING!",
                    "Ⅻ ① ² ﬁ Café 12345 ٣٤٥", "e e  eee  ,a.b;c"]


TEXTS = _sample_texts(300, seed=7)


@pytest.fixture(scope="module")
def byte_level_json(smollm_path) -> dict:
    from hf_reference import transformers_tokenizer

    reference = transformers_tokenizer(smollm_path)
    return json.loads(reference.backend_tokenizer.to_str())


@pytest.fixture(scope="module")
def sentencepiece(gemma_path) -> tuple[dict, dict]:
    """(GGUF-style metadata of a SentencePiece vocabulary ranked by scores, the tokenizer.json
    transformers builds from it). Scores are shuffled with many ties to exercise the tie rules."""
    from transformers.integrations.gguf.gguf_tokenizer_mapping import convert_gguf_tokenizer

    meta = read_metadata(gemma_path)
    rng = random.Random(0)
    keep = [i for i, token in enumerate(meta["tokenizer.ggml.tokens"]) if i < SENTENCEPIECE_TOKENS or len(token) == 1]
    tokens = [meta["tokenizer.ggml.tokens"][i] for i in keep]
    types = [meta["tokenizer.ggml.token_type"][i] for i in keep]
    scores = [float(rng.randrange(-500, 0)) for _ in tokens]
    backend, _ = convert_gguf_tokenizer(
        "llama", {"tokenizer_type": "llama", "tokens": tokens, "scores": scores, "token_type": types}
    )
    sp_meta = {
        "general.architecture": "llama",
        "tokenizer.ggml.model": "llama",
        "tokenizer.ggml.tokens": tokens,
        "tokenizer.ggml.scores": scores,
        "tokenizer.ggml.token_type": types,
        "tokenizer.ggml.add_bos_token": False,
    }
    return sp_meta, json.loads(backend.to_str())


def _assert_same_as_reference(data: dict, texts: list[str] = TEXTS) -> Tokenizer:
    from tokenizers import Tokenizer as Reference

    reference = Reference.from_str(json.dumps(data))
    tok = Tokenizer.from_tokenizer_json(data)
    for text in texts:
        expected = reference.encode(text).ids
        ids = tok.encode(text)
        assert ids == expected, text[:80]
        for skip in (False, True):
            assert tok.decode(ids, skip_special=skip) == reference.decode(expected, skip_special_tokens=skip), text[:80]
        stream = StreamDecoder(tok)
        assert "".join(stream.push(i) for i in ids) + stream.flush() == tok.decode(ids), text[:80]
    return tok


def _with(data: dict, **changes) -> dict:
    changed = copy.deepcopy(data)
    changed.update(changes)
    return changed


def _byte_level(add_prefix_space: bool, use_regex: bool) -> dict:
    return {"type": "ByteLevel", "add_prefix_space": add_prefix_space, "trim_offsets": True, "use_regex": use_regex}


def test_sentencepiece_gguf_ranked_by_scores(sentencepiece):
    from tokenizers import Tokenizer as Reference

    meta, data = sentencepiece
    reference = Reference.from_str(json.dumps(data))
    tok = Tokenizer.from_gguf_metadata(meta)
    assert tok._model.merge_order == "scores"  # no merge list was built
    for text in TEXTS:
        assert tok.encode(text) == reference.encode(text).ids, text[:80]
        ids = reference.encode(text).ids
        assert tok.decode(ids) == reference.decode(ids, skip_special_tokens=False)
    # The scores decide: ranking the same vocabulary by token order splits words differently.
    by_order = Tokenizer.from_gguf_metadata({**meta, "tokenizer.ggml.scores": [-float(i) for i in range(len(meta["tokenizer.ggml.tokens"]))]})
    assert sum(by_order.encode(text) != tok.encode(text) for text in TEXTS) > len(TEXTS) // 2


@pytest.mark.parametrize("scheme", ["always", "first", "never"])
@pytest.mark.parametrize("split", [True, False])
def test_metaspace(sentencepiece, scheme, split):
    metaspace = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": scheme, "split": split}
    _assert_same_as_reference(_with(sentencepiece[1], pre_tokenizer=metaspace, decoder=metaspace))


def test_prepend_and_replace_normalizers_with_strip_decoder(sentencepiece):
    # Phi-3's shape: the prefix space comes from a normalizer, the decoder strips it again.
    data = sentencepiece[1]
    normalizer = {"type": "Sequence", "normalizers": [
        {"type": "Prepend", "prepend": "\u2581"},
        {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]}
    _assert_same_as_reference(_with(data, normalizer=normalizer, pre_tokenizer=None))


def test_byte_level_gguf_file_matches_its_tokenizer_json(byte_level_json):
    _assert_same_as_reference(byte_level_json)


def test_unicode_normalizers_digits_and_template(byte_level_json):
    template = {
        "type": "TemplateProcessing",
        "single": [{"SpecialToken": {"id": "<|im_start|>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}},
                   {"SpecialToken": {"id": "<|im_end|>", "type_id": 0}}],
        "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
        "special_tokens": {"<|im_start|>": {"id": "<|im_start|>", "ids": [1], "tokens": ["<|im_start|>"]},
                           "<|im_end|>": {"id": "<|im_end|>", "ids": [2], "tokens": ["<|im_end|>"]}},
    }
    tok = _assert_same_as_reference(_with(
        byte_level_json,
        normalizer={"type": "Sequence", "normalizers": [{"type": "NFC"}, {"type": "Lowercase"}]},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": True},
                                                              _byte_level(True, True)]},
        post_processor=template,
    ))
    assert tok.encode("x")[0] == 1 and tok.encode("x")[-1] == 2
    assert tok.encode("x", add_bos=False, add_eos=False) == tok.encode("x")[1:-1]
    _assert_same_as_reference(_with(
        byte_level_json,
        normalizer={"type": "NFKD"},
        pre_tokenizer={"type": "Sequence", "pretokenizers": [{"type": "Digits", "individual_digits": False},
                                                              _byte_level(False, True)]},
    ))


def test_split_behaviors(byte_level_json):
    def split(pattern: dict, behavior: str, invert: bool = False) -> dict:
        return {"type": "Split", "pattern": pattern, "behavior": behavior, "invert": invert}

    _assert_same_as_reference(_with(byte_level_json, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        split({"String": "e"}, "MergedWithNext"),
        split({"Regex": "[aeiou]+"}, "MergedWithPrevious"),
        split({"Regex": r"\s+"}, "Contiguous", invert=True),
        split({"Regex": "[,.;]"}, "Removed"),
        _byte_level(False, False),
    ]}))
    _assert_same_as_reference(_with(byte_level_json, pre_tokenizer={"type": "Sequence", "pretokenizers": [
        {"type": "WhitespaceSplit"}, _byte_level(True, False)]}))


def test_ignore_merges(byte_level_json):
    _assert_same_as_reference(_with(byte_level_json, model={**byte_level_json["model"], "ignore_merges": True}))


def test_added_token_flags(byte_level_json):
    def added(token_id: int, content: str, **flags) -> dict:
        return {"id": token_id, "content": content, "single_word": False, "lstrip": False, "rstrip": False,
                "normalized": False, "special": False, **flags}

    tok = _assert_same_as_reference(_with(
        byte_level_json,
        normalizer={"type": "Lowercase"},
        added_tokens=byte_level_json["added_tokens"] + [
            added(100, "the", single_word=True),
            added(200, "KING", lstrip=True, rstrip=True, special=True),  # not in the vocabulary: gets a new id
            added(300, "lord", normalized=True),
        ],
    ), texts=TEXTS + ["my lord LORD", "other the", "   KING   "])
    assert tok.vocab_size == len(byte_level_json["model"]["vocab"]) + 1


def test_chat_fallback_formats(byte_level_json):
    # Without its template SmolLM2's vocabulary still shows ChatML, which its template writes
    # too once the conversation has a system message.
    templated = Tokenizer.from_tokenizer_json(byte_level_json, {"chat_template": _SMOLLM2_LIKE_TEMPLATE})
    chatml = Tokenizer.from_tokenizer_json(byte_level_json)
    assert (templated.chat_format, chatml.chat_format) == ("template", "chatml")
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"},
                {"role": "assistant", "content": "Hello."}, {"role": "user", "content": "Bye"}]
    assert render_chat(chatml, messages) == render_chat(templated, messages)
    assert render_chat(chatml, messages, add_generation_prompt=False) + "<|im_start|>assistant\n" == render_chat(
        chatml, messages)

    spec = chatml.to_dict()
    for entry in spec["added_tokens"]:
        entry["content"] = entry["content"].replace("im_", "xx_")
    spec["model"]["vocab"] = [token.replace("<|im_", "<|xx_") for token in spec["model"]["vocab"]]
    plain = Tokenizer.from_dict(spec)
    assert plain.chat_format == "plain"
    assert render_chat(plain, messages) == "System: Be brief.\nUser: Hi\nAssistant: Hello.\nUser: Bye\nAssistant:"


_SMOLLM2_LIKE_TEMPLATE = (
    "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
    "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def test_chat_template_runs_sandboxed(byte_level_json):
    failing = Tokenizer.from_tokenizer_json(byte_level_json, {"chat_template": "{{ raise_exception('no system role') }}"})
    with pytest.raises(ValueError, match="no system role"):
        render_chat(failing, [{"role": "user", "content": "hi"}])
    escaping = Tokenizer.from_tokenizer_json(
        byte_level_json, {"chat_template": "{{ messages.__class__.__mro__[1].__subclasses__() }}"})
    with pytest.raises(ValueError, match="chat_template"):
        render_chat(escaping, [{"role": "user", "content": "hi"}])
    with pytest.raises(ValueError, match="chat message 0"):
        render_chat(escaping, [{"content": "no role"}])
    helpers = Tokenizer.from_tokenizer_json(
        byte_level_json, {"chat_template": "{{ bos_token }}|{{ eos_token }}|{{ messages | tojson }}|{{ add_generation_prompt }}",
                          "bos_token": "<|im_start|>", "eos_token": {"content": "<|im_end|>"}})
    assert render_chat(helpers, [{"role": "user", "content": "é"}]) == (
        '<|im_start|>|<|im_end|>|[{"role": "user", "content": "é"}]|True')


def test_gguf_with_unknown_tokenizer_model_is_refused(tmp_path):
    import gguf

    path = tmp_path / "rwkv-vocab.gguf"
    writer = gguf.GGUFWriter(str(path), "rwkv6")
    writer.add_string("tokenizer.ggml.model", "rwkv")
    writer.add_array("tokenizer.ggml.tokens", ["a", "b"])
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    with pytest.raises(ValueError, match=r"tokenizer\.ggml\.model = 'rwkv'"):
        Tokenizer.from_gguf_metadata(read_metadata(path))


@pytest.mark.parametrize("field, value, message", [
    ("tokenizer.ggml.model", None, r"tokenizer\.ggml\.model = None"),
    ("tokenizer.ggml.tokens", [], r"tokenizer\.ggml\.tokens is missing or empty"),
    ("tokenizer.ggml.scores", [0.0], r"tokenizer\.ggml\.scores has 1 entries; expected \d+ \(one per token\)"),
    ("tokenizer.ggml.bos_token_id", 10**6, r"tokenizer\.ggml\.bos_token_id = 1000000 is not a token id"),
])
def test_gguf_metadata_errors_name_the_field(sentencepiece, field, value, message):
    meta = dict(sentencepiece[0])
    meta[field] = value
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_gguf_metadata(meta)


@pytest.mark.parametrize("change, message", [
    (lambda d: d["model"].update(type="WordPiece"), r"model\.type = 'WordPiece' is not supported"),
    (lambda d: d.pop("model"), r"field model is NoneType"),
    (lambda d: d["model"].update(vocab=[]), r"model\.vocab is list"),
    (lambda d: d["model"]["merges"].insert(3, "lonely"), r"model\.merges\[3\] = 'lonely'"),
    (lambda d: d["model"]["merges"].insert(0, ["zzzq", "qzzz"]), r"BPE merge #0 \('zzzq', 'qzzz'\) uses 'zzzq'"),
    (lambda d: d.update(pre_tokenizer={"type": "BertPreTokenizer"}), r"pre_tokenizer\.type = 'BertPreTokenizer'"),
    (lambda d: d.update(normalizer={"type": "Precompiled", "precompiled_charsmap": ""}),
     r"normalizer\.type = 'Precompiled'"),
    (lambda d: d.update(decoder={"type": "Sequence", "decoders": [{"type": "CTC"}]}),
     r"decoder\.decoders\[0\]\.type = 'CTC'"),
    (lambda d: d.update(post_processor={"type": "Mystery"}), r"post_processor\.type = 'Mystery'"),
    (lambda d: d["added_tokens"].append({"content": "<x>"}), r"added_tokens\[17\]: an added token needs 'id'"),
])
def test_malformed_tokenizer_json_names_the_field(byte_level_json, change, message):
    data = copy.deepcopy(byte_level_json)
    change(data)
    with pytest.raises(ValueError, match=message):
        Tokenizer.from_tokenizer_json(data)


def test_tokenizer_json_file_errors(tmp_path):
    with pytest.raises(ValueError, match="no such tokenizer.json"):
        Tokenizer.from_tokenizer_json(tmp_path)
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": {"type": "BPE", "vocab": {', encoding="utf-8")
    with pytest.raises(ValueError, match=r"tokenizer\.json: not valid JSON"):
        Tokenizer.from_tokenizer_json(broken)


def test_spec_is_checked(byte_level_json):
    spec = Tokenizer.from_tokenizer_json(byte_level_json).to_dict()
    with pytest.raises(ValueError, match="field version = 99"):
        Tokenizer.from_dict({**spec, "version": 99})
    with pytest.raises(ValueError, match="prefix_ids holds 99999"):
        Tokenizer.from_dict({**spec, "prefix_ids": [99999]})
    with pytest.raises(ValueError, match="outside the vocabulary"):
        Tokenizer.from_dict(spec).decode([len(spec["model"]["vocab"])])
