"""Tool calling through the model's own chat template (Qwen2.5's), with the official `openai`
client: a call with valid JSON arguments, the tool's result sent back, a final answer; streamed
calls; tool_choice; and the server serving on after every refusal."""

from __future__ import annotations

import json

import openai
import pytest

WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "Get the current weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string", "description": "The city name"}},
                   "required": ["city"]}}}
TIME = {"type": "function", "function": {
    "name": "get_time", "description": "Get the current local time in a time zone",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string"}}, "required": ["timezone"]}}}
TOOLS = [WEATHER, TIME]
SYSTEM = {"role": "system", "content": "You are a weather assistant. When you get a tool response, answer the "
                                       "user's question in one sentence using it."}
QUESTION = {"role": "user", "content": "What's the weather like in Paris right now?"}


@pytest.fixture(scope="module")
def client(tool_served):
    return openai.OpenAI(base_url=tool_served.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def test_tool_call_round_trip(client):
    first = client.chat.completions.create(model="gpt-4o-mini", messages=[SYSTEM, QUESTION], tools=TOOLS,
                                           max_tokens=64, temperature=0)
    choice = first.choices[0]
    assert choice.finish_reason == "tool_calls", choice.message
    call = choice.message.tool_calls[0]
    assert call.type == "function" and call.id.startswith("call_")
    assert call.function.name == "get_weather"
    assert "paris" in json.loads(call.function.arguments)["city"].lower()

    result = {"role": "tool", "tool_call_id": call.id, "content": json.dumps({"temperature_c": 18, "sky": "cloudy"})}
    history = [SYSTEM, QUESTION, choice.message.model_dump(exclude_none=True), result]
    # Small models tend to call the tool again after its result; tool_choice "none" asks for the answer.
    final = client.chat.completions.create(model="gpt-4o-mini", messages=history, tools=TOOLS, tool_choice="none",
                                           max_tokens=48, temperature=0)
    answer = final.choices[0]
    assert answer.finish_reason == "stop" and not answer.message.tool_calls
    assert "18" in answer.message.content, answer.message.content


def test_streamed_tool_call(client):
    chunks = list(client.chat.completions.create(model="x", messages=[SYSTEM, QUESTION], tools=TOOLS, max_tokens=64,
                                                 temperature=0, stream=True))
    assert chunks[0].choices[0].delta.role == "assistant"
    deltas = [d for c in chunks if c.choices for d in (c.choices[0].delta.tool_calls or [])]
    assert len(deltas) >= 1 and deltas[0].function.name == "get_weather"
    arguments = "".join(d.function.arguments or "" for d in deltas if d.index == 0)
    assert "paris" in json.loads(arguments)["city"].lower()
    assert not "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)  # no text leaked
    assert [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason] == ["tool_calls"]


def test_tool_choice_names_a_function(client):
    r = client.chat.completions.create(model="x", messages=[QUESTION], tools=TOOLS, max_tokens=64, temperature=0,
                                       tool_choice={"type": "function", "function": {"name": "get_time"}})
    calls = r.choices[0].message.tool_calls
    assert len(calls) == 1 and calls[0].function.name == "get_time"
    assert isinstance(json.loads(calls[0].function.arguments)["timezone"], str)


def test_tool_choice_none_answers_in_text(client):
    r = client.chat.completions.create(model="x", messages=[{"role": "user", "content": "Say hello."}], tools=TOOLS,
                                       tool_choice="none", max_tokens=24, temperature=0)
    assert r.choices[0].message.content and not r.choices[0].message.tool_calls


def test_bad_tool_requests_are_400_and_the_server_serves_on(client):
    bad = [dict(tools=[{"type": "function", "function": {"name": "bad name!"}}]),
           dict(tools=TOOLS, tool_choice={"type": "function", "function": {"name": "nope"}}),
           dict(tools=TOOLS, tool_choice="sometimes"),
           dict(tools=TOOLS, response_format={"type": "json_object"}),
           dict(tools=[{"type": "function", "function": {"name": "f", "parameters": {"type": "objec"}}}])]
    for fields in bad:
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(model="x", messages=[QUESTION], max_tokens=8, **fields)
        assert e.value.param in ("tools", "tool_choice", "response_format"), fields
    r = client.chat.completions.create(model="x", messages=[QUESTION], tools=TOOLS, max_tokens=64, temperature=0)
    assert r.choices[0].message.tool_calls
