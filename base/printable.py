"""Text from a file or a client, made safe to print: control characters (terminal escape
sequences, carriage returns, NUL), bidirectional overrides and other invisible characters are
shown as Python escapes (`\\x1b`, `\\u202e`), and long text is cut, so that a message naming a
tensor, a key or a value is always one visible line."""

from __future__ import annotations

from typing import Any

MAX_SHOWN = 200  # characters of one untrusted string shown in a message


def printable(value: Any, limit: int = MAX_SHOWN) -> str:
    """`value` as one line of visible characters (str() of anything else; bytes decoded with
    escapes for what is not UTF-8), at most `limit` characters before a '...'."""
    if isinstance(value, (bytes, bytearray, memoryview)):
        text = bytes(value).decode("utf-8", errors="backslashreplace")
    else:
        text = value if isinstance(value, str) else str(value)
    cut = len(text) > limit
    if cut:
        text = text[:limit]
    if not text.isprintable():
        text = "".join(ch if ch.isprintable() else _escape(ch) for ch in text)
    return text + "..." if cut else text


def quoted(value: Any, limit: int = MAX_SHOWN) -> str:
    """`printable(value)` in single quotes, for values inside a sentence."""
    return f"'{printable(value, limit)}'"


_SHORT_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def _escape(ch: str) -> str:
    if ch in _SHORT_ESCAPES:
        return _SHORT_ESCAPES[ch]
    code = ord(ch)
    if code < 0x100:
        return f"\\x{code:02x}"
    return f"\\u{code:04x}" if code < 0x10000 else f"\\U{code:08x}"
