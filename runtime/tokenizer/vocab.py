"""A compact vocabulary: token texts by id and text -> id, without a Python object per token.

A 262k-token vocabulary held as a list of str plus a {str: id} dict costs tens of MB of RSS,
which a device's memory budget has to pay for. Here all texts live in one UTF-8 blob with an
offsets array, and text -> id goes through a bucketed hash index:

    offsets   [N + 1] uint32   token i is blob[offsets[i]:offsets[i + 1]]
    starts    [B + 1] uint32   bucket b holds index entries starts[b] .. starts[b + 1]
    marks     [E] uint8        8 more hash bits per entry: most non-matching entries fail here
    entry_ids [E] uint32       token id of each entry; within a bucket, larger ids first

There is a bucket for every two tokens: 9 bytes per token for the index, plus 4 for offsets
and the text itself (about 5 MB in all for Gemma's 262k tokens).

Buckets come from the low bits of the CRC-32 of the text's UTF-8, the marks from the next 8 bits:
computed in C, and the same in every process, so the index can be stored (a bundle's
tokenizer.tables) instead of rebuilt at every load (Python's str hash is salted per process). A
candidate is always checked against its bytes in the blob, so a collision cannot give a wrong id.
numpy builds the arrays; they are kept as `array.array`s, one small object each, whose items
read back as plain ints quickly.
"""

from __future__ import annotations

import zlib
from array import array
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np

_MARK_BITS = 8
_MAX_INDEXED = 1 << (32 - _MARK_BITS)  # bucket bits and mark bits must fit the 32 hash bits


def _utf8(text: str) -> bytes:
    try:
        return text.encode()
    except UnicodeEncodeError:  # a lone surrogate (tokenizer.json may escape one): keep it as is
        return text.encode("utf-8", "surrogatepass")


def packed(values: np.ndarray, typecode: str) -> array:
    """A numpy array copied into an `array.array` of the given item type."""
    out = array(typecode)
    out.frombytes(np.ascontiguousarray(values, dtype=np.dtype(typecode)).tobytes())
    return out


class Vocabulary:
    """Texts (or None for an unused id) by id; `find` maps a text to its largest id.

    `Vocabulary.build(texts)` makes one; `parts()` and `Vocabulary(parts)` take it apart and
    put it back together (see `packing`)."""

    __slots__ = (
        "_blob",
        "_bucket_bits",
        "_bucket_mask",
        "_count",
        "_entry_ids",
        "_marks",
        "_missing",
        "_offsets",
        "_starts",
    )

    def __init__(self, parts: dict[str, Any]) -> None:
        self._blob: bytes = parts["blob"]  # the per-token UTF-8 encodings, concatenated
        self._offsets: array = parts["offsets"]  # [N + 1] uint32
        self._missing = frozenset(parts["missing"])  # usually empty: ids no text is given for
        self._count = len(self._offsets) - 1
        self._starts: array = parts["starts"]  # [B + 1] uint32
        self._marks: array = parts["marks"]  # [E] uint8
        self._entry_ids: array = parts["entry_ids"]  # [E] uint32
        self._bucket_bits: int = parts["bucket_bits"]
        self._bucket_mask = (1 << self._bucket_bits) - 1

    def parts(self) -> dict[str, Any]:
        return {"blob": self._blob, "offsets": self._offsets, "missing": array("I", sorted(self._missing)),
                "starts": self._starts, "marks": self._marks, "entry_ids": self._entry_ids,
                "bucket_bits": self._bucket_bits}

    @classmethod
    def build(cls, texts: Sequence[str | None], *, indexed: bool = True) -> Vocabulary:
        """`indexed=False` leaves out the text -> id index: `find` then finds nothing."""
        # No Python object per token, not even a short-lived one (see `packing` for why).
        count = len(texts)
        for index, text in enumerate(texts):
            if not isinstance(text, str) and text is not None:
                raise ValueError(f"vocabulary entry {index} = {text!r:.60} is not a string or null")
        lengths = np.fromiter((0 if text is None else len(_utf8(text)) for text in texts), dtype=np.uint32, count=count)
        offsets = np.zeros(count + 1, dtype=np.uint64)
        np.cumsum(lengths, out=offsets[1:])
        del lengths
        if offsets[-1] >= 1 << 32:
            raise ValueError(f"vocabulary texts take {offsets[-1]} bytes; at most 4 GiB are supported")
        missing = [index for index, text in enumerate(texts) if text is None]
        joined = "".join(texts) if not missing else "".join(text or "" for text in texts)  # type: ignore[arg-type]
        parts: dict[str, Any] = {
            "blob": joined.encode("utf-8", "surrogatepass"),
            "offsets": packed(offsets, "I"),
            "missing": array("I", missing),
            "starts": array("I", [0, 0]), "marks": array("B"), "entry_ids": array("I"), "bucket_bits": 0,
        }
        del joined, offsets
        if indexed:
            parts.update(_hash_index(texts, missing))
        return cls(parts)

    def __len__(self) -> int:
        return self._count

    def text(self, token_id: int) -> str | None:
        """The text of an id in [0, len); None for an id without text."""
        if self._missing and token_id in self._missing:
            return None
        offsets = self._offsets
        return self._blob[offsets[token_id]:offsets[token_id + 1]].decode("utf-8", "surrogatepass")

    def to_list(self) -> list[str | None]:
        return [self.text(token_id) for token_id in range(len(self))]

    def find(self, text: str) -> int | None:
        """The largest id whose text is `text`, or None."""
        try:  # inlined `_utf8`: this is the tokenizer's innermost loop
            data = text.encode()
        except UnicodeEncodeError:
            data = text.encode("utf-8", "surrogatepass")
        code = zlib.crc32(data)
        starts = self._starts
        bucket = code & self._bucket_mask
        entry, stop = starts[bucket], starts[bucket + 1]
        if entry == stop:
            return None
        mark = (code >> self._bucket_bits) & 0xFF
        marks, entry_ids, offsets, blob = self._marks, self._entry_ids, self._offsets, self._blob
        while entry < stop:
            if marks[entry] == mark:
                token_id = entry_ids[entry]
                if blob[offsets[token_id]:offsets[token_id + 1]] == data:
                    return token_id
            entry += 1
        return None

    def find_all(self, text: str) -> Iterator[int]:
        """Every id whose text is `text`, largest first."""
        data = _utf8(text)
        code = zlib.crc32(data)
        bucket = code & self._bucket_mask
        mark = (code >> self._bucket_bits) & 0xFF
        for entry in range(self._starts[bucket], self._starts[bucket + 1]):
            token_id = self._entry_ids[entry]
            if self._marks[entry] == mark and self._blob[self._offsets[token_id]:self._offsets[token_id + 1]] == data:
                yield token_id

    def __contains__(self, text: object) -> bool:
        return isinstance(text, str) and self.find(text) is not None


def max_text_length(texts: Iterable[str | None]) -> int:
    """The length in characters of the longest text (0 when there is none)."""
    return max((len(text) for text in texts if text is not None), default=0)


def _hash_index(texts: Sequence[str | None], missing: list[int]) -> dict[str, Any]:
    """The index arrays of `Vocabulary` (see the module docstring)."""
    count = len(texts)
    present = count - len(missing)
    if present > _MAX_INDEXED:
        raise ValueError(f"a vocabulary of {present} texts is too large to index (at most {_MAX_INDEXED})")
    bucket_bits = max(1, (max(present, 1) - 1).bit_length() - 1)  # about two entries per bucket
    # One uint64 sort key per token: the bucket (low hash bits) on top, then larger ids first.
    keys = np.fromiter((zlib.crc32(_utf8(text)) if text is not None else 0 for text in texts), dtype=np.uint64,
                       count=count)
    marks = (keys >> np.uint64(bucket_bits)) & np.uint64((1 << _MARK_BITS) - 1)
    keys &= np.uint64((1 << bucket_bits) - 1)
    keys <<= np.uint64(32)
    keys |= np.uint64(0xFFFFFFFF) - np.arange(count, dtype=np.uint64)
    if missing:
        keys[missing] = np.uint64(0xFFFFFFFFFFFFFFFF)  # sorted past every bucket, then dropped
    order = np.argsort(keys, kind="stable")[:present]
    keys = keys[order]
    keys >>= np.uint64(32)  # the bucket of each entry, in entry order
    starts = np.searchsorted(keys, np.arange((1 << bucket_bits) + 1, dtype=np.uint64))
    del keys
    return {"starts": packed(starts, "I"), "marks": packed(marks[order], "B"), "entry_ids": packed(order, "I"),
            "bucket_bits": bucket_bits}
