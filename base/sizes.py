"""Byte sizes as users write them: 96MB, 1.5GiB, 300000000."""

from __future__ import annotations

import re

from edgeflash.base.errors import UserError

_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "kib": 2**10, "mib": 2**20, "gib": 2**30}
_SIZE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*([a-zA-Z]*)\s*$")


def parse_size(value: str | int, what: str = "memory budget") -> int:
    """Bytes from an int or a string such as "96MB" (10^6), "96MiB" (2^20) or "1.5GB"."""
    if isinstance(value, bool):
        raise UserError(f"{what} = {value!r}: expected a size such as 96MB or 1.5GiB")
    if isinstance(value, int):
        if value <= 0:
            raise UserError(f"{what} = {value}: expected a positive number of bytes")
        return value
    m = _SIZE.match(str(value))
    unit = m.group(2).lower() if m else None
    if not m or unit not in _UNITS:
        raise UserError(f"{what} = {value!r}: expected a size such as 96MB, 512MiB or 1.5GB")
    size = int(float(m.group(1)) * _UNITS[unit])
    if size <= 0:
        raise UserError(f"{what} = {value!r}: expected a positive size")
    return size


def format_size(n: int) -> str:
    for unit, scale in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} B"
