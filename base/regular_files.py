"""Opening files a user or a model directory names, without trusting what they are.

Only regular files are opened: a FIFO would block the reader forever, a device such as
/dev/zero never ends, and a directory or a symlink loop is not a model. The file's type is
checked on the opened descriptor (no window between checking a name and opening it), and
sidecar files (JSON configs, tokenizers, templates) are read only up to a size limit.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from pathlib import Path
from typing import Any

from edgeflash.base.errors import ModelFormatError
from edgeflash.base.printable import printable

MAX_JSON_DEPTH = 64  # nesting of objects and arrays in a config or tokenizer file
_KINDS = {stat.S_IFDIR: "a directory", stat.S_IFIFO: "a FIFO (named pipe)", stat.S_IFCHR: "a character device",
          stat.S_IFBLK: "a block device", stat.S_IFSOCK: "a socket"}


def open_regular(path: str | Path, what: str = "file") -> int:
    """A read-only descriptor of `path` (symlinks followed) once it is known to be a regular file;
    otherwise a ModelFormatError naming what it is instead."""
    shown = printable(path)
    try:
        # O_NONBLOCK: opening a FIFO for reading must not wait for a writer.
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC | os.O_NONBLOCK)
    except FileNotFoundError:
        raise ModelFormatError(f"{shown}: no such file") from None
    except OSError as e:
        raise ModelFormatError(f"{shown}: cannot open the {what} ({e.strerror})") from None
    try:
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            kind = _KINDS.get(stat.S_IFMT(mode), "not a regular file")
            raise ModelFormatError(f"{shown}: the {what} is {kind}; expected a regular file")
        flags = fcntl.fcntl(fd, fcntl.F_GETFL)
        fcntl.fcntl(fd, fcntl.F_SETFL, flags & ~os.O_NONBLOCK)
    except BaseException:
        os.close(fd)
        raise
    return fd


def read_limited(path: str | Path, limit: int, what: str = "file") -> bytes:
    """The whole of a regular file of at most `limit` bytes."""
    fd = open_regular(path, what)
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > limit:
            raise ModelFormatError(f"{printable(path)}: the {what} is {size} bytes; at most {limit} are accepted")
        data = f.read(limit + 1)
    if len(data) > limit:  # it grew while being read
        raise ModelFormatError(f"{printable(path)}: the {what} is over {limit} bytes; at most {limit} are accepted")
    return data


def read_text_limited(path: str | Path, limit: int, what: str = "file") -> str:
    """A UTF-8 text file of at most `limit` bytes."""
    data = read_limited(path, limit, what)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise ModelFormatError(f"{printable(path)}: the {what} is not UTF-8 text (byte {e.start})") from None


def read_json_limited(path: str | Path, limit: int, what: str = "JSON file",
                      max_depth: int = MAX_JSON_DEPTH) -> Any:
    """A JSON file of at most `limit` bytes, nested at most `max_depth` deep."""
    data = read_limited(path, limit, what)
    try:
        return parse_json(data, max_depth)
    except ValueError as e:
        raise ModelFormatError(f"{printable(path)}: the {what} is not valid JSON ({printable(e)})") from None


def parse_json(data: str | bytes, max_depth: int = MAX_JSON_DEPTH) -> Any:
    """json.loads, with ValueError (never RecursionError) for nesting deeper than `max_depth`."""
    try:
        value = json.loads(data)
    except RecursionError:
        raise ValueError(f"nested deeper than {max_depth} levels") from None
    if json_depth(value, max_depth) > max_depth:
        raise ValueError(f"nested deeper than {max_depth} levels")
    return value


def json_depth(value: Any, stop_at: int) -> int:
    """How deep `value`'s lists and dicts nest (a scalar is 0), counted without recursion and
    given up past `stop_at`."""
    deepest, stack = 0, [(value, 1)]
    while stack:
        item, depth = stack.pop()
        children = item.values() if isinstance(item, dict) else item if isinstance(item, list) else None
        if children is None:
            continue
        deepest = max(deepest, depth)
        if deepest > stop_at:
            return deepest
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return deepest
