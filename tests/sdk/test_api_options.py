"""The Python API's generation options: greedy unless asked (the same text every call), the
command line's sampling as one dict, JSON by schema, and tool calls from `Model.chat`."""

from __future__ import annotations

import json

import edgeflash as ef
import pytest
from edgeflash.base.errors import UserError

QUESTION = [{"role": "user", "content": "Name a colour."}]
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Current weather in a city",
                                           "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                                                          "required": ["city"]}}}]


@pytest.fixture(scope="module")
def smol():
    return ef.load("smollm2-135m")


def test_the_api_is_greedy_unless_asked(smol):
    a, b = smol.chat(QUESTION, 16), smol.chat(QUESTION, 16)
    assert a.text == b.text == smol.chat(QUESTION, 16, temperature=0.0).text


def test_speculative_none_at_load_means_no_speculation():
    m = ef.load("smollm2-135m", memory_budget="60MB", speculative=None)
    assert m.speculative == "none"
    with pytest.raises(UserError, match="expected a drafter name"):
        ef.load("smollm2-135m", speculative=1)


def test_sampling_defaults_with_a_seed_repeat(smol):
    runs = [smol.chat(QUESTION, 16, **ef.SAMPLING_DEFAULTS, seed=s).text for s in (3, 3, 4, 5, 6)]
    assert runs[0] == runs[1]
    assert len(set(runs)) > 1


def test_chat_with_a_json_schema(smol):
    schema = {"type": "object", "properties": {"colour": {"type": "string"}}, "required": ["colour"]}
    r = smol.chat(QUESTION, 40, json_schema=schema)
    assert isinstance(json.loads(r.text)["colour"], str)
    with pytest.raises(UserError, match="json_schema or grammar"):
        smol.chat(QUESTION, 4, json_schema=True, grammar="start: /a/")


def test_tools_need_a_template_that_has_them(smol):
    with pytest.raises(UserError, match="no tool calling"):
        smol.chat(QUESTION, 8, tools=TOOLS)


def test_chat_returns_tool_calls():
    qwen = ef.load("qwen2.5-coder-0.5b")
    r = qwen.chat([{"role": "user", "content": "What's the weather in Oslo?"}], 64, tools=TOOLS)
    assert r.finish_reason == "tool_calls" and r.text == ""
    assert json.loads(r.tool_calls[0]["function"]["arguments"])["city"] == "Oslo"
    with pytest.raises(UserError, match="tool_choice"):
        qwen.chat(QUESTION, 8, tools=TOOLS, tool_choice="get_time")
