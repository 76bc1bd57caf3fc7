"""HTTP/1.1 request handling: routing, body limits, JSON errors, server-sent-event streams.

Streams use chunked transfer encoding so connections stay alive between requests. While a
request waits for its turn or for the next token, the handler watches its socket: a client that
hangs up has its job cancelled, so the worker moves on.
"""

from __future__ import annotations

import hmac
import json
import queue
import select
import socket
import sys
import time
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import unquote

from edgeflash.base import __version__
from edgeflash.server.errors import ApiError, invalid, server_error
from edgeflash.server.metrics import CONTENT_TYPE as METRICS_CONTENT_TYPE
from edgeflash.server.responses import LogprobWriter, ResponseIds, full_response, usage_chunk
from edgeflash.server.stream_state import ChoiceStream
from edgeflash.server.validate import parse_chat, parse_completion
from edgeflash.server.worker import CHOICE, DONE, ERROR, PIECE, Job, shutting_down

if TYPE_CHECKING:
    from edgeflash.server.server import Server

STATIC_DIR = Path(__file__).parent / "static"
CONTENT_TYPES = {".html": "text/html; charset=utf-8", ".js": "text/javascript; charset=utf-8",
                 ".css": "text/css; charset=utf-8", ".svg": "image/svg+xml", ".png": "image/png",
                 ".ico": "image/x-icon"}
POST_PATHS = ("/v1/chat/completions", "/v1/completions")
GET_PATHS = ("/health", "/metrics", "/v1/models", "/", "/index.html")
CORS_METHODS = "GET, POST, OPTIONS"
POLL_S = 0.25  # how often a waiting handler checks whether its client is still there


def _metrics_path(path: str) -> str:
    """The path label of /metrics: the endpoints by name, everything else as "other" (a scanner
    trying random paths must not grow the label set)."""
    if path.startswith("/v1/models"):
        return "/v1/models"
    if path.startswith("/static/"):
        return "/static"
    return path if path in POST_PATHS or path in GET_PATHS else "other"


class ClientGone(Exception):
    """The client closed its connection before the response was complete."""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    server_version = f"edgeflash/{__version__}"
    timeout = 300  # seconds a kept-alive connection may sit idle, or a read or write may stall

    @property
    def app(self) -> Server:
        return self.server.app  # type: ignore[attr-defined]

    # --- routing -------------------------------------------------------------------------------

    def do_GET(self) -> None:
        self._handle(self._route_get)

    def do_HEAD(self) -> None:
        self._handle(self._route_get)

    def do_POST(self) -> None:
        self._handle(self._route_post)

    def do_PUT(self) -> None:
        self._handle(self._method_not_allowed)

    def do_DELETE(self) -> None:
        self._handle(self._method_not_allowed)

    def do_PATCH(self) -> None:
        self._handle(self._method_not_allowed)

    def do_OPTIONS(self) -> None:
        self._handle(self._preflight if self._cors_origin() else self._method_not_allowed)

    def handle_one_request(self) -> None:
        # A kept-alive client may hang up (or reset) while the server waits for its next request
        # line: the base class would let that escape to socketserver, which prints a traceback.
        try:
            super().handle_one_request()
        except ConnectionError:
            self.close_connection = True

    def finish(self) -> None:
        try:
            super().finish()  # flushes the last response, which a client that left cannot take
        except ConnectionError:
            pass

    def send_response(self, code: int, message: str | None = None) -> None:
        # Counted as the status line goes out, so a client that reads /metrics next sees it.
        path = getattr(self, "_metrics_path", None)
        if path is not None:
            self.app.metrics.request_done(path, code)
        super().send_response(code, message)

    def end_headers(self) -> None:
        origin = self._cors_origin()
        if origin:
            self.send_header("Access-Control-Allow-Origin", origin)
            self.send_header("Vary", "Origin")
        super().end_headers()

    def _cors_origin(self) -> str | None:
        """The Access-Control-Allow-Origin value for this request: CORS is off unless --cors-origin
        was given, and then answers only the origins it lists ("*": any)."""
        allowed = self.app.config.cors_origins
        origin = self.headers.get("Origin") if self.headers else None
        if not allowed or not origin:
            return None
        if "*" in allowed:
            return "*"
        return origin if origin in allowed else None

    def _preflight(self, path: str) -> None:
        self._discard_body()
        self.send_response(204)
        self.send_header("Access-Control-Allow-Methods", CORS_METHODS)
        self.send_header("Access-Control-Allow-Headers",
                         self.headers.get("Access-Control-Request-Headers") or "Authorization, Content-Type")
        self.send_header("Access-Control-Max-Age", "600")
        self.send_header("Content-Length", "0")
        self.end_headers()

    def _handle(self, route: Any) -> None:
        self.app.request_started()
        path = unquote(self.path.split("?", 1)[0])
        self._metrics_path = _metrics_path(path)
        try:
            route(path)
        except ApiError as e:
            self._send_error(e)
        except ClientGone:
            self.close_connection = True
        except (TimeoutError, ConnectionError):  # the client left or stalled: nothing to answer
            self.close_connection = True
        except Exception as e:  # a bug must cost one request, not the server
            self.log_error("unexpected error: %r", e)
            self._send_error(server_error(f"{type(e).__name__}: {e}"))
        finally:
            if self.app.draining:
                self.close_connection = True  # so handler threads end with the server
            self._metrics_path = None
            self.app.request_finished()

    def _route_get(self, path: str) -> None:
        if path == "/health":
            status = self.app.health()
            return self._send_json(200 if status["status"] == "ok" else 503, status)
        if path == "/metrics":
            return self._send_text(200, self.app.metrics_text(), METRICS_CONTENT_TYPE)
        if path in ("/v1/models", "/v1/models/"):
            self._check_api_key()
            return self._send_json(200, {"object": "list", "data": [self.app.model_card()]})
        if path.startswith("/v1/models/"):
            self._check_api_key()
            name = path[len("/v1/models/"):]
            if name not in self.app.model_names():
                raise ApiError(404, f"The model '{name}' does not exist; this server serves '{self.app.model_id}'",
                               param="model", code="model_not_found")
            return self._send_json(200, self.app.model_card())
        if path in ("/", "/index.html"):
            return self._send_static("index.html")
        if path.startswith("/static/"):
            return self._send_static(path[len("/static/"):])
        if path in POST_PATHS:
            raise self._wrong_method(self.command, path)
        raise self._not_found(path)

    def _route_post(self, path: str) -> None:
        body = self._read_json()  # always read, so the connection stays usable after an error
        if path == "/v1/chat/completions":
            self._check_api_key()
            return self._generate(parse_chat, body)
        if path == "/v1/completions":
            self._check_api_key()
            return self._generate(parse_completion, body)
        if path in GET_PATHS:
            raise self._wrong_method("POST", path)
        raise self._not_found(path)

    def _method_not_allowed(self, path: str) -> None:
        self._discard_body()
        raise self._wrong_method(self.command, path)

    def _not_found(self, path: str) -> ApiError:
        return ApiError(404, f"no such endpoint: {self.command} {path} (see /v1/models, /v1/chat/completions, "
                        "/v1/completions, /health)", code="not_found")

    def _wrong_method(self, method: str, path: str) -> ApiError:
        allowed = "POST" if path in POST_PATHS else "GET"
        return ApiError(405, f"{method} is not allowed on {path}; use {allowed}", code="method_not_allowed",
                        headers={"Allow": allowed})

    # --- requests ------------------------------------------------------------------------------

    def _read_json(self) -> dict[str, Any]:
        if self.headers.get("Transfer-Encoding", "").lower() == "chunked":
            self.close_connection = True
            raise ApiError(411, "chunked request bodies are not supported: send a Content-Length",
                           code="length_required")
        length_text = self.headers.get("Content-Length")
        if length_text is None:
            raise ApiError(411, "the request has no Content-Length header", code="length_required")
        try:
            length = int(length_text)
            if length < 0:
                raise ValueError
        except ValueError:
            self.close_connection = True
            raise invalid(f"Content-Length = {length_text!r}: expected an integer >= 0", None) from None
        limit = self.app.config.max_body_bytes
        if length > limit:
            self.close_connection = True  # the body stays unread, so this connection cannot be reused
            raise ApiError(413, f"the request body is {length} bytes; this server accepts at most {limit} "
                           "(its --max-body-bytes)", code="request_too_large")
        raw = self.rfile.read(length)
        if len(raw) < length:
            raise ClientGone()
        try:
            body = json.loads(raw)
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise invalid(f"the request body is not valid JSON: {e}", None, "invalid_json") from None
        if not isinstance(body, dict):
            raise invalid(f"the request body is a JSON {type(body).__name__}: expected a JSON object", None,
                          "invalid_json")
        return body

    def _discard_body(self) -> None:
        try:
            length = int(self.headers.get("Content-Length", "0"))
        except ValueError:
            length = -1
        if 0 <= length <= self.app.config.max_body_bytes:
            self.rfile.read(length)
        else:
            self.close_connection = True

    def _check_api_key(self) -> None:
        key = self.app.config.api_key
        if key is None:
            return
        given = self.headers.get("Authorization", "")
        if not hmac.compare_digest(given.encode(), f"Bearer {key}".encode()):
            raise ApiError(401, "missing or wrong API key: send 'Authorization: Bearer <key>' "
                           "(the key given to --api-key)", code="invalid_api_key")

    # --- generation ----------------------------------------------------------------------------

    def _generate(self, parse: Any, body: dict[str, Any]) -> None:
        if self.app.draining:
            raise shutting_down()
        req = parse(body, self.app.model, self.app.config, self.app.model_id)
        job = self.app.worker.submit(req)
        ids = ResponseIds(req.kind, req.model_id, self.app.fingerprint)
        try:
            if req.stream:
                self._stream(job, ids)
            else:
                self._respond_once(job, ids)
        except BaseException:
            job.cancel()  # the worker drops it at the next piece (or before it starts)
            raise

    def _logprob_writer(self, job: Job) -> LogprobWriter | None:
        return LogprobWriter(self.app.model.tokenizer) if job.request.output.logprobs is not None else None

    def _respond_once(self, job: Job, ids: ResponseIds) -> None:
        results = []
        while True:
            kind, payload = self._next_event(job)
            if kind == PIECE:
                continue  # the result holds the whole text
            if kind == CHOICE:
                results.append(payload[1])
                continue
            if kind == DONE:
                return self._send_json(200, full_response(ids, results, payload, self._logprob_writer(job)))
            raise payload if kind == ERROR else shutting_down()

    def _stream(self, job: Job, ids: ResponseIds) -> None:
        req = job.request
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream; charset=utf-8")
        self.send_header("Cache-Control", "no-cache")
        self.send_header("Transfer-Encoding", "chunked")
        self.send_header("X-Accel-Buffering", "no")  # proxies must not hold events back
        self.end_headers()
        streams: dict[int, ChoiceStream] = {}
        results = []
        writer = self._logprob_writer(job)
        held = None  # the last choice's finish chunk: the run's statistics go on it
        if req.kind == "chat":
            streams[0] = ChoiceStream(ids, req, 0, writer, self.app.model)
            self._send_event(streams[0].first_chunk())
        while True:
            kind, payload = self._next_event(job)
            if held is not None and kind in (PIECE, CHOICE):
                self._send_event(held)
                held = None
            if kind in (PIECE, CHOICE):
                index = payload[0]
                if index not in streams:
                    streams[index] = ChoiceStream(ids, req, index, writer, self.app.model)
                    if req.kind == "chat":
                        self._send_event(streams[index].first_chunk())
                if kind == PIECE:
                    events = streams[index].piece(payload[1], payload[2])
                else:
                    results.append(payload[1])
                    *events, held = streams[index].finish(payload[1])
                for event in events:
                    self._send_event(event)
                continue
            if kind == DONE:
                if held is not None:
                    held["edgeflash"] = payload
                    self._send_event(held)
                if req.include_usage:
                    self._send_event(usage_chunk(ids, results))
            else:
                error = payload if kind == ERROR else shutting_down()
                self._send_event(error.body())
            self._send_event("[DONE]")
            self._write_chunk(b"")  # the zero-length chunk ends the response
            return

    def _next_event(self, job: Job) -> tuple[str, Any]:
        while True:
            try:
                return job.events.get(timeout=POLL_S)
            except queue.Empty:
                if self._client_gone():
                    raise ClientGone() from None

    def _client_gone(self) -> bool:
        """A readable socket with nothing to read is one the client closed."""
        try:
            readable, _, _ = select.select([self.connection], [], [], 0)
            if not readable:
                return False
            return self.connection.recv(1, socket.MSG_PEEK) == b""
        except (OSError, ValueError):
            return True

    # --- responses -----------------------------------------------------------------------------

    def _send_event(self, data: dict[str, Any] | str) -> None:
        text = data if isinstance(data, str) else json.dumps(data, ensure_ascii=False)
        self._write_chunk(f"data: {text}\n\n".encode())

    def _write_chunk(self, payload: bytes) -> None:
        try:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(payload), payload))
            self.wfile.flush()
        except (TimeoutError, BrokenPipeError, ConnectionResetError, OSError):
            raise ClientGone() from None

    def _send_json(self, status: int, body: dict[str, Any], headers: dict[str, str] | None = None) -> None:
        data = json.dumps(body, ensure_ascii=False).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        for name, value in (headers or {}).items():
            self.send_header(name, value)
        if self.close_connection:
            self.send_header("Connection", "close")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_text(self, status: int, text: str, content_type: str) -> None:
        data = text.encode()
        self.send_response(status)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def _send_error(self, e: ApiError) -> None:
        try:
            self._send_json(e.status, e.body(), e.headers)
        except OSError:
            self.close_connection = True

    def _send_static(self, name: str) -> None:
        files = {p.name: p for p in STATIC_DIR.iterdir() if p.is_file()} if STATIC_DIR.is_dir() else {}
        if name not in files:  # only files that exist in the folder: no path traversal
            raise self._not_found(f"/static/{name}")
        data = files[name].read_bytes()
        self.send_response(200)
        self.send_header("Content-Type", CONTENT_TYPES.get(files[name].suffix, "application/octet-stream"))
        self.send_header("Content-Length", str(len(data)))
        self.send_header("Cache-Control", "no-cache")
        self.send_header("X-Content-Type-Options", "nosniff")
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(data)

    def log_message(self, format: str, *args: Any) -> None:
        if self.app.config.access_log:
            sys.stderr.write(f"{time.strftime('%H:%M:%S')} {self.address_string()} {format % args}\n")
