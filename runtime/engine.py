"""The contract every engine (numpy reference, native, memory-budgeted) implements.

An engine owns a KV cache holding the tokens it has seen. `forward` appends tokens and returns
logits; `truncate` drops the cache back to a prefix (chat reuse, speculative rollback).
"""

from __future__ import annotations

from typing import Any, Protocol, Sequence

import numpy as np
from edgeflash.runtime.spec import ModelSpec


class Engine(Protocol):
    name: str
    spec: ModelSpec
    tokenizer: Any
    context_length: int
    tokens: list[int]  # the tokens whose keys/values are in the cache, in order

    def forward(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        """Append `tokens` at positions len(self.tokens)...; return float32 logits
        `[len(tokens), vocab]` if all_logits else `[1, vocab]` for the last token."""
        ...

    def truncate(self, n_tokens: int) -> None:
        """Keep only the first `n_tokens` cached tokens."""
        ...

    def reset(self) -> None: ...

    def stats(self) -> dict[str, Any]:
        """Engine-specific run statistics merged into generation stats (bytes read, cache hits...)."""
        ...

    def close(self) -> None: ...
