"""Raw HTTP helpers for the server tests: one request on a fresh connection, and the error-body check."""

from __future__ import annotations

import http.client
import json
from typing import Any
from urllib.parse import urlparse

from edgeflash.runtime.sampler import SAMPLING_DEFAULTS

# Plain greedy decoding (no penalty) counts on and on from here (no end-of-text for hundreds of
# tokens): a request that keeps the worker busy until its client leaves.
LONG_PROMPT = "1, 2, 3, 4, 5,"
PLAIN_GREEDY = {"temperature": 0, "repetition_penalty": 1.0}
# What a request with "temperature": 0 gets from a server on the default options: greedy over the
# default penalties. The oracle decodes with the same options.
SERVER_GREEDY = {**SAMPLING_DEFAULTS, "temperature": 0.0}
# The limits of the shared test server: small prompt and body limits so the refusals are cheap to reach.
TEST_LIMITS = {"max_tokens": 1024, "max_prompt_tokens": 160, "max_body_bytes": 64 * 1024, "max_queue": 8}


def request(url: str, method: str, path: str, body: Any = None, *, raw: bytes | None = None,
            headers: dict[str, str] | None = None, timeout: float = 300) -> tuple[int, dict[str, str], Any]:
    """(status, headers, parsed JSON or text) for one request on a fresh connection."""
    u = urlparse(url)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=timeout)
    try:
        data = raw if raw is not None else (json.dumps(body).encode() if body is not None else None)
        conn.request(method, path, body=data, headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        text = resp.read().decode()
        try:
            parsed = json.loads(text)
        except json.JSONDecodeError:
            parsed = text
        return resp.status, {k.lower(): v for k, v in resp.getheaders()}, parsed
    finally:
        conn.close()


def assert_error(status: int, body: Any, expected_status: int, param: str | None = None,
                 code: str | None = None) -> dict:
    """An OpenAI-style error body: {"error": {"message", "type", "param", "code"}}."""
    assert status == expected_status, body
    assert isinstance(body, dict) and set(body) == {"error"}, body
    error = body["error"]
    assert set(error) == {"message", "type", "param", "code"}, error
    assert isinstance(error["message"], str) and error["message"], error
    assert isinstance(error["type"], str) and error["type"], error
    if param is not None:
        assert error["param"] == param, error
    if code is not None:
        assert error["code"] == code, error
    return error
