"""Every kind of bad request gets the right HTTP status and an OpenAI-style error body, and the
server keeps serving: on the same kept-alive connection, and for the next good request."""

from __future__ import annotations

import http.client
import json
import socket
import struct
import sys
import threading
import time

import openai
import pytest
from server_helpers import LONG_PROMPT, PLAIN_GREEDY, SERVER_GREEDY, TEST_LIMITS, assert_error, request

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
HELLO = [{"role": "user", "content": "Hi"}]


def chat_body(**fields):
    return {"model": "smollm2-135m", "messages": HELLO, "max_tokens": 4, **fields}


BAD_REQUESTS = [
    # (id, path, body, status, param, code)
    ("model-not-string", CHAT, chat_body(model=7), 400, "model", "invalid_type"),
    ("negative-max-tokens", CHAT, chat_body(max_tokens=-1), 400, "max_tokens", "invalid_value"),
    ("zero-max-tokens", COMPLETIONS, {"prompt": "Hi", "max_tokens": 0}, 400, "max_tokens", "invalid_value"),
    ("huge-max-tokens", CHAT, chat_body(max_tokens=10**9), 400, "max_tokens", "invalid_value"),
    ("huge-max-completion-tokens", CHAT, chat_body(max_completion_tokens=10**6), 400, "max_completion_tokens",
     "invalid_value"),
    ("max-tokens-string", CHAT, chat_body(max_tokens="ten"), 400, "max_tokens", "invalid_type"),
    ("max-tokens-float", COMPLETIONS, {"prompt": "Hi", "max_tokens": 3.5}, 400, "max_tokens", "invalid_type"),
    ("max-tokens-bool", COMPLETIONS, {"prompt": "Hi", "max_tokens": True}, 400, "max_tokens", "invalid_type"),
    ("missing-messages", CHAT, {"max_tokens": 4}, 400, "messages", "missing_required_parameter"),
    ("messages-not-list", CHAT, chat_body(messages="Hi"), 400, "messages", "invalid_type"),
    ("messages-empty", CHAT, chat_body(messages=[]), 400, "messages", "invalid_type"),
    ("message-not-object", CHAT, chat_body(messages=["Hi"]), 400, "messages[0]", "invalid_type"),
    ("bad-role", CHAT, chat_body(messages=[{"role": "wizard", "content": "Hi"}]), 400, "messages[0].role",
     "invalid_value"),
    ("content-number", CHAT, chat_body(messages=[{"role": "user", "content": 5}]), 400, "messages[0].content",
     "invalid_type"),
    ("image-part", CHAT, chat_body(messages=[{"role": "user", "content": [{"type": "image_url", "image_url": {}}]}]),
     400, "messages[0].content[0]", "invalid_value"),
    ("temperature-string", CHAT, chat_body(temperature="hot"), 400, "temperature", "invalid_type"),
    ("temperature-range", CHAT, chat_body(temperature=5), 400, "temperature", "invalid_value"),
    ("top-p-zero", CHAT, chat_body(top_p=0), 400, "top_p", "invalid_value"),
    ("stream-string", CHAT, chat_body(stream="yes"), 400, "stream", "invalid_type"),
    ("stream-options-without-stream", CHAT, chat_body(stream_options={"include_usage": True}), 400,
     "stream_options", "invalid_value"),
    ("stop-number", CHAT, chat_body(stop=5), 400, "stop", "invalid_type"),
    ("too-many-stops", CHAT, chat_body(stop=list("abcde")), 400, "stop", "invalid_value"),
    ("seed-float", CHAT, chat_body(seed=1.5), 400, "seed", "invalid_type"),
    ("n-too-many", CHAT, chat_body(n=9), 400, "n", "invalid_value"),
    ("n-zero", COMPLETIONS, {"prompt": "Hi", "n": 0}, 400, "n", "invalid_value"),
    ("n-string", CHAT, chat_body(n="2"), 400, "n", "invalid_type"),
    ("best-of", COMPLETIONS, {"prompt": "Hi", "best_of": 3}, 400, "best_of", "unsupported_value"),
    ("presence-penalty-range", CHAT, chat_body(presence_penalty=2.5), 400, "presence_penalty", "invalid_value"),
    ("frequency-penalty-string", CHAT, chat_body(frequency_penalty="x"), 400, "frequency_penalty",
     "invalid_type"),
    ("repeat-last-n-range", CHAT, chat_body(repeat_last_n=-5), 400, "repeat_last_n", "invalid_value"),
    ("logprobs-string", CHAT, chat_body(logprobs="yes"), 400, "logprobs", "invalid_type"),
    ("top-logprobs-range", CHAT, chat_body(logprobs=True, top_logprobs=21), 400, "top_logprobs", "invalid_value"),
    ("top-logprobs-without-logprobs", CHAT, chat_body(top_logprobs=2), 400, "top_logprobs", "invalid_value"),
    ("completion-logprobs-range", COMPLETIONS, {"prompt": "Hi", "logprobs": 6}, 400, "logprobs", "invalid_value"),
    ("completion-logprobs-bool", COMPLETIONS, {"prompt": "Hi", "logprobs": True}, 400, "logprobs",
     "invalid_type"),
    ("response-format-type", CHAT, chat_body(response_format={"type": "xml"}), 400, "response_format.type",
     "invalid_value"),
    ("response-format-string", CHAT, chat_body(response_format="json"), 400, "response_format", "invalid_type"),
    ("json-schema-missing", CHAT, chat_body(response_format={"type": "json_schema"}), 400,
     "response_format.json_schema", "invalid_type"),
    ("json-schema-bad-type", CHAT, chat_body(response_format={"type": "json_schema", "json_schema": {
        "name": "x", "schema": {"type": "objec"}}}), 400, "response_format.json_schema.schema", "invalid_value"),
    ("tools-without-template", CHAT, chat_body(tools=[{"type": "function", "function": {"name": "f"}}]), 400,
     "tools", "unsupported_value"),
    ("tools-not-list", CHAT, chat_body(tools={"name": "f"}), 400, "tools", "invalid_value"),
    ("tool-name-missing", CHAT, chat_body(tools=[{"type": "function", "function": {}}]), 400, "tools",
     "invalid_value"),
    ("tool-choice-without-tools", CHAT, chat_body(tool_choice="required"), 400, "tool_choice", "invalid_value"),
    ("tools-on-completions", COMPLETIONS, {"prompt": "Hi", "tools": []}, 400, "tools", "unsupported_value"),
    ("tool-message-without-id", CHAT, chat_body(messages=[{"role": "tool", "content": "18 C"}]), 400,
     "messages[0].tool_call_id", "invalid_type"),
    ("user-tool-calls", CHAT, chat_body(messages=[{"role": "user", "content": "Hi", "tool_calls": []}]), 400,
     "messages[0].tool_calls", "invalid_value"),
    ("legacy-functions", CHAT, chat_body(functions=[{"name": "f"}]), 400, "functions", "unsupported_value"),
    ("missing-prompt", COMPLETIONS, {"max_tokens": 4}, 400, "prompt", "missing_required_parameter"),
    ("prompt-number", COMPLETIONS, {"prompt": 42}, 400, "prompt", "invalid_type"),
    ("prompt-batch", COMPLETIONS, {"prompt": ["a", "b"]}, 400, "prompt", "unsupported_value"),
    ("prompt-token-out-of-vocab", COMPLETIONS, {"prompt": [1, 2, 10**7]}, 400, "prompt", "invalid_value"),
    ("echo", COMPLETIONS, {"prompt": "Hi", "echo": True}, 400, "echo", "unsupported_value"),
    ("oversized-prompt", COMPLETIONS, {"prompt": "word " * 400, "max_tokens": 2}, 400, "prompt",
     "context_length_exceeded"),
    ("oversized-chat", CHAT, chat_body(messages=[{"role": "user", "content": "word " * 400}]), 400, "messages",
     "context_length_exceeded"),
]


@pytest.mark.parametrize("path, body, status, param, code", [case[1:] for case in BAD_REQUESTS],
                         ids=[case[0] for case in BAD_REQUESTS])
def test_bad_request_gets_error_body(served, path, body, status, param, code):
    got_status, _, got = request(served.url, "POST", path, body)
    assert_error(got_status, got, status, param, code)


@pytest.mark.parametrize("raw, fragment", [(b"{not json", "not valid JSON"), (b"", "not valid JSON"),
                                           (b"\xff\xfe", "not valid JSON"), (b"[1, 2]", "JSON list"),
                                           (b'"text"', "JSON str")])
def test_malformed_json(served, raw, fragment):
    status, _, body = request(served.url, "POST", CHAT, raw=raw)
    error = assert_error(status, body, 400, None, "invalid_json")
    assert fragment in error["message"]


def test_oversized_body_is_refused_unread(served):
    big = json.dumps(chat_body(messages=[{"role": "user", "content": "x" * (TEST_LIMITS["max_body_bytes"] + 1)}]))
    status, headers, body = request(served.url, "POST", CHAT, raw=big.encode())
    assert_error(status, body, 413, None, "request_too_large")
    assert headers.get("connection") == "close"


def test_unknown_path_and_wrong_method(served):
    status, _, body = request(served.url, "GET", "/v1/embeddings")
    assert_error(status, body, 404, None, "not_found")
    status, headers, body = request(served.url, "GET", CHAT)
    assert_error(status, body, 405, None, "method_not_allowed")
    assert headers["allow"] == "POST"
    status, _, body = request(served.url, "DELETE", "/v1/models")
    assert_error(status, body, 405, None, "method_not_allowed")


def test_static_files_cannot_escape_their_folder(served):
    for path in ("/static/../handler.py", "/static/%2e%2e/handler.py", "/static/nope.js"):
        status, _, body = request(served.url, "GET", path)
        assert_error(status, body, 404, None, "not_found")


def test_openai_client_sees_typed_errors(served):
    client = openai.OpenAI(base_url=served.url + "/v1", api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="gpt-4o-mini", messages=HELLO, max_tokens=2, n=20)
    assert e.value.code == "invalid_value" and e.value.param == "n"
    with pytest.raises(openai.BadRequestError) as e:
        client.completions.create(model=served.model_id, prompt="Hi", max_tokens=-5)
    assert e.value.param == "max_tokens"


def test_connection_stays_usable_after_errors(served):
    """Errors on a kept-alive connection leave it in sync: the next request on it works."""
    conn = http.client.HTTPConnection("127.0.0.1", served.port, timeout=300)
    try:
        for body in (b"{broken", json.dumps(chat_body(max_tokens=-1)).encode()):
            conn.request("POST", CHAT, body=body, headers={"Content-Type": "application/json"})
            resp = conn.getresponse()
            assert resp.status == 400
            resp.read()
        conn.request("POST", COMPLETIONS, body=json.dumps({"prompt": "The sky is", "max_tokens": 3, "temperature": 0}),
                     headers={"Content-Type": "application/json"})
        resp = conn.getresponse()
        assert resp.status == 200
        body = json.loads(resp.read())
        assert body["usage"]["completion_tokens"] >= 1 and body["choices"][0]["text"]
    finally:
        conn.close()


def wait_until_idle(url: str, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, _, health = request(url, "GET", "/health")
        if not health["busy"] and health["queue_depth"] == 0:
            return health
        time.sleep(0.1)
    raise AssertionError(f"the worker is still busy after {timeout} s: {health}")


def test_client_disconnect_mid_stream_frees_the_worker(served, oracle):
    """A client that hangs up after the first streamed piece: its generation is dropped, not finished."""
    before = wait_until_idle(served.url)["completed_requests"]
    body = json.dumps({"prompt": LONG_PROMPT, "max_tokens": TEST_LIMITS["max_tokens"], "stream": True,
                       **PLAIN_GREEDY}).encode()
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=300)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
    received = b""
    while b'"text"' not in received:  # the first piece of text has been streamed
        data = sock.recv(4096)
        assert data, "the server closed the stream before any text"
        received += data
    sock.close()
    health = wait_until_idle(served.url)
    assert health["completed_requests"] == before, "the abandoned generation ran to the end"
    # The worker is free and its cache consistent: the next answer is the oracle's.
    status, _, got = request(served.url, "POST", COMPLETIONS, {"prompt": "The sky is", "max_tokens": 4,
                                                               "temperature": 0})
    assert status == 200
    assert got["choices"][0]["text"] == oracle.generate("The sky is", 4, **SERVER_GREEDY).text


def connection_threads() -> int:
    return sum(1 for t in threading.enumerate() if "process_request_thread" in t.name)


def test_client_reset_between_requests_is_not_a_server_error(served, monkeypatch):
    """A kept-alive client that resets its connection while the server waits for its next request
    is leaving, not failing: nothing reaches socketserver's error handler (which prints a traceback)."""
    errors = []
    monkeypatch.setattr(served.httpd, "handle_error", lambda request, address: errors.append(sys.exc_info()[1]))
    threads_before = connection_threads()
    sock = socket.create_connection(("127.0.0.1", served.port), timeout=60)
    sock.sendall(b"GET /health HTTP/1.1\r\nHost: x\r\n\r\n")
    response = sock.makefile("rb")  # the whole response, so the server is back to waiting
    assert response.readline().startswith(b"HTTP/1.1 200")
    headers = dict(line.decode().strip().lower().split(": ", 1) for line in iter(response.readline, b"\r\n"))
    json.loads(response.read(int(headers["content-length"])))
    response.close()
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close with a reset
    sock.close()
    deadline = time.monotonic() + 30
    while connection_threads() > threads_before and time.monotonic() < deadline:
        time.sleep(0.02)  # until the connection's thread has seen the reset and ended
    assert connection_threads() <= threads_before, "the reset connection's thread is still running"
    assert errors == []


def test_health_after_all_errors(served):
    status, _, health = request(served.url, "GET", "/health")
    assert status == 200 and health["status"] == "ok" and not health["busy"]
