"""The GPT-2 byte alphabet: every byte spelled as one printable character.

Byte-level BPE vocabularies (GPT-2, SmolLM2, Llama 3, Qwen2) store tokens in this alphabet so
that a token can hold any byte sequence, including pieces of a multi-byte UTF-8 character.
Printable Latin-1 bytes spell themselves; the other 68 bytes (controls, space, soft hyphen...)
are moved to code points 256 and up, in byte order.
"""

from __future__ import annotations


def _build_tables() -> tuple[dict[int, str], dict[str, int]]:
    printable = [*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAC + 1), *range(0xAE, 0xFF + 1)]
    char_of: dict[int, str] = {byte: chr(byte) for byte in printable}
    shifted = 0
    for byte in range(256):
        if byte not in char_of:
            char_of[byte] = chr(256 + shifted)
            shifted += 1
    return char_of, {char: byte for byte, char in char_of.items()}


BYTE_TO_CHAR, CHAR_TO_BYTE = _build_tables()

# str.translate table: a Latin-1 string (one char per byte) -> the byte alphabet.
_LATIN1_TO_ALPHABET = {byte: char for byte, char in BYTE_TO_CHAR.items()}


def spell_bytes(text: str) -> str:
    """`text` as UTF-8 bytes written in the byte alphabet."""
    return text.encode("utf-8").decode("latin-1").translate(_LATIN1_TO_ALPHABET)


def is_spelled(token: str) -> bool:
    """Whether every character of `token` belongs to the byte alphabet."""
    return all(char in CHAR_TO_BYTE for char in token)


def unspell(token: str) -> bytes:
    """The bytes a token in the byte alphabet stands for; a token that uses other characters
    (an added token such as `<|im start|>` with a space) stands for its own UTF-8 text."""
    try:
        return bytes(CHAR_TO_BYTE[char] for char in token)
    except KeyError:
        return token.encode("utf-8")
