"""How fast a budgeted run could possibly be on this storage, measured in the same round as the
runs themselves: the arithmetic behind "is a goal out of physical reach here".

A token of a streaming run cannot take less than reading its bytes at the fastest rate the storage
gives, nor less than its compute. So for a configuration streaming B bytes a token,

    ceiling vs hybrid = hybrid's time a token / max(B / fastest read rate, compute time a token)

with compute time from the unbudgeted engine (exact mode does the same arithmetic; approximate
configurations are given B / rate alone, which only raises their ceiling). The read rates come from
direct reads of the bundle's own weights.bin, the same number of bytes a token as hybrid streams,
read 8 times over as a run reads them every token (so the host's cache is as warm as in the runs),
into a buffer in huge pages as the runs' staging arena is:
one read of hybrid's unit at a time (hybrid's own pattern), and several reads in flight in a few
shapes (the fastest counts). This machine's virtual disk changes speed from minute to minute, which
is why the ceiling is measured per round rather than once.
"""

from __future__ import annotations

import os
import statistics
from pathlib import Path

from edgeflash.memory.layout import align_up

REPEATS = 8
# (I/O threads, read size) shapes with several reads in flight; the run's own shape is added.
PARALLEL_SHAPES = ((2, 2 << 20), (4, 1 << 20), (8, 256 << 10))


def read_rate(weights: Path, direct: bool, total: int, threads: int, chunk: int) -> float:
    """MB/s reading `total` bytes of `weights` REPEATS times with `threads` reads of `chunk` in flight."""
    from edgeflash.memory.io_profile import read_seconds

    seconds = sum(read_seconds(weights, direct, threads, align_up(chunk), total) for _ in range(REPEATS))
    return REPEATS * total / seconds / 1e6


def measure(weights: Path, hybrid: dict, flash: dict | None) -> dict:
    """One round's rates: `hybrid`/`flash` are run results carrying the plan's I/O shape."""
    from edgeflash.memory.direct_io import open_direct

    fd, direct = open_direct(weights)
    os.close(fd)
    total = max(4096, min(int(hybrid["flash_bytes_per_token"]), weights.stat().st_size) // 4096 * 4096)
    single = read_rate(weights, direct, total, 1, hybrid["io"]["unit"])
    shapes = list(PARALLEL_SHAPES)
    if flash and "io" in flash:
        shapes.insert(0, (flash["io"]["threads"], flash["io"]["chunk_bytes"]))
    parallel = {f"{t} x {c >> 10} KiB": read_rate(weights, direct, total, t, c) for t, c in shapes}
    return {"single_mb_s": single, "parallel_mb_s": parallel, "best_mb_s": max(parallel.values())}


def ceiling(hybrid_tok_s: float, bytes_per_token: float, best_mb_s: float, compute_s: float) -> float:
    """The most a configuration streaming `bytes_per_token` could gain over hybrid this round."""
    fastest = max(bytes_per_token / (best_mb_s * 1e6), compute_s)
    return (1 / hybrid_tok_s) / fastest if fastest > 0 else float("inf")


def summarize(rounds: list[dict]) -> str:
    """'single x MB/s, several in flight y MB/s (z x)' as medians over rounds."""
    single = statistics.median(r["single_mb_s"] for r in rounds)
    best = statistics.median(r["best_mb_s"] for r in rounds)
    gain = statistics.median(r["best_mb_s"] / r["single_mb_s"] for r in rounds)
    return f"{single:.0f} MB/s one read at a time, {best:.0f} MB/s several in flight ({gain:.2f}x)"
