"""Staging slots sized for transparent huge pages.

A direct read lands straight in the destination's physical pages. Into ordinary 4 KiB pages a
1 MiB read is a list of 256 scatter-gather segments that the device handles one by one; into a
2 MiB huge page it is one segment. On a virtual disk that made reads about twice as fast
(docs/memory-budget.md). The native staging buffers (`AlignedBuffer` in
memory/native/direct_reader.cpp) therefore map anything of a huge page or more on a huge-page
boundary and ask for huge pages (madvise, which is only advice: where the kernel has them off the
buffers keep 4 KiB pages and every read is still correct).

Only whole huge pages inside a buffer can be huge, so the staging slots share one arena (slots
of 1 MiB still sit in huge pages) and the planner rounds the arena up to whole huge pages when
that costs at most an eighth of it, or when the budget has the room left anyway; the rounded
size counts in the budget. SmolLM2's two 1.91 MiB slots at a quarter budget take 4 MiB, not 3.82.
"""

from __future__ import annotations

import functools
from pathlib import Path

HUGE_PAGE = 2 << 20
MAX_ROUNDING = 1 / 8  # of the arena: beyond it the bytes are worth more as resident weights
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


def whole_huge_pages(nbytes: int) -> int:
    """`nbytes` rounded up to whole huge pages where the kernel has them (else `nbytes`)."""
    return -(-nbytes // HUGE_PAGE) * HUGE_PAGE if transparent_huge_pages() else nbytes


def fills_huge_pages(nbytes: int) -> bool:
    """True when a buffer of `nbytes` can sit wholly in huge pages."""
    return nbytes > 0 and nbytes % HUGE_PAGE == 0 and transparent_huge_pages()


def staging_arena_bytes(slots_bytes: int) -> int:
    """Bytes the planner counts, while choosing what stays resident, for the one arena that holds
    `slots_bytes` of staging slots."""
    rounded = whole_huge_pages(slots_bytes)
    return rounded if rounded - slots_bytes <= slots_bytes * MAX_ROUNDING else slots_bytes
