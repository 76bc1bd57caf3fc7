"""The generation loop on a real model: stop strings, streaming, EOS, prompt reuse, limits."""

from __future__ import annotations

import edgeflash as ef
import pytest
from edgeflash.base.errors import UserError


@pytest.fixture(scope="module", params=["native", "reference"])
def smol(request):
    return ef.load("smollm2-135m", engine=request.param)


PROMPT = "List the days of the week: Monday, Tuesday,"


def test_stream_pieces_join_to_text(smol):
    pieces = list(smol.stream(PROMPT, max_tokens=16))
    full = smol.generate(PROMPT, max_tokens=16)
    assert "".join(pieces) == full.text
    assert len(pieces) > 1
    assert full.stats["generated_tokens"] == len(full.tokens) == 16


def test_stop_string_cuts_text_and_never_streams_it(smol):
    full = smol.generate(PROMPT, max_tokens=16).text
    assert "Friday" in full  # the greedy continuation lists the days
    pieces = list(smol.stream(PROMPT, max_tokens=16, stop=["Friday"]))
    text = "".join(pieces)
    assert text == full[:full.index("Friday")]
    assert smol.generate(PROMPT, max_tokens=16, stop="Friday").finish_reason == "stop"


def test_chat_ends_at_end_of_turn(smol):
    r = smol.chat([{"role": "user", "content": "Say hello."}], max_tokens=64)
    assert r.finish_reason == "stop"  # <|im_end|> ends the turn before 64 tokens
    assert "<|im_end|>" not in r.text and r.text.strip()


def test_prompt_prefix_is_reused(smol):
    smol.generate(PROMPT, max_tokens=4)
    r = smol.generate(PROMPT + " Wednesday", max_tokens=4)
    assert r.stats["prompt_tokens_reused"] > 5


def test_same_output_with_and_without_reuse(smol):
    a = smol.generate(PROMPT, max_tokens=12).tokens
    smol.engine.reset()
    b = smol.generate(PROMPT, max_tokens=12).tokens
    assert a == b


def test_zero_tokens(smol):
    r = smol.generate(PROMPT, max_tokens=0)
    assert r.text == "" and r.tokens == []


def test_limits(smol):
    with pytest.raises(UserError, match="max_tokens"):
        smol.generate(PROMPT, max_tokens=-1)
    with pytest.raises(UserError, match="empty"):
        smol.generate([], max_tokens=4)
    with pytest.raises(UserError, match="messages\\[0\\]"):
        smol.chat([{"role": "user"}])
    small = ef.load("smollm2-135m", engine=smol.engine.name, context_length=8)
    with pytest.raises(UserError, match="context"):
        small.generate("one two three four five six seven eight nine ten", max_tokens=4)


def test_logprobs_are_the_models_log_softmax(smol):
    import numpy as np

    r = smol.generate(PROMPT, max_tokens=4, logprobs=3)
    assert len(r.logprobs) == len(r.tokens) == 4
    smol.engine.reset()
    logits = smol.engine.forward(smol.encode(PROMPT) + r.tokens[:-1], all_logits=True)[-4:].astype(np.float64)
    log_softmax = logits - np.log(np.exp(logits - logits.max(1, keepdims=True)).sum(1, keepdims=True)) - logits.max(
        1, keepdims=True)
    for row, token, entry in zip(log_softmax, r.tokens, r.logprobs):
        assert entry.token == token
        assert abs(entry.logprob - row[token]) < 2e-3
        assert [t for t, _ in entry.top] == list(np.argsort(-row)[:3])
    assert smol.generate(PROMPT, max_tokens=4).logprobs is None  # only when asked


def test_json_schema_constrains_any_model(smol):
    import json

    schema = {"type": "object", "properties": {"day": {"enum": ["Monday", "Friday"]}, "n": {"type": "integer"}},
              "required": ["day", "n"], "additionalProperties": False}
    r = smol.generate(PROMPT, max_tokens=40, json_schema=schema)
    value = json.loads(r.text)
    assert value["day"] in ("Monday", "Friday") and isinstance(value["n"], int)
    assert r.finish_reason == "stop"
    with pytest.raises(UserError, match="json_schema"):
        smol.generate(PROMPT, max_tokens=4, json_schema={"type": "objec"})
