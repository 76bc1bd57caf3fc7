"""Give freed heap memory back to the operating system once a tokenizer is built.

Building the compact tables frees tens of MB of temporaries (the spec's lists, numpy scratch
arrays). glibc keeps such memory in its heap -- after a large free it even raises its own
threshold for trimming -- so the process's RSS, which a memory budget is measured by, would
keep counting memory nothing uses. `malloc_trim(0)` hands the free pages back. With another C
library (musl, bionic, macOS) there is no such call and nothing is done.
"""

from __future__ import annotations

from edgeflash.base.heap import release_free_heap

__all__ = ["release_free_heap"]
