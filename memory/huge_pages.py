"""Staging slots sized for transparent huge pages.

A direct read lands straight in the destination's physical pages. Into ordinary 4 KiB pages a
1 MiB read is 256 scatter-gather segments, more than many block devices take in one request, so
the kernel splits it; into a 2 MiB huge page it is one segment. The native staging buffers
(`AlignedBuffer` in memory/native/direct_reader.cpp) therefore map anything of a huge page or
more on a huge-page boundary and ask for huge pages (madvise, which is only advice: where the
kernel has them off the buffers keep 4 KiB pages and every read is still correct).

Only whole huge pages inside a buffer can be huge, so a slot just under 2 MiB (SmolLM2's layers
at a quarter budget are 1.91 MiB) would get none: the planner rounds a slot up to whole huge
pages when that costs at most an eighth of it, and counts the rounded size in the budget.
"""

from __future__ import annotations

import functools
from pathlib import Path

HUGE_PAGE = 2 << 20
MAX_ROUNDING = 1 / 8  # of the slot: beyond it the bytes are worth more as resident weights
THP_DIR = Path("/sys/kernel/mm/transparent_hugepage")


@functools.cache
def transparent_huge_pages() -> bool:
    """True when this kernel hands out 2 MiB transparent huge pages to memory that asks for them."""
    try:
        enabled = (THP_DIR / "enabled").read_text()
        size = (THP_DIR / "hpage_pmd_size").read_text().strip()
    except OSError:
        return False  # not Linux, or a kernel built without them
    return "[never]" not in enabled and size == str(HUGE_PAGE)


def staging_slot_bytes(unit: int, huge_pages: bool | None = None) -> int:
    """Bytes of a staging slot that holds units of up to `unit` bytes."""
    if huge_pages is None:
        huge_pages = transparent_huge_pages()
    rounded = -(-unit // HUGE_PAGE) * HUGE_PAGE
    return rounded if huge_pages and unit and rounded - unit <= unit * MAX_ROUNDING else unit
