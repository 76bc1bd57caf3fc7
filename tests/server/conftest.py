"""A real server on a real model (SmolLM2-135M, the fastest), and a second copy of the model that
computes the answers the server must match."""

from __future__ import annotations

import pytest

TEST_LIMITS = {"max_tokens": 48, "max_prompt_tokens": 160, "max_body_bytes": 64 * 1024, "max_queue": 8}


@pytest.fixture(scope="session")
def reference_model():
    """The oracle: `Model.generate` greedy output that every server answer is compared with."""
    import edgeflash as ef

    model = ef.load("smollm2-135m", engine="reference")
    yield model
    model.close()


@pytest.fixture(scope="module")
def served():
    """A running server (loopback, free port) on its own copy of SmolLM2; shut down after the module."""
    import edgeflash as ef
    from edgeflash.server import Server, ServerConfig

    model = ef.load("smollm2-135m", engine="reference")
    server = Server(model, ServerConfig(port=0, aliases=("smollm2-135m",), access_log=False, **TEST_LIMITS))
    server.start()
    yield server
    server.shutdown()
    model.close()
