"""The server's life: bind (loopback by default), serve on threads, drain and stop on a signal."""

from __future__ import annotations

import errno
import signal
import threading
import time
from http.server import ThreadingHTTPServer
from typing import Any

from edgeflash.base import __version__
from edgeflash.base.errors import UserError
from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes
from edgeflash.runtime.sampler import SAMPLING_DEFAULTS
from edgeflash.server.config import ServerConfig
from edgeflash.server.handler import Handler
from edgeflash.server.metrics import Metrics
from edgeflash.server.network import is_loopback, resolve_bind_address
from edgeflash.server.worker import Worker


class _HTTPServer(ThreadingHTTPServer):
    daemon_threads = True  # a kept-alive idle connection must not hold the process open
    allow_reuse_address = True

    def __init__(self, address: tuple[str, int], app: Server, family: int):
        self.address_family = family
        self.app = app
        super().__init__(address, Handler)


class Server:
    """An OpenAI-compatible HTTP server for one loaded model; the socket is bound on creation."""

    def __init__(self, model: Any, config: ServerConfig | None = None):
        self.model = model
        self.config = config or ServerConfig()
        self.model_id = self.config.model_id or model.name
        self.fingerprint = f"edgeflash-{__version__}-{model.engine.name}"
        self.metrics = Metrics()
        self.worker = Worker(model, self.config.max_queue, self.metrics)
        self.created = int(time.time())
        self.draining = False
        self._active = 0
        self._active_lock = threading.Condition()
        self._thread: threading.Thread | None = None
        self._started = time.monotonic()
        family, address = resolve_bind_address(self.config.host, self.config.port)
        try:
            self.httpd = _HTTPServer((address, self.config.port), self, family)
        except OSError as e:
            what = {errno.EADDRINUSE: "is already in use", errno.EACCES: "needs privileges (use a port >= 1024)",
                    errno.EADDRNOTAVAIL: "is not an address of this machine"}.get(e.errno, f"cannot be bound ({e})")
            raise UserError(f"--host {self.config.host} --port {self.config.port}: the address {what}") from None

    # --- where it listens ----------------------------------------------------------------------

    @property
    def address(self) -> str:
        return self.httpd.server_address[0]

    @property
    def port(self) -> int:
        return self.httpd.server_address[1]

    @property
    def url(self) -> str:
        host = f"[{self.address}]" if ":" in self.address else self.address
        return f"http://{host}:{self.port}"

    @property
    def loopback_only(self) -> bool:
        return is_loopback(self.address)

    # --- what it reports -----------------------------------------------------------------------

    def model_names(self) -> tuple[str, ...]:
        return (self.model_id, *self.config.aliases)

    def model_card(self) -> dict[str, Any]:
        return {"id": self.model_id, "object": "model", "created": self.created, "owned_by": "edgeflash",
                "edgeflash": {"engine": self.model.engine.name, "context_length": self.model.engine.context_length,
                              "architecture": self.model.spec.family, "max_tokens": self.config.max_tokens,
                              "max_prompt_tokens": self.config.max_prompt_tokens,
                              "sampling_defaults": self.sampling_defaults(),
                              "chat_template": self.model.has_chat_template,
                              "tool_calls": self.model.tool_call_format is not None}}

    def sampling_defaults(self) -> dict[str, Any]:
        """What a request that omits a sampling field gets."""
        return {**SAMPLING_DEFAULTS, "seed": None,
                **{k: v for k, v in self.config.sampling_defaults.items() if k != "stop"}}

    def health(self) -> dict[str, Any]:
        return {"status": "shutting_down" if self.draining else "ok", "model": self.model_id,
                "engine": self.model.engine.name, **self.worker.status(),
                "uptime_s": round(time.monotonic() - self._started, 3), "rss_bytes": current_rss_bytes(),
                "peak_rss_bytes": peak_rss_bytes()}

    def metrics_text(self) -> str:
        return self.metrics.render(self.model_id, self.worker.status(), time.monotonic() - self._started)

    # --- life ----------------------------------------------------------------------------------

    def start(self) -> Server:
        """Serve in background threads; returns at once."""
        self.worker.start()
        self._thread = threading.Thread(target=self.httpd.serve_forever, kwargs={"poll_interval": 0.2},
                                        name="edgeflash-http", daemon=True)
        self._thread.start()
        return self

    def shutdown(self) -> None:
        """Stop accepting, fail queued requests with 503, let the running one finish within the grace
        period, then close. Safe to call more than once."""
        if self.draining and self._thread is None:
            return
        self.draining = True
        if self._thread is not None:
            self.httpd.shutdown()  # no new connections from here on
            self._thread.join()
            self._thread = None
        self.worker.stop(self.config.shutdown_grace_s)
        with self._active_lock:  # let handlers write what the worker gave them
            self._active_lock.wait_for(lambda: self._active == 0, timeout=5.0)
        self.httpd.server_close()

    def serve_until_signal(self, on_ready: Any = None) -> None:
        """Serve until SIGINT or SIGTERM, then shut down gracefully; a second signal stops at once."""
        stop = threading.Event()

        def handle(signum: int, frame: Any) -> None:
            if stop.is_set():
                raise KeyboardInterrupt
            stop.set()

        previous = {s: signal.signal(s, handle) for s in (signal.SIGINT, signal.SIGTERM)}
        try:
            self.start()
            if on_ready is not None:
                on_ready(self)
            while not stop.wait(0.5):
                pass
            self.shutdown()
        finally:
            for s, h in previous.items():
                signal.signal(s, h)

    def request_started(self) -> None:
        with self._active_lock:
            self._active += 1

    def request_finished(self) -> None:
        with self._active_lock:
            self._active -= 1
            self._active_lock.notify_all()

    def __enter__(self) -> Server:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.shutdown()
