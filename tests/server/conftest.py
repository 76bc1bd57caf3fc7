"""A real server on a real model (SmolLM2-135M, the fastest), and a second copy of the model that
computes the answers the server must match."""

from __future__ import annotations

import pytest
from server_helpers import TEST_LIMITS


@pytest.fixture(scope="session")
def oracle():
    """The oracle: `Model.generate` greedy output that every server answer is compared with."""
    import edgeflash as ef

    model = ef.load("smollm2-135m")
    yield model
    model.close()


@pytest.fixture(scope="module")
def served():
    """A running server (loopback, free port) on its own copy of SmolLM2; shut down after the module."""
    import edgeflash as ef
    from edgeflash.server import Server, ServerConfig

    model = ef.load("smollm2-135m")
    server = Server(model, ServerConfig(port=0, aliases=("smollm2-135m",), access_log=False, **TEST_LIMITS))
    server.start()
    yield server
    server.shutdown()
    model.close()


# The smallest model whose chat template renders tools (Qwen2.5's Hermes format).
TOOL_MODEL = "qwen2.5-coder-0.5b"


@pytest.fixture(scope="module")
def tool_served():
    """A running server on Qwen2.5-Coder-0.5B-Instruct, for tool calling."""
    import edgeflash as ef
    from edgeflash.base.models import ALIASES
    from edgeflash.server import Server, ServerConfig

    if TOOL_MODEL not in ALIASES:
        pytest.skip(f"tool calling needs the model alias {TOOL_MODEL!r}, which edgeflash.base.models does not have")
    model = ef.load(TOOL_MODEL)
    server = Server(model, ServerConfig(port=0, access_log=False, **{**TEST_LIMITS, "max_prompt_tokens": 1024}))
    server.start()
    yield server
    server.shutdown()
    model.close()
