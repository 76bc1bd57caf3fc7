"""A full request queue answers 503 with an OpenAI-style body and Retry-After; waiting requests
still finish correctly; shutdown fails the waiting ones with 503 instead of hanging them."""

from __future__ import annotations

import json
import socket
import threading
import time

import pytest
from server_helpers import LONG_PROMPT, PLAIN_GREEDY, SERVER_GREEDY, assert_error, request


@pytest.fixture(scope="module")
def small_queue_server():
    """One request may wait behind the running one (--max-queue 1)."""
    import edgeflash as ef
    from edgeflash.server import Server, ServerConfig

    model = ef.load("smollm2-135m")
    server = Server(model, ServerConfig(port=0, max_queue=1, max_tokens=1024, access_log=False,
                                        shutdown_grace_s=0.0))
    server.start()
    yield server
    server.shutdown()
    model.close()


def open_stream(port: int, prompt: str, max_tokens: int) -> socket.socket:
    """Start a streaming completion on a raw socket and return once its first text piece arrived."""
    body = json.dumps({"prompt": prompt, "max_tokens": max_tokens, "stream": True, **PLAIN_GREEDY}).encode()
    sock = socket.create_connection(("127.0.0.1", port), timeout=300)
    sock.sendall(b"POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: %d\r\n\r\n%s" % (len(body), body))
    received = b""
    while b'"text"' not in received:
        data = sock.recv(4096)
        assert data, "the stream ended before any text"
        received += data
    return sock


def wait_for(url: str, predicate, timeout: float = 120) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        _, _, health = request(url, "GET", "/health")
        if predicate(health):
            return health
        time.sleep(0.05)
    raise AssertionError(f"health never matched: {health}")


def test_full_queue_gets_503_and_waiting_request_completes(small_queue_server, oracle):
    server = small_queue_server
    running = open_stream(server.port, LONG_PROMPT, 1000)  # occupies the worker
    waiting_result: dict = {}

    def wait_in_queue() -> None:
        waiting_result["response"] = request(server.url, "POST", "/v1/completions",
                                             {"prompt": "The capital of France is", "max_tokens": 5,
                                              "temperature": 0})

    waiter = threading.Thread(target=wait_in_queue)
    waiter.start()
    wait_for(server.url, lambda h: h["queue_depth"] == 1 and h["busy"])
    status, headers, body = request(server.url, "POST", "/v1/chat/completions",
                                    {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2})
    error = assert_error(status, body, 503, None, "queue_full")
    assert "--max-queue" in error["message"] and headers["retry-after"] == "1"
    running.close()  # the running stream's client leaves; the waiting request gets the worker
    waiter.join(300)
    status, _, body = waiting_result["response"]
    assert status == 200
    assert body["choices"][0]["text"] == oracle.generate("The capital of France is", 5, **SERVER_GREEDY).text
    health = wait_for(server.url, lambda h: not h["busy"])
    assert health["status"] == "ok" and health["queue_depth"] == 0


def test_shutdown_fails_waiting_requests_with_503(small_queue_server):
    server = small_queue_server
    running = open_stream(server.port, LONG_PROMPT, 1000)
    waiting_result: dict = {}
    waiter = threading.Thread(target=lambda: waiting_result.update(
        response=request(server.url, "POST", "/v1/completions", {"prompt": "Hello", "max_tokens": 5})))
    waiter.start()
    wait_for(server.url, lambda h: h["queue_depth"] == 1)
    t0 = time.monotonic()
    server.shutdown()  # grace 0: the running generation is cancelled, the waiting one refused
    assert time.monotonic() - t0 < 60
    waiter.join(60)
    status, _, body = waiting_result["response"]
    assert_error(status, body, 503, None, "shutting_down")
    rest = b""
    while not rest.endswith(b"\r\n0\r\n\r\n"):  # the zero-length chunk that ends the response
        data = running.recv(65536)
        assert data, f"the connection closed before the stream ended: {rest[-200:]!r}"
        rest += data
    assert running.recv(1) == b"", "the connection stays open after shutdown"
    running.close()
    assert b'"code": "shutting_down"' in rest and b"data: [DONE]" in rest
    with pytest.raises(OSError):
        request(server.url, "GET", "/health", timeout=5)
