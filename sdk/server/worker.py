"""One thread owns the model; requests wait their turn in a bounded queue.

A handler thread submits a `Job` and reads its events; the worker never waits on a client (events
go into an unbounded per-job queue), so a slow or vanished client cannot stall it. A client that
goes away sets `job.cancelled`; the worker stops that generation at the next piece of text.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections import deque
from dataclasses import dataclass, field
from typing import Any

from edgeflash.base.errors import UserError
from edgeflash.base.rss import current_rss_bytes
from edgeflash.server.errors import ApiError, invalid, server_error
from edgeflash.server.validate import GenerationRequest

log = logging.getLogger("edgeflash.server")

# Events a job emits, in order: for each choice (n of them) any number of PIECE (index, text,
# logprobs of the tokens since the last piece) and one CHOICE (index, result); then exactly one of
# DONE (stats), ERROR, CANCELLED. An ERROR or CANCELLED may come at any point.
PIECE, CHOICE, DONE, ERROR, CANCELLED = "piece", "choice", "done", "error", "cancelled"


@dataclass
class Job:
    request: GenerationRequest
    events: queue.Queue = field(default_factory=queue.Queue)  # (kind, payload)
    cancelled: threading.Event = field(default_factory=threading.Event)
    enqueued_at: float = field(default_factory=time.perf_counter)
    started_at: float | None = None

    def cancel(self) -> None:
        self.cancelled.set()


def shutting_down() -> ApiError:
    return ApiError(503, "the server is shutting down", type="server_error", code="shutting_down")


class Worker:
    def __init__(self, model: Any, max_queue: int, metrics: Any):
        self.model = model
        self.metrics = metrics
        self.max_queue = max_queue
        self.completed = 0
        self._cond = threading.Condition()
        self._waiting: deque[Job] = deque()
        self._running: Job | None = None
        self._accepting = True
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="edgeflash-worker", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def submit(self, request: GenerationRequest) -> Job:
        """Queue a request, or raise 503 when `max_queue` requests already wait behind a running one."""
        job = Job(request)
        with self._cond:
            if not self._accepting:
                raise shutting_down()
            busy = self._running is not None or bool(self._waiting)
            if busy and len(self._waiting) >= self.max_queue:
                raise ApiError(503, f"the server is busy: {len(self._waiting)} requests are already waiting "
                               f"(its --max-queue is {self.max_queue}); retry shortly", type="server_error",
                               code="queue_full", headers={"Retry-After": "1"})
            self._waiting.append(job)
            self._cond.notify_all()
        return job

    def status(self) -> dict[str, Any]:
        with self._cond:
            return {"busy": self._running is not None, "queue_depth": len(self._waiting),
                    "max_queue": self.max_queue, "completed_requests": self.completed}

    def stop(self, grace_s: float) -> None:
        """Refuse new work, fail the waiting jobs with 503, give the running one `grace_s` to finish."""
        with self._cond:
            self._accepting = False
            self._stopping = True
            for job in self._waiting:
                job.events.put((ERROR, shutting_down()))
            self._waiting.clear()
            running = self._running
            self._cond.notify_all()
        if not self._thread.is_alive():
            return
        self._thread.join(grace_s)
        if self._thread.is_alive() and running is not None:
            running.cancel()
            self._thread.join(30.0)

    def _run(self) -> None:
        while True:
            with self._cond:
                self._running = None
                self._cond.notify_all()
                while not self._waiting and not self._stopping:
                    self._cond.wait()
                if not self._waiting:
                    return
                job = self._waiting.popleft()
                self._running = job
            self._execute(job)

    def _execute(self, job: Job) -> None:
        if job.cancelled.is_set():
            job.events.put((CANCELLED, None))
            return
        job.started_at = time.perf_counter()
        req = job.request
        results = []
        try:
            for index in range(req.output.n):
                result = self._choice(job, index)
                if result is None:
                    job.events.put((CANCELLED, None))
                    return
                results.append(result)
                job.events.put((CHOICE, (index, result)))
        except UserError as e:
            job.events.put((ERROR, invalid(str(e), None)))
            return
        except Exception as e:  # keep serving; the engine's cache may be half-written, so drop it
            log.exception("generation failed")
            self.model.engine.reset()
            job.events.put((ERROR, server_error(f"generation failed: {type(e).__name__}: {e}")))
            return
        stats = {**results[-1].stats, "queue_wait_s": round(job.started_at - job.enqueued_at, 6),
                 "rss_bytes": current_rss_bytes()}
        with self._cond:
            self.completed += 1
        job.events.put((DONE, stats))

    def _choice(self, job: Job, index: int) -> Any:
        """One choice's generation, streamed as PIECE events; None when the job was cancelled."""
        req, out = job.request, job.request.output
        sampling = dict(req.sampling)
        if index and sampling.get("seed") is not None:
            sampling["seed"] += index  # n choices from one seed: reproducible, and not n copies
        generation = self.model.generation(req.prompt_ids, req.max_tokens, stop=req.stop, grammar=out.grammar,
                                           logprobs=out.logprobs, **sampling)
        sent = 0  # logprob entries already sent with a piece
        pieces = iter(generation)
        try:
            for piece in pieces:
                if job.cancelled.is_set():
                    return None
                entries = None
                if generation.logprobs is not None:
                    entries, sent = generation.logprobs[sent:len(generation.tokens)], len(generation.tokens)
                job.events.put((PIECE, (index, piece, entries)))
        finally:
            pieces.close()
        if job.cancelled.is_set():
            return None
        result = generation.result()
        if out.tools:
            content, calls = self.model.tool_call_format.parse(result.text, out.tools)
            if calls:
                result.text, result.tool_calls, result.finish_reason = content or "", calls, "tool_calls"
        self.metrics.generation_done(result.stats)
        return result
