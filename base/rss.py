"""Resident memory of this process as the OS measures it (Linux /proc, with a portable fallback)."""

from __future__ import annotations

import resource
import sys


def _status_kb(field: str) -> int | None:
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


def current_rss_bytes() -> int:
    kb = _status_kb("VmRSS")
    return kb * 1024 if kb is not None else peak_rss_bytes()


def peak_rss_bytes() -> int:
    """High-water mark of resident memory since start (or since `reset_peak_rss`)."""
    kb = _status_kb("VmHWM")
    if kb is not None:
        return kb * 1024
    maxrss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return maxrss if sys.platform == "darwin" else maxrss * 1024


def reset_peak_rss() -> bool:
    """Reset the high-water mark to the current RSS (Linux: write 5 to clear_refs). False if unsupported."""
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return True
    except OSError:
        return False
