"""Progress bars on stderr for the long steps of an export (tqdm), silenced with progress=False."""

from __future__ import annotations

import sys
from collections.abc import Iterable
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
