"""How fast the storage reads, by chunk size and number of reads in flight, measured with direct
I/O (`edgeflash probe-io`) and remembered per device so the planner picks the best setting."""

from __future__ import annotations

import json
import os
import time
from dataclasses import dataclass
from pathlib import Path

from edgeflash.kernels import _native
from edgeflash.memory.direct_io import aligned_empty, open_direct
from edgeflash.memory.layout import ALIGN

CHUNKS = (64 << 10, 256 << 10, 1 << 20, 4 << 20)
QUEUE_DEPTHS = (1, 2, 4, 8)
PROBE_BUFFER = 64 << 20  # the largest single read of a probe
DEFAULT_THREADS, DEFAULT_CHUNK = 4, 1 << 20  # reads in flight and read size when nothing was measured


def profile_path() -> Path:
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "edgeflash" / "io-profile.json"


@dataclass
class Measurement:
    chunk_bytes: int
    threads: int
    mb_per_s: float


def probe(path: Path, total_bytes: int = 128 << 20, chunks=CHUNKS, depths=QUEUE_DEPTHS) -> tuple[list[Measurement], bool]:
    """Throughput of direct reads of `path` for every (chunk, depth); returns (rows, direct_io)."""
    fd, direct = open_direct(path)
    os.close(fd)
    size = path.stat().st_size
    total = max(ALIGN, min(total_bytes, size) // ALIGN * ALIGN)
    rows = []
    for chunk in chunks:
        for threads in depths:
            rows.append(Measurement(chunk, threads, total / read_seconds(path, direct, threads, chunk, total) / 1e6))
    return rows, direct


def read_seconds(path: Path, direct: bool, threads: int, chunk_bytes: int, total: int) -> float:
    """Seconds to read the first `total` bytes of `path` in `chunk_bytes` pieces on `threads` I/O
    threads, the way the streaming engine reads (every piece of a request in flight at once)."""
    reader = _native.DirectReader(str(path), direct, threads, chunk_bytes)
    buffer = aligned_empty(min(total, PROBE_BUFFER))
    start = time.perf_counter()
    for done in range(0, total, len(buffer)):
        reader.read(done, buffer[:min(len(buffer), total - done)])
    return time.perf_counter() - start


def save(path: Path, rows: list[Measurement]) -> Path:
    out = profile_path()
    out.parent.mkdir(parents=True, exist_ok=True)
    data = json.loads(out.read_text()) if out.exists() else {}
    best = max(rows, key=lambda r: r.mb_per_s)
    data[str(os.stat(path).st_dev)] = {"file": str(path), "best": {"threads": best.threads, "chunk_bytes": best.chunk_bytes,
                                                                  "mb_per_s": round(best.mb_per_s, 1)},
                                       "rows": [r.__dict__ for r in rows]}
    tmp = out.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(out)
    return out


def best_settings(weights_file: Path) -> tuple[int, int, bool]:
    """(I/O threads, chunk bytes, measured?) for the device holding `weights_file`."""
    try:
        data = json.loads(profile_path().read_text())
        best = data[str(os.stat(weights_file).st_dev)]["best"]
        return int(best["threads"]), int(best["chunk_bytes"]), True
    except (OSError, ValueError, KeyError):
        return DEFAULT_THREADS, DEFAULT_CHUNK, False
