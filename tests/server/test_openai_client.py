"""The official `openai` client against `edgeflash serve`: answers equal `Model.generate`'s output
with the server's options, streamed or not, and stay whole when several clients ask at once; any
model name is served; penalties, logprobs, n and seeds do what OpenAI's API says."""

from __future__ import annotations

import threading
from functools import cache

import openai
import pytest
from server_helpers import SERVER_GREEDY

QUESTION = [{"role": "user", "content": "What is the capital of France?"}]
CHAT_MAX = 10
COMPLETION_PROMPTS = ["The capital of France is", "Water boils at a temperature of", "My favourite fruit is"]
COMPLETION_MAX = 6


@pytest.fixture(scope="module")
def client(served):
    return openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=300)


@pytest.fixture(scope="module")
def expected(oracle):
    """Greedy answers from the in-process API, computed once per (kind, prompt, max_tokens, stop)."""

    @cache
    def answer(kind: str, prompt: str, max_tokens: int, stop: str | None = None):
        if kind == "chat":
            return oracle.chat(QUESTION, max_tokens, stop=stop, **SERVER_GREEDY)
        return oracle.generate(prompt, max_tokens, stop=stop, **SERVER_GREEDY)

    return answer


def test_chat_completion_matches_generate(client, served, expected, oracle):
    want = expected("chat", "", CHAT_MAX)
    got = client.chat.completions.create(model=served.model_id, messages=QUESTION, max_tokens=CHAT_MAX,
                                         temperature=0)
    assert got.object == "chat.completion" and got.model == served.model_id
    assert got.choices[0].message.role == "assistant"
    assert got.choices[0].message.content == want.text
    assert got.choices[0].finish_reason == want.finish_reason
    assert got.usage.prompt_tokens == len(oracle.chat_prompt(QUESTION))
    assert got.usage.completion_tokens == len(want.tokens)
    assert got.usage.total_tokens == got.usage.prompt_tokens + got.usage.completion_tokens
    stats = got.model_extra["edgeflash"]
    assert stats["generated_tokens"] == len(want.tokens)
    assert stats["peak_rss_bytes"] > 50 * 2**20 and stats["rss_bytes"] > 50 * 2**20
    assert stats["decode_tok_s"] is None or stats["decode_tok_s"] > 0


def test_chat_stream_matches_generate(client, served, expected):
    want = expected("chat", "", CHAT_MAX)
    chunks = list(client.chat.completions.create(model="smollm2-135m", messages=QUESTION, max_tokens=CHAT_MAX,
                                                 temperature=0, stream=True,
                                                 stream_options={"include_usage": True}))
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1 and all(c.object == "chat.completion.chunk" for c in chunks)
    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == want.text
    content_chunks = [c for c in chunks if c.choices and c.choices[0].delta.content]
    assert len(content_chunks) >= 2, "the answer arrived in one piece: not streamed"
    finals = [c for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finals) == 1 and finals[0].choices[0].finish_reason == want.finish_reason
    assert finals[0].model_extra["edgeflash"]["generated_tokens"] == len(want.tokens)
    assert chunks[-1].choices == [] and chunks[-1].usage.completion_tokens == len(want.tokens)


def test_completion_matches_generate(client, served, expected):
    prompt = COMPLETION_PROMPTS[0]
    want = expected("completion", prompt, COMPLETION_MAX)
    got = client.completions.create(model=served.model_id, prompt=prompt, max_tokens=COMPLETION_MAX, temperature=0)
    assert got.object == "text_completion"
    assert got.choices[0].text == want.text
    assert got.choices[0].finish_reason == want.finish_reason == "length"
    assert got.usage.completion_tokens == COMPLETION_MAX


def test_completion_stream_matches_generate(client, served, expected):
    prompt = COMPLETION_PROMPTS[0]
    want = expected("completion", prompt, COMPLETION_MAX)
    chunks = list(client.completions.create(model=served.model_id, prompt=prompt, max_tokens=COMPLETION_MAX,
                                            temperature=0, stream=True))
    assert "".join(c.choices[0].text for c in chunks) == want.text
    assert chunks[-1].choices[0].finish_reason == "length"


def test_stop_string_matches_generate(client, served, expected):
    prompt = COMPLETION_PROMPTS[0]
    want = expected("completion", prompt, COMPLETION_MAX, ".")
    got = client.completions.create(model=served.model_id, prompt=prompt, max_tokens=COMPLETION_MAX,
                                    temperature=0, stop=".")
    assert "." not in got.choices[0].text
    assert got.choices[0].text == want.text
    assert got.choices[0].finish_reason == want.finish_reason == "stop"


def test_concurrent_clients_get_their_own_whole_answers(served, expected):
    """Four clients at once (two streaming); each answer equals the sequential one."""
    jobs = [(p, stream) for p, stream in zip(COMPLETION_PROMPTS + ["chat"], (False, True, False, True))]
    answers: dict[int, str] = {}
    waits: dict[int, float] = {}
    errors: list[BaseException] = []
    start = threading.Barrier(len(jobs))

    def ask(i: int, prompt: str, stream: bool) -> None:
        try:
            c = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0, timeout=300)
            start.wait()
            if prompt == "chat":
                r = c.chat.completions.create(model=served.model_id, messages=QUESTION, max_tokens=CHAT_MAX,
                                              temperature=0, stream=stream)
                chunks = list(r)
                answers[i] = "".join(ch.choices[0].delta.content or "" for ch in chunks if ch.choices)
                waits[i] = next(ch for ch in chunks if ch.choices and ch.choices[0].finish_reason
                                ).model_extra["edgeflash"]["queue_wait_s"]
            else:
                r = c.completions.create(model=served.model_id, prompt=prompt, max_tokens=COMPLETION_MAX,
                                         temperature=0, stream=stream)
                if stream:
                    chunks = list(r)
                    answers[i] = "".join(ch.choices[0].text for ch in chunks)
                    waits[i] = chunks[-1].model_extra["edgeflash"]["queue_wait_s"]
                else:
                    answers[i] = r.choices[0].text
                    waits[i] = r.model_extra["edgeflash"]["queue_wait_s"]
        except BaseException as e:  # reported below, with the others' answers
            errors.append(e)

    threads = [threading.Thread(target=ask, args=(i, p, s)) for i, (p, s) in enumerate(jobs)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(600)
    assert not errors, errors
    for i, (prompt, _) in enumerate(jobs):
        want = expected("chat", "", CHAT_MAX) if prompt == "chat" else expected("completion", prompt, COMPLETION_MAX)
        assert answers[i] == want.text, (prompt, answers[i], want.text)
    assert max(waits.values()) > 0.05, f"no request waited for another: they did not overlap ({waits})"


def test_models_list_and_retrieve(client, served):
    ids = [m.id for m in client.models.list().data]
    assert ids == [served.model_id]
    assert client.models.retrieve(served.model_id).id == served.model_id
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("no-such-model")


def test_any_model_name_is_served(client, served, expected):
    """One model is loaded, so a client written for another server's model name works unchanged."""
    want = expected("chat", "", CHAT_MAX)
    got = client.chat.completions.create(model="gpt-4o-mini", messages=QUESTION, max_tokens=CHAT_MAX, temperature=0)
    assert got.choices[0].message.content == want.text
    assert got.model == served.model_id  # the response names the model that answered
