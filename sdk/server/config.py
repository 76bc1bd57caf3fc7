"""What an `edgeflash serve` instance allows: address, limits, and defaults for omitted fields."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from edgeflash.base.errors import UserError


@dataclass
class ServerConfig:
    host: str = "127.0.0.1"  # loopback: reachable from this machine only
    port: int = 8000  # 0 = any free port (the bound one is Server.port)
    model_id: str | None = None  # the name clients send as "model"; default: the model's own name
    aliases: tuple[str, ...] = ()  # other names accepted for the same model (e.g. what -m said)
    max_queue: int = 8  # requests allowed to wait while one generates; more get HTTP 503
    max_tokens: int = 512  # the largest max_tokens a request may ask for (and the default)
    max_prompt_tokens: int = 2048  # longer prompts get HTTP 400 (also capped by the context)
    max_body_bytes: int = 1 << 20  # larger request bodies get HTTP 413 unread
    api_key: str | None = None  # when set, /v1/* requires "Authorization: Bearer <key>"
    shutdown_grace_s: float = 10.0  # how long a running generation may finish on shutdown
    sampling_defaults: dict[str, Any] = field(default_factory=dict)  # over SAMPLING_DEFAULTS, for omitted fields
    access_log: bool = True  # one line per request on stderr
    cors_origins: tuple[str, ...] = ()  # browser origins allowed to call the API ("*": any); none = no CORS

    def __post_init__(self) -> None:
        checks = [
            (0 <= self.port <= 65535, "port", self.port, "an integer in 0..65535"),
            (self.max_queue >= 0, "max_queue", self.max_queue, "an integer >= 0"),
            (self.max_tokens >= 1, "max_tokens", self.max_tokens, "an integer >= 1"),
            (self.max_prompt_tokens >= 1, "max_prompt_tokens", self.max_prompt_tokens, "an integer >= 1"),
            (self.max_body_bytes >= 1024, "max_body_bytes", self.max_body_bytes, "an integer >= 1024"),
            (self.shutdown_grace_s >= 0, "shutdown_grace_s", self.shutdown_grace_s, "a number >= 0"),
        ]
        for ok, name, value, expected in checks:
            if not ok:
                raise UserError(f"{name} = {value!r}: expected {expected}")
        if self.api_key is not None and not self.api_key.strip():
            raise UserError("api_key is empty: expected a non-empty string or no key")
