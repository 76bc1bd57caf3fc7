"""A local HTTP server with the OpenAI API shape, and the web chat page it serves.

    from edgeflash.server import Server, ServerConfig
    server = Server(ef.load("smollm2-135m"), ServerConfig(port=8000))
    server.start()          # listens on 127.0.0.1 unless told otherwise
    ...
    server.shutdown()

Standard library only (`http.server`): the server runs on an edge board without torch.
"""

from __future__ import annotations

from edgeflash.server.config import ServerConfig
from edgeflash.server.server import Server

__all__ = ["Server", "ServerConfig"]
