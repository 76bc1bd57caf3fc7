"""Tokenizers of the two real models against transformers.

For each model the pure-Python tokenizer is built twice -- from the GGUF metadata and from the
tokenizer.json that transformers writes for the same GGUF -- and both must give transformers'
token ids, decoded text and chat prompt.
"""

from __future__ import annotations

import json

import pytest
from edgeflash.export.corpus import heldout_text
from edgeflash.runtime.sources.gguf import read_metadata
from edgeflash.runtime.tokenizer import StreamDecoder, Tokenizer, chat_ids, render_chat


def _texts() -> list[str]:
    held = heldout_text()
    passage = held[1000:4400]  # a 3400-character Shakespeare passage (held-out plays)
    assert len(passage) > 3000
    return [
        "",
        "Hello world",
        "The quick brown fox jumps over the lazy dog. It wasn't me, you'll see; we've said I'M done.",
        passage,
        held[200_000:201_500],
        "def area(r: float) -> float:\n    \"\"\"Circle.\"\"\"\n    return 3.14159 * r ** 2  # pi r^2\n\n\tif x>=0: pass\n",
        "<table><tr><td>cell</td></tr></table> <h1>Title</h1> {\"key\": [1, 2, 3]}",
        "Café naïve résumé Ångström façade — “quotes” ‘single’ …",
        "日本語のテキストと中文文本，한국어 텍스트",
        "emoji 😀🎉👍🏽 family 👨‍👩‍👧‍👦 flag 🇫🇷 rare 𓀀𝔘𝔫𝔦",
        "Ελληνικά Русский עברית العربية हिन्दी ไทย",
        "   leading spaces",
        "trailing spaces   ",
        "runs:    four  two\n\n\n\nnewlines\t\ttabs\t \n \r\nwindows\r\n",
        " ",
        "\n",
        "digits 0 12 345 6789 1234567890123 3.14159 1,000,000 ٣٤٥ ①²Ⅻ",
        "<start_of_turn>user\nHi there<end_of_turn>\n<start_of_turn>model\n",
        "<|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n",
        "<bos>text<eos> <unk> <pad> <|endoftext|> <mask>",
        "\u00a0nbsp\u2003emsp\u3000ideographic\u200bzero-width\u200djoiner ﬁ ligature",
        "controls \x00\x01\x1c\x7f\x85 end",
        "a" * 500,
    ]


TEXTS = _texts()
CONVERSATIONS = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [{"role": "system", "content": "You are terse."}, {"role": "user", "content": "Name three rivers."}],
    [
        {"role": "user", "content": "Hi!"},
        {"role": "assistant", "content": "Hello! How can I help?"},
        {"role": "user", "content": "Tell me a joke about 日本 and 😀."},
    ],
]


@pytest.fixture(scope="module", params=["gemma3", "smollm2"])
def model(request, tmp_path_factory) -> dict:
    """The model's GGUF, transformers' tokenizer for it, and ours built from GGUF and from
    the tokenizer.json transformers saves."""
    from hf_reference import transformers_tokenizer

    path = request.getfixturevalue("gemma_path" if request.param == "gemma3" else "smollm_path")
    reference = transformers_tokenizer(path)
    saved = tmp_path_factory.mktemp(f"{request.param}-tokenizer")
    reference.save_pretrained(saved)
    return {
        "name": request.param,
        "reference": reference,
        "gguf": Tokenizer.from_gguf_metadata(read_metadata(path)),
        "json": Tokenizer.from_tokenizer_json(saved),
        "saved": saved,
    }


@pytest.fixture(params=["gguf", "json"])
def tok(model, request) -> Tokenizer:
    return model[request.param]


def test_encode_matches_transformers(model, tok):
    reference = model["reference"]
    for text in TEXTS:
        assert tok.encode(text) == reference.encode(text), text[:80]
        assert tok.encode(text, add_bos=False) == reference.encode(text, add_special_tokens=False), text[:80]


def test_special_token_text_can_be_encoded_as_plain_text(model, tok):
    reference = model["reference"]
    for text in TEXTS:
        expected = reference.encode(text, split_special_tokens=True)
        assert tok.encode(text, parse_special=False) == expected, text[:80]
    marker = "<start_of_turn>" if model["name"] == "gemma3" else "<|im_start|>"
    assert len(tok.encode(marker, add_bos=False)) == 1
    assert len(tok.encode(marker, add_bos=False, parse_special=False)) > 1


def test_bos_follows_the_model_default(model, tok):
    ids = tok.encode("Hello")
    if model["name"] == "gemma3":  # the GGUF says add_bos_token = true
        assert tok.bos_id == 2 and ids[0] == tok.bos_id
    else:  # SmolLM2's GGUF says false
        assert tok.bos_id == 1 and ids[0] != tok.bos_id
    assert tok.encode("Hello", add_bos=True)[0] == tok.bos_id
    assert tok.encode("Hello", add_bos=False) == [i for i in ids if i != tok.bos_id]


def test_decode_matches_transformers(model, tok):
    reference = model["reference"]
    for text in TEXTS:
        ids = reference.encode(text)
        assert tok.decode(ids) == reference.decode(ids), text[:80]
        assert tok.decode(ids, skip_special=True) == reference.decode(ids, skip_special_tokens=True), text[:80]


def test_decode_of_encode_restores_the_text(model, tok):
    for text in TEXTS:
        if model["name"] == "gemma3" and "\u2581" in text:
            continue  # Gemma spells spaces as U+2581, so that one character is not kept
        assert tok.decode(tok.encode(text, add_bos=False)) == text, text[:80]


def test_stream_decoder_equals_decode(tok):
    for text in TEXTS:
        ids = tok.encode(text)
        stream = StreamDecoder(tok)
        pieces = [stream.push(token_id) for token_id in ids] + [stream.flush()]
        assert "".join(pieces) == tok.decode(ids), text[:80]
        assert all("\ufffd" not in piece for piece in pieces if "\ufffd" not in text)


def test_stream_decoder_holds_back_split_characters(model, tok):
    # Characters this vocabulary has no token for are spelled as byte tokens (Gemma) or as
    # several byte-level pieces (SmolLM2): the stream must not cut them.
    text = "rare 𓀀𓁐 and 𝔘𝔫𝔦 then 😀"
    ids = tok.encode(text, add_bos=False)
    partial = [token_id for token_id in ids if _is_partial_utf8(tok.token_bytes(token_id))]
    assert partial, "the test text should include tokens holding part of a character"
    if model["name"] == "gemma3":
        assert any(tok.id_to_token(token_id).startswith("<0x") for token_id in partial)
    stream = StreamDecoder(tok)
    pieces = [stream.push(token_id) for token_id in ids]
    assert "".join(pieces) + stream.flush() == text
    assert all("\ufffd" not in piece for piece in pieces)
    assert any(piece == "" for token_id, piece in zip(ids, pieces) if token_id in partial)


def _is_partial_utf8(data: bytes) -> bool:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError:
        return True
    return False


def test_eos_ids_include_end_of_turn(model, tok):
    vocab = {tok.id_to_token(i): i for i in tok.eos_ids}
    if model["name"] == "gemma3":
        assert {"<eos>", "<end_of_turn>"} <= set(vocab)
    else:
        assert {"<|im_end|>", "<|endoftext|>"} <= set(vocab)
    assert tok.eos_id in tok.eos_ids


def test_chat_prompt(model, tok):
    reference = model["reference"]
    for messages in CONVERSATIONS:
        text = render_chat(tok, messages, add_generation_prompt=True)
        if model["name"] == "smollm2":
            assert tok.chat_format == "template"
            assert text == reference.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
        else:
            assert tok.chat_format == "gemma" and tok.chat_template is None
            assert text.endswith("<end_of_turn>\n<start_of_turn>model\n")
            assert text.count("<start_of_turn>") == len([m for m in messages if m["role"] != "system"]) + 1
        ids = chat_ids(tok, messages)
        assert ids == reference.encode(text)  # BOS exactly once, as the model wants
    system_first = render_chat(model["gguf"], CONVERSATIONS[1])
    if model["name"] == "gemma3":
        assert system_first == (
            "<start_of_turn>user\nYou are terse.\n\nName three rivers.<end_of_turn>\n<start_of_turn>model\n"
        )


def test_spec_round_trips_through_json(model):
    tok = model["gguf"]
    restored = Tokenizer.from_dict(json.loads(tok.to_json()))
    assert restored.vocab_size == tok.vocab_size and restored.eos_ids == tok.eos_ids
    assert restored.chat_format == tok.chat_format and restored.bos_id == tok.bos_id
    for text in TEXTS:
        ids = tok.encode(text)
        assert restored.encode(text) == ids
        assert restored.decode(ids) == tok.decode(ids)
