"""What every peer runner shares: flags, the prompt choice, timing records, medians, peak RSS, JSON.

Each runner measures ONE workload in its own process (so peak RSS belongs to that peer alone) and
prints one JSON object on stdout. Timings are taken from outside the peer: wall-clock around
prefill and around each generated token. The peer's own counters go in `peer_stats` when it has them.

Definitions, identical for every peer:
  ttft_s         prompt submitted -> first generated token available (prefill + first sample)
  prefill_tok_s  prompt_tokens / ttft_s
  decode_tok_s   (generated_tokens - 1) / (time of last token - time of first token)
Before timing, every runner generates two tokens from WARMUP_TEXT, so no repeat is a cold start.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import resource
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import workloads
from models import MODELS, BenchModel, get_model


# Every runner generates two tokens from this before timing anything (loads lazy state, spins
# up thread pools) so that the first timed repeat is not a cold start.
WARMUP_TEXT = "The quick brown fox"


def build_parser(peer: str) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=f"Run one {peer} benchmark workload and print one JSON object.")
    p.add_argument("--model", required=True, choices=list(MODELS))
    src = p.add_mutually_exclusive_group()
    src.add_argument("--prompt-file", type=Path, help="use this text file as the prompt")
    src.add_argument("--prompt-tokens", type=int, help="held-out passage cut to N tokens (default 400)")
    src.add_argument("--chat", action="store_true", help="a chat turn rendered with the model's template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--repeat", type=int, default=3)
    p.add_argument("--perplexity", action="store_true",
                   help="teacher-forced perplexity on the shared held-out windows instead of generation")
    p.add_argument("--out", type=Path, help="also write the JSON object to this file")
    return p


@dataclass
class Workload:
    model: BenchModel
    prompt: workloads.Prompt | None
    max_new_tokens: int
    threads: int
    repeat: int
    perplexity: bool


def resolve_workload(args: argparse.Namespace) -> Workload:
    model = get_model(args.model)
    if args.threads < 1 or args.repeat < 1 or args.max_new_tokens < 2:
        raise SystemExit("--threads and --repeat must be >= 1 and --max-new-tokens >= 2")
    prompt = None
    if not args.perplexity:
        if args.prompt_file:
            prompt = workloads.file_prompt(args.prompt_file)
        elif args.chat:
            prompt = workloads.chat_prompt(model)
        else:
            prompt = workloads.passage_prompt(model, args.prompt_tokens or 400)
    return Workload(model, prompt, args.max_new_tokens, args.threads, args.repeat, args.perplexity)


@dataclass
class Repeat:
    prompt_tokens: int
    generated_tokens: int
    ttft_s: float
    decode_s: float  # first token -> last token
    token_ids: list[int]
    text: str
    peer_stats: dict[str, Any] = field(default_factory=dict)

    @property
    def prefill_tok_s(self) -> float:
        return self.prompt_tokens / self.ttft_s

    @property
    def decode_tok_s(self) -> float:
        return (self.generated_tokens - 1) / self.decode_s if self.decode_s > 0 else float("nan")

    def to_json(self) -> dict[str, Any]:
        d = asdict(self)
        d["prefill_tok_s"] = round(self.prefill_tok_s, 2)
        d["decode_tok_s"] = round(self.decode_tok_s, 2)
        return d


class TokenClock:
    """Wall-clock stamps: start() when the prompt is handed over, tick() as each token arrives."""

    def __init__(self) -> None:
        self.t0 = 0.0
        self.stamps: list[float] = []

    def start(self) -> None:
        self.stamps = []
        self.t0 = time.perf_counter()

    def tick(self) -> None:
        self.stamps.append(time.perf_counter())

    @property
    def ttft_s(self) -> float:
        return self.stamps[0] - self.t0

    @property
    def decode_s(self) -> float:
        return self.stamps[-1] - self.stamps[0]


def peak_rss_bytes() -> int:
    """High-water resident set size of this process, from the kernel."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) * 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _median(values: list[float]) -> float:
    return round(statistics.median(values), 4)


def generation_report(peer: str, w: Workload, repeats: list[Repeat], extra: dict[str, Any],
                      peak_rss: int | None = None) -> dict[str, Any]:
    """`peak_rss`: a high-water mark read earlier, when the runner loads extra helpers afterwards."""
    assert w.prompt is not None
    first = repeats[0]
    return {
        "peer": peer,
        "mode": "generate",
        "model": w.model.name,
        "prompt": w.prompt.name,
        "threads": w.threads,
        "max_new_tokens": w.max_new_tokens,
        "repeat": len(repeats),
        "prompt_tokens": first.prompt_tokens,
        "generated_tokens": first.generated_tokens,
        "prefill_tok_s": _median([r.prefill_tok_s for r in repeats]),
        "decode_tok_s": _median([r.decode_tok_s for r in repeats]),
        "ttft_s": _median([r.ttft_s for r in repeats]),
        # On a shared machine the best repeat is the one least disturbed by other processes.
        "best_prefill_tok_s": round(max(r.prefill_tok_s for r in repeats), 4),
        "best_decode_tok_s": round(max(r.decode_tok_s for r in repeats), 4),
        "best_ttft_s": round(min(r.ttft_s for r in repeats), 4),
        "peak_rss_bytes": peak_rss if peak_rss is not None else peak_rss_bytes(),
        "token_ids": first.token_ids,
        "text": first.text,
        # Greedy decoding is deterministic: every repeat must produce the same tokens.
        "repeats_identical": all(r.token_ids == first.token_ids for r in repeats),
        "repeats": [r.to_json() for r in repeats],
        "machine": machine_info(),
        **extra,
    }


def perplexity_report(peer: str, w: Workload, nll_sum: float, n_predicted: int, n_windows: int,
                      extra: dict[str, Any]) -> dict[str, Any]:
    return {
        "peer": peer,
        "mode": "perplexity",
        "model": w.model.name,
        "windows": n_windows,
        "predicted_tokens": n_predicted,
        "nll_per_token": round(nll_sum / n_predicted, 6),
        "perplexity": round(math.exp(nll_sum / n_predicted), 4),
        "threads": w.threads,
        "peak_rss_bytes": peak_rss_bytes(),
        "machine": machine_info(),
        **extra,
    }


def machine_info() -> dict[str, Any]:
    load1, _, _ = os.getloadavg()
    return {"cpu_count": os.cpu_count(), "python": platform.python_version(), "loadavg_1m": round(load1, 2)}


def emit(report: dict[str, Any], out: Path | None) -> None:
    text = json.dumps(report)
    if out:
        out.parent.mkdir(parents=True, exist_ok=True)
        out.write_text(text + "\n")
    sys.stdout.write(text + "\n")
    sys.stdout.flush()


@contextlib.contextmanager
def native_stdout_to_stderr():
    """Send file descriptor 1 to stderr while a peer's native code prints its own reports there."""
    sys.stdout.flush()
    saved = os.dup(1)
    os.dup2(2, 1)
    try:
        yield
    finally:
        os.dup2(saved, 1)
        os.close(saved)


def log(msg: str) -> None:
    """Progress goes to stderr so stdout stays one JSON object."""
    print(msg, file=sys.stderr, flush=True)
