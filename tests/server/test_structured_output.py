"""What shapes an answer beyond its text, through the official `openai` client: JSON by
response_format (on SmolLM2, a model never trained for it), log-probabilities, n choices, seeds
and the OpenAI penalties."""

from __future__ import annotations

import json
import math

import jsonschema
import openai
import pytest
from server_helpers import SERVER_GREEDY

JSON_PROMPTS = ["Describe a cat.", "List three fruits.", "Who wrote Hamlet?", "Give me a recipe for tea.",
                "What is 2 + 2?", "Name a planet and its moons.", "Describe the weather today.",
                "Tell me about Paris.", "What is a prime number?", "Recommend a book."]
PERSON = {"type": "object", "additionalProperties": False, "required": ["name", "age", "hobbies"],
          "properties": {"name": {"type": "string"}, "age": {"type": "integer", "minimum": 0, "maximum": 150},
                         "hobbies": {"type": "array", "items": {"type": "string"}, "minItems": 1, "maxItems": 3}}}


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=300)


def user(text: str) -> list[dict]:
    return [{"role": "user", "content": text}]


def test_json_object_always_parses(client):
    """Sampled with the server's defaults: every answer is a JSON object, 10 prompts out of 10."""
    for i, prompt in enumerate(JSON_PROMPTS):
        r = client.chat.completions.create(model="gpt-4o-mini", messages=user(prompt + " Answer in JSON."),
                                           max_tokens=200, seed=i, response_format={"type": "json_object"})
        assert r.choices[0].finish_reason == "stop", (prompt, r.choices[0].message.content)
        assert isinstance(json.loads(r.choices[0].message.content), dict), prompt


def test_json_schema_output_validates(client):
    for seed in range(3):
        r = client.chat.completions.create(
            model="gpt-4o-mini", messages=user("Invent a person: their name, age and hobbies."), max_tokens=200,
            seed=seed, response_format={"type": "json_schema", "json_schema": {"name": "person", "schema": PERSON}})
        jsonschema.validate(json.loads(r.choices[0].message.content), PERSON)


def test_json_in_a_stream_and_a_completion(client):
    chunks = list(client.chat.completions.create(model="x", messages=user("Describe a dog."), max_tokens=200,
                                                 seed=1, stream=True, response_format={"type": "json_object"}))
    assert isinstance(json.loads("".join(c.choices[0].delta.content or "" for c in chunks if c.choices)), dict)
    r = client.completions.create(model="x", prompt="A JSON object describing a car:", max_tokens=200, seed=1,
                                  extra_body={"response_format": {"type": "json_schema", "json_schema": {
                                      "name": "car", "schema": {"type": "object", "required": ["make"],
                                                                "properties": {"make": {"type": "string"}}}}}})
    assert isinstance(json.loads(r.choices[0].text)["make"], str)


def test_chat_logprobs_are_the_models(client, oracle):
    messages = user("What is the capital of France?")
    r = client.chat.completions.create(model="x", messages=messages, max_tokens=6, temperature=0, logprobs=True,
                                       top_logprobs=3)
    want = oracle.chat(messages, 6, logprobs=3, **SERVER_GREEDY)
    content = r.choices[0].logprobs.content
    assert [e.token for e in content] == [oracle.tokenizer.token_bytes(t).decode() for t in want.tokens]
    for got, entry in zip(content, want.logprobs):
        assert math.isclose(got.logprob, entry.logprob, abs_tol=1e-3) and got.logprob <= 0
        assert len(got.top_logprobs) == 3
        assert got.top_logprobs[0].logprob >= got.top_logprobs[1].logprob >= got.top_logprobs[2].logprob
        assert bytes(got.bytes).decode() == got.token
    # Greedy with penalties picks from the penalized logits; each pick is among the model's likely tokens.
    assert sum(math.exp(e.logprob) for e in content) / len(content) > 0.3


def test_completion_logprobs_streamed_and_not(client):
    kwargs = dict(model="x", prompt="The capital of France is", max_tokens=5, temperature=0, logprobs=2)
    whole = client.completions.create(**kwargs).choices[0]
    assert len(whole.logprobs.tokens) == len(whole.logprobs.token_logprobs) == 5
    assert "".join(whole.logprobs.tokens) == whole.text
    assert whole.logprobs.text_offset[0] == 0 and all(len(t) == 2 for t in whole.logprobs.top_logprobs)
    chunks = list(client.completions.create(**kwargs, stream=True))
    streamed = [t for c in chunks if c.choices[0].logprobs for t in c.choices[0].logprobs.tokens]
    assert streamed == whole.logprobs.tokens


def test_n_choices_and_seeds(client):
    kwargs = dict(model="x", messages=user("Write one sentence about the sea."), max_tokens=24, n=3, seed=11)
    a = client.chat.completions.create(**kwargs)
    b = client.chat.completions.create(**kwargs)
    assert [c.index for c in a.choices] == [0, 1, 2]
    texts = [c.message.content for c in a.choices]
    assert texts == [c.message.content for c in b.choices], "the same seed gave other text"
    assert len(set(texts)) > 1, "n choices from one seed are copies"
    assert 3 <= a.usage.completion_tokens <= 3 * 24  # all three choices count
    chunks = list(client.chat.completions.create(**kwargs, stream=True))
    streamed = {i: "".join(c.choices[0].delta.content or "" for c in chunks if c.choices and c.choices[0].index == i)
                for i in range(3)}
    assert [streamed[i] for i in range(3)] == texts
    assert sum(1 for c in chunks if c.choices and c.choices[0].finish_reason) == 3


def test_frequency_and_presence_penalties_change_greedy_text(client, oracle):
    """Penalties over the window make greedy text stop repeating the prompt, and match the API's."""
    prompt = "The cat sat on the mat. The cat sat on the mat. The cat"
    plain = client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0,
                                      extra_body={"repetition_penalty": 1.0})
    penalized = client.completions.create(model="x", prompt=prompt, max_tokens=12, temperature=0,
                                          frequency_penalty=1.5, presence_penalty=1.0,
                                          extra_body={"repetition_penalty": 1.0})
    want = oracle.generate(prompt, 12, temperature=0.0, frequency_penalty=1.5, presence_penalty=1.0)
    assert penalized.choices[0].text == want.text
    assert plain.choices[0].text.startswith(" sat on the mat")  # greedy repeats the prompt
    assert "mat" not in penalized.choices[0].text
