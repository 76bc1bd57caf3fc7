"""Streaming detokenization: text as soon as it is complete, one token at a time.

A character may be spread over several tokens (byte-fallback `<0xF0><0x9F><0x98><0x80>`, or
byte-level pieces of an emoji or a CJK character); its bytes are held back until the character
is whole. The concatenation of everything pushed plus `flush()` equals `Tokenizer.decode` of
the same ids whenever those ids spell valid UTF-8.
"""

from __future__ import annotations

import codecs

from .tokenizer import Tokenizer


class StreamDecoder:
    def __init__(self, tok: Tokenizer, skip_special: bool = False) -> None:
        self._tok = tok
        self._skip_special = skip_special
        self._utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._first = True
        self.text = ""  # everything emitted so far

    def push(self, token_id: int) -> str:
        """Add one token; return the text that became complete (often "", never partial)."""
        if self._skip_special and self._tok.is_special(token_id):
            self._tok.id_to_token(token_id)  # still reject ids outside the vocabulary
            return ""
        data = self._tok.token_bytes(token_id, first=self._first)
        self._first = False
        piece = self._utf8.decode(data)
        self.text += piece
        return piece

    def flush(self) -> str:
        """End of stream: bytes of an unfinished character come out as U+FFFD."""
        piece = self._utf8.decode(b"", final=True)
        self.text += piece
        return piece
