"""`GET /metrics`: the server's counters and gauges in Prometheus' text exposition format (0.0.4),
for a scraper to graph requests, tokens, speed, queue and memory."""

from __future__ import annotations

import threading
from collections import Counter
from typing import Any

from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


class Metrics:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.requests: Counter[tuple[str, int]] = Counter()  # (path, status) -> count
        self.prompt_tokens = 0
        self.prompt_tokens_reused = 0
        self.generated_tokens = 0
        self.generations = 0
        self.prefill_s = 0.0
        self.decode_s = 0.0

    def request_done(self, path: str, status: int) -> None:
        with self._lock:
            self.requests[(path, status)] += 1

    def generation_done(self, stats: dict[str, Any]) -> None:
        with self._lock:
            self.generations += 1
            self.prompt_tokens += int(stats.get("prompt_tokens") or 0)
            self.prompt_tokens_reused += int(stats.get("prompt_tokens_reused") or 0)
            self.generated_tokens += int(stats.get("generated_tokens") or 0)
            self.prefill_s += float(stats.get("prefill_s") or 0.0)
            self.decode_s += float(stats.get("decode_s") or 0.0)

    def render(self, model_id: str, worker_status: dict[str, Any], uptime_s: float) -> str:
        label = f'model="{_escape(model_id)}"'
        with self._lock:
            requests = sorted(self.requests.items())
            rows = [
                ("edgeflash_prompt_tokens_total", "counter", "Prompt tokens of finished generations.",
                 self.prompt_tokens),
                ("edgeflash_prompt_tokens_reused_total", "counter",
                 "Prompt tokens found in the KV cache instead of computed.", self.prompt_tokens_reused),
                ("edgeflash_generated_tokens_total", "counter", "Tokens generated.", self.generated_tokens),
                ("edgeflash_generations_total", "counter", "Finished generations (a request with n > 1 has n).",
                 self.generations),
                ("edgeflash_prefill_seconds_total", "counter", "Time spent computing prompts.", self.prefill_s),
                ("edgeflash_decode_seconds_total", "counter", "Time spent generating tokens.", self.decode_s),
            ]
        rows += [
            ("edgeflash_requests_waiting", "gauge", "Requests in the queue behind the running one.",
             worker_status["queue_depth"]),
            ("edgeflash_requests_running", "gauge", "1 while a generation runs.", int(worker_status["busy"])),
            ("edgeflash_queue_capacity", "gauge", "Requests that may wait (--max-queue).", worker_status["max_queue"]),
            ("edgeflash_rss_bytes", "gauge", "Resident memory of the server process.", current_rss_bytes()),
            ("edgeflash_peak_rss_bytes", "gauge", "Peak resident memory of the server process.", peak_rss_bytes()),
            ("edgeflash_uptime_seconds", "gauge", "Seconds since the server started.", round(uptime_s, 3)),
        ]
        lines = ["# HELP edgeflash_http_requests_total HTTP requests answered, by path and status.",
                 "# TYPE edgeflash_http_requests_total counter"]
        lines += [f'edgeflash_http_requests_total{{{label},path="{_escape(path)}",status="{status}"}} {count}'
                  for (path, status), count in requests]
        for name, kind, help_text, value in rows:
            lines += [f"# HELP {name} {help_text}", f"# TYPE {name} {kind}", f"{name}{{{label}}} {value}"]
        return "\n".join(lines) + "\n"


def _escape(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")
