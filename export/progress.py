"""Progress bars on stderr for the long steps of an export (tqdm), silenced with progress=False."""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from typing import TypeVar

from tqdm import tqdm

T = TypeVar("T")


def bar(items: Iterable[T], desc: str, enabled: bool, unit: str = "it", total: int | None = None) -> Iterable[T]:
    return tqdm(items, desc=desc, unit=unit, total=total, disable=not enabled, file=sys.stderr, leave=False,
                dynamic_ncols=True)


def note(message: str, enabled: bool) -> None:
    """One status line on stderr (between bars)."""
    if enabled:
        sys.stderr.write(f"[export] {message}\n")
        sys.stderr.flush()


def tqdm_bytes(total: int, desc: str, enabled: bool) -> tqdm:
    return tqdm(total=total, desc=desc, unit="B", unit_scale=True, unit_divisor=1024, disable=not enabled,
                file=sys.stderr, leave=False, dynamic_ncols=True)


class StageClock:
    """Wall seconds per export stage, summed over every time a stage runs; stages may overlap (a
    layer's quantization runs while the next layer calibrates), so `total_wall` is kept apart.
    CPU seconds are counted for the whole process."""

    def __init__(self, progress: bool):
        self.progress = progress
        self.wall: dict[str, float] = {}
        self._start_wall, self._start_cpu = time.perf_counter(), time.process_time()
        self._lock = threading.Lock()

    @contextmanager
    def stage(self, name: str) -> Iterator[None]:
        wall = time.perf_counter()
        try:
            yield
        finally:
            with self._lock:
                self.wall[name] = round(self.wall.get(name, 0.0) + time.perf_counter() - wall, 2)

    def totals(self) -> dict[str, float]:
        return {"wall": round(time.perf_counter() - self._start_wall, 2),
                "cpu": round(time.process_time() - self._start_cpu, 2)}
