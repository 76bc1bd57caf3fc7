"""Errors a client can cause, carried to the HTTP response as an OpenAI-style error body."""

from __future__ import annotations

from typing import Any


class ApiError(Exception):
    """One failed request: HTTP status plus `{"error": {"message", "type", "param", "code"}}`."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 param: str | None = None, code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code
        self.headers = headers or {}

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


def invalid(message: str, param: str | None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def server_error(message: str) -> ApiError:
    return ApiError(500, message, type="server_error", code="internal_error")
