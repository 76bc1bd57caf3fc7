"""A generation held to a grammar: before each token the logits of every token the grammar
forbids become -inf, and each chosen token advances the grammar's state."""

from __future__ import annotations

from typing import Any

import numpy as np
from edgeflash.base.errors import UserError

from .grammars import json_grammar
from .vocabulary import llg_tokenizer


class Constraint:
    def __init__(self, tok: Any, vocab_size: int, grammar: str, *, what: str = "grammar"):
        """`what` names the grammar's origin in errors (e.g. "response_format.json_schema")."""
        import llguidance

        self.vocab_size = vocab_size
        lltok = llg_tokenizer(tok, vocab_size)
        failed, _warnings = llguidance.LLMatcher.validate_grammar_with_warnings(grammar, lltok)
        if failed:
            raise UserError(f"{what}: {_warnings[0] if _warnings else 'the grammar does not compile'}")
        self._matcher = llguidance.LLMatcher(lltok, grammar, log_level=0)
        if self._matcher.is_error():
            raise UserError(f"{what}: {self._matcher.get_error()}")

    @classmethod
    def for_json(cls, tok: Any, vocab_size: int, schema: dict[str, Any], *, what: str = "json_schema") -> Constraint:
        return cls(tok, vocab_size, json_grammar(schema), what=what)

    def allowed(self) -> np.ndarray:
        """A bool per token id: may it come next?"""
        bits = np.frombuffer(self._matcher.compute_bitmask(), dtype=np.uint8)
        return np.unpackbits(bits, bitorder="little")[:self.vocab_size].astype(bool)

    def mask(self, logits: np.ndarray) -> np.ndarray:
        """A copy of `logits` [vocab] with the forbidden tokens at -inf."""
        allowed = self.allowed()
        out = np.array(logits, dtype=np.float32, copy=True)
        out[: allowed.size][~allowed] = -np.inf
        return out

    def accept(self, token: int) -> None:
        if not self._matcher.consume_token(int(token)):
            raise RuntimeError(f"token {token} was chosen against the grammar: {self._matcher.get_error()}")
