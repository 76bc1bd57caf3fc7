"""Structured output on a real vocabulary: a JSON constraint allows exactly the tokens that keep
the text valid, tool-call grammars accept the call shapes and refuse the rest, and calls are
parsed back out of the text in OpenAI's shape."""

from __future__ import annotations

import json

import numpy as np
import pytest
from edgeflash.base.errors import UserError
from edgeflash.runtime.structured import JSON_OBJECT, Constraint, json_grammar
from edgeflash.runtime.structured.tool_calls import HERMES, check_tools

TOOLS = [{"type": "function", "function": {"name": "get_weather", "parameters": {
    "type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}},
    {"type": "function", "function": {"name": "get_time"}}]


@pytest.fixture(scope="module")
def smol():
    import edgeflash as ef

    return ef.load("smollm2-135m")


def feed(constraint: Constraint, tok, text: str) -> bool:
    """Whether the grammar accepts `text` token by token (as the tokenizer splits it)."""
    for token in tok.encode(text, add_bos=False):
        if not constraint.allowed()[token]:
            return False
        constraint.accept(token)
    return True


def test_json_mask_allows_only_valid_continuations(smol):
    tok, vocab = smol.tokenizer, smol.spec.vocab_size
    c = Constraint(tok, vocab, json_grammar(JSON_OBJECT))
    allowed = c.allowed()
    texts = [tok.decode([int(i)]) for i in np.nonzero(allowed)[0]]
    assert texts and all(t.startswith("{") for t in texts), texts[:10]
    assert feed(c, tok, '{"a": [1, 2], "b": "x"}')
    after = np.nonzero(c.allowed())[0]
    assert set(after.tolist()) == set(tok.eos_ids) & set(range(vocab))  # only the end may follow
    masked = c.mask(np.zeros(vocab, dtype=np.float32))
    assert np.isneginf(masked).sum() == vocab - len(after)


def test_json_mask_refuses_a_broken_value(smol):
    tok, vocab = smol.tokenizer, smol.spec.vocab_size
    assert not feed(Constraint(tok, vocab, json_grammar(JSON_OBJECT)), tok, '{"a": tru"')
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}, "required": ["n"]}
    assert not feed(Constraint(tok, vocab, json_grammar(schema)), tok, '{"n": "one"}')
    assert feed(Constraint(tok, vocab, json_grammar(schema)), tok, '{"n": 12}')


def test_bad_schema_is_a_user_error(smol):
    with pytest.raises(UserError, match="where: .*objec"):
        Constraint(smol.tokenizer, smol.spec.vocab_size, json_grammar({"type": "objec"}), what="where")


@pytest.mark.parametrize("text, choice, ok", [
    ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>', "auto", True),
    ('{"name": "get_weather", "arguments": {"city": "Paris"}}', "required", True),
    ('```json\n{"name": "get_time", "arguments": {}}\n```', "auto", True),
    ('It is sunny.', "auto", True),
    ('It is sunny.', "required", False),
    ('{"name": "get_weather", "arguments": {"town": "Paris"}}', "auto", False),  # city is required
    ('{"name": "get_time", "arguments": {}}', "get_weather", False),
    ('{"name": "delete_all", "arguments": {}}', "auto", False),
    ('{"x": 1}', "none", False),
])
def test_tool_grammar(smol, text, choice, ok):
    c = Constraint(smol.tokenizer, smol.spec.vocab_size, HERMES.grammar(TOOLS, choice))
    assert feed(c, smol.tokenizer, text) is ok


def test_parse_tool_calls():
    text = ('<tool_call>\n{"name": "get_weather", "arguments": {"city": "Paris"}}\n</tool_call>\n'
            '<tool_call>\n{"name": "get_time", "arguments": {}}\n</tool_call>')
    content, calls = HERMES.parse(text, TOOLS)
    assert content is None and [c["function"]["name"] for c in calls] == ["get_weather", "get_time"]
    assert json.loads(calls[0]["function"]["arguments"]) == {"city": "Paris"}
    assert calls[0]["id"] != calls[1]["id"] and calls[0]["type"] == "function"
    assert HERMES.parse('{"name": "get_time", "arguments": {}}', TOOLS)[1][0]["function"]["name"] == "get_time"
    assert HERMES.parse("Just text.", TOOLS) == ("Just text.", [])
    assert HERMES.parse('{"name": "unknown", "arguments": {}}', TOOLS)[1] == []


@pytest.mark.parametrize("tools, fragment", [
    ([], "non-empty list"), ([{"type": "retrieval"}], "tools[0]"),
    ([{"type": "function", "function": {"name": "a b"}}], "tools[0].function.name"),
    ([{"type": "function", "function": {"name": "f", "parameters": []}}], "parameters"),
    ([{"type": "function", "function": {"name": "f"}}] * 2, "two tools"),
])
def test_check_tools(tools, fragment):
    with pytest.raises(UserError, match=fragment.replace("[", r"\[").replace("]", r"\]")):
        check_tools(tools)
