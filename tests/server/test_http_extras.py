"""CORS only behind --cors-origin (and then only for the origins it lists), and /metrics in
Prometheus' text format counting what the server did."""

from __future__ import annotations

import re

import pytest
from server_helpers import TEST_LIMITS, assert_error, request

CHAT = "/v1/chat/completions"
HELLO = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2, "temperature": 0}
SAMPLE = re.compile(r'^([a-z_]+)\{([^}]*)\} (-?[0-9.e+]+)$')


@pytest.fixture(scope="module")
def cors_served(served):
    """A second server on the same model, allowing one origin."""
    from edgeflash.server import Server, ServerConfig

    server = Server(served.model, ServerConfig(port=0, access_log=False, cors_origins=("http://app.example",),
                                               **TEST_LIMITS))
    server.start()
    yield server
    server.shutdown()


def test_no_cors_by_default(served):
    status, headers, _ = request(served.url, "POST", CHAT, HELLO, headers={"Origin": "http://app.example"})
    assert status == 200 and "access-control-allow-origin" not in headers
    status, _, body = request(served.url, "OPTIONS", CHAT, headers={"Origin": "http://app.example",
                                                                    "Access-Control-Request-Method": "POST"})
    assert_error(status, body, 405, None, "method_not_allowed")


def test_cors_for_the_listed_origin_only(cors_served):
    preflight = {"Origin": "http://app.example", "Access-Control-Request-Method": "POST",
                 "Access-Control-Request-Headers": "authorization, content-type"}
    status, headers, _ = request(cors_served.url, "OPTIONS", CHAT, headers=preflight)
    assert status == 204
    assert headers["access-control-allow-origin"] == "http://app.example"
    assert "POST" in headers["access-control-allow-methods"]
    assert headers["access-control-allow-headers"] == "authorization, content-type"
    status, headers, body = request(cors_served.url, "POST", CHAT, HELLO, headers={"Origin": "http://app.example"})
    assert status == 200 and headers["access-control-allow-origin"] == "http://app.example"
    status, headers, body = request(cors_served.url, "POST", CHAT, {**HELLO, "n": 99},
                                    headers={"Origin": "http://app.example"})
    assert_error(status, body, 400, "n")
    assert headers["access-control-allow-origin"] == "http://app.example"  # the page can read the error too
    status, headers, _ = request(cors_served.url, "POST", CHAT, HELLO, headers={"Origin": "http://evil.example"})
    assert status == 200 and "access-control-allow-origin" not in headers


def metrics(url: str) -> dict[str, float]:
    status, headers, text = request(url, "GET", "/metrics")
    assert status == 200 and headers["content-type"].startswith("text/plain; version=0.0.4")
    values: dict[str, float] = {}
    for line in text.splitlines():
        if line.startswith("#"):
            assert re.match(r"^# (HELP|TYPE) [a-z_]+ ", line), line
            continue
        match = SAMPLE.match(line)
        assert match, f"not a Prometheus sample line: {line!r}"
        name, labels, value = match.groups()
        values[name + "{" + labels + "}"] = float(value)
    return values


def test_metrics_count_requests_and_tokens(served):
    before = metrics(served.url)
    label = f'model="{served.model_id}"'
    ok = f'edgeflash_http_requests_total{{{label},path="/v1/chat/completions",status="200"}}'
    bad = f'edgeflash_http_requests_total{{{label},path="/v1/chat/completions",status="400"}}'
    status, _, body = request(served.url, "POST", CHAT, HELLO)
    assert status == 200
    request(served.url, "POST", CHAT, {**HELLO, "max_tokens": -1})
    after = metrics(served.url)
    assert after[ok] == before.get(ok, 0) + 1 and after[bad] == before.get(bad, 0) + 1
    tokens = f"edgeflash_generated_tokens_total{{{label}}}"
    assert after[tokens] - before[tokens] == body["usage"]["completion_tokens"]
    assert after[f"edgeflash_rss_bytes{{{label}}}"] > 50 * 2**20
    assert after[f"edgeflash_requests_waiting{{{label}}}"] == 0
