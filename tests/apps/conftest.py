"""A running `edgeflash serve` (in process, loopback, free port) on SmolLM2 for the app tests."""

from __future__ import annotations

import pytest


@pytest.fixture(scope="module")
def web_server():
    import edgeflash as ef
    from edgeflash.server import Server, ServerConfig

    model = ef.load("default")  # what `edgeflash serve` shows a new user
    server = Server(model, ServerConfig(port=0, max_tokens=64, access_log=False,
                                        sampling_defaults={"temperature": 0.0, "repetition_penalty": 1.0}))
    server.start()
    yield server
    server.shutdown()
    model.close()
