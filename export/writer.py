"""The write stage: lay blocks out in weights.bin and write the bundle so it is never half there.

Everything goes into a sibling directory `OUT.tmp-<pid>`; files are fsynced, the manifest is
written last, and only then is the directory renamed to OUT (and the parent directory fsynced).
A killed export therefore leaves at most a `*.tmp-<pid>` directory whose process is gone; the
next export to the same OUT removes it. Disk errors (full, read-only, no permission, file size
limit) become one-line UserErrors, and the temporary directory is removed.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.export.partition import BlockPlan
from edgeflash.runtime.bundle.layout import (
    BLOCK_ALIGNMENT,
    MANIFEST_FILE,
    TENSOR_ALIGNMENT,
    TOKENIZER_FILE,
    TOKENIZER_TABLES_FILE,
    WEIGHTS_FILE,
    align_up,
)
from edgeflash.runtime.bundle.packed import pack_array
from edgeflash.runtime.tokenizer.tokenizer import TABLES_FORMAT

TEMP_MARKER = ".edgeflash-export-in-progress"
_WRITE_CHUNK = 8 << 20


class OutputError(UserError):
    """The output path cannot be written (exists, no permission, disk full...)."""


@dataclass
class _Placed:
    plan: BlockPlan
    offset: int
    data_nbytes: int
    nbytes: int
    tensor_offsets: list[int]  # in the block, parallel to plan.tensors
    arena_offset: int | None


def layout(blocks: list[BlockPlan]) -> list[_Placed]:
    """Offsets of every block, tensor and arena (no I/O)."""
    placed, pos = [], 0
    for b in blocks:
        cursor, offsets = 0, []
        for t, _ in b.tensors:
            cursor = align_up(cursor, TENSOR_ALIGNMENT)
            offsets.append(cursor)
            cursor += t.nbytes
        arena_offset = None
        if b.arena is not None:
            cursor = align_up(cursor, TENSOR_ALIGNMENT)
            arena_offset = cursor
            cursor += b.arena.data.nbytes
        nbytes = max(align_up(cursor, BLOCK_ALIGNMENT), BLOCK_ALIGNMENT)
        placed.append(_Placed(b, pos, cursor, nbytes, offsets, arena_offset))
        pos += nbytes
    return placed


def temp_dir_for(out: Path, pid: int | None = None) -> Path:
    return out.parent / f"{out.name}.tmp-{pid if pid is not None else os.getpid()}"


def stale_temp_dirs(out: Path) -> list[Path]:
    """`OUT.tmp-<pid>` directories left by exports whose process no longer exists."""
    pattern = re.compile(re.escape(out.name) + r"\.tmp-(\d+)$")
    stale = []
    if not out.parent.is_dir():
        return stale
    for p in out.parent.iterdir():
        m = pattern.match(p.name)
        if m and p.is_dir() and not _pid_alive(int(m.group(1))):
            stale.append(p)
    return stale


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def check_output(out: Path, overwrite: bool, what: str = "bundle") -> None:
    """Fail early (before any work) if OUT cannot be (re)placed. `what`: the kind of output
    (a bundle, or a target export), which also has its manifest at MANIFEST_FILE."""
    if out.exists():
        if not out.is_dir():
            raise OutputError(f"{out}: exists and is not a directory; choose another output path")
        if any(out.iterdir()):
            if not (out / MANIFEST_FILE).exists():
                raise OutputError(f"{out}: exists, is not empty and is not an edgeflash {what}; refusing to "
                                  "replace it")
            if not overwrite:
                raise OutputError(f"{out}: {'a' if what == 'bundle' else 'an'} {what} already exists there; "
                                  "pass --force (overwrite=True) to replace it")
    parent = out.parent
    existing = parent
    while not existing.exists():
        existing = existing.parent
    if os.statvfs(existing).f_flag & os.ST_RDONLY:
        raise OutputError(f"{existing}: read-only file system (cannot create {out} there)")
    if not os.access(existing, os.W_OK | os.X_OK):
        raise OutputError(f"{existing}: permission denied (cannot create {out} there)")


def write_bundle(out: Path, blocks: list[BlockPlan], manifest: dict[str, Any], tokenizer_json: str,
                 tokenizer_tables: bytes | None = None, overwrite: bool = False,
                 on_progress: Callable[[int], None] | None = None,
                 cleanup_note: Callable[[str], None] | None = None) -> dict[str, Any]:
    """Write the bundle at `out`; returns the complete manifest (tables filled in).
    `tokenizer_tables`: `Tokenizer.tables()`, so that readers skip building them."""
    out = Path(out)
    check_output(out, overwrite)
    for stale in stale_temp_dirs(out):
        shutil.rmtree(stale, ignore_errors=True)
        if cleanup_note:
            cleanup_note(f"removed {stale}, left by an export that did not finish")
    placed = layout(blocks)
    weights_nbytes = placed[-1].offset + placed[-1].nbytes if placed else 0
    tmp = temp_dir_for(out)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        free = shutil.disk_usage(out.parent).free
        if free < weights_nbytes:
            raise OutputError(f"{out.parent}: not enough free space for the bundle ({weights_nbytes / 2**20:.1f} MiB "
                              f"needed, {free / 2**20:.1f} MiB free)")
        if tmp.exists():
            shutil.rmtree(tmp)
        tmp.mkdir()
        (tmp / TEMP_MARKER).write_text(json.dumps({"pid": os.getpid(), "out": str(out)}))
        block_table, tensor_table = _write_weights(tmp / WEIGHTS_FILE, placed, on_progress)
        tok_bytes = tokenizer_json.encode("utf-8")
        _write_file(tmp / TOKENIZER_FILE, tok_bytes)
        full = dict(manifest)
        full["tokenizer"] = {"file": TOKENIZER_FILE, "nbytes": len(tok_bytes), "crc32": zlib.crc32(tok_bytes)}
        if tokenizer_tables is not None:
            _write_file(tmp / TOKENIZER_TABLES_FILE, tokenizer_tables)
            full["tokenizer"]["tables"] = {"file": TOKENIZER_TABLES_FILE, "format": TABLES_FORMAT,
                                           "nbytes": len(tokenizer_tables), "crc32": zlib.crc32(tokenizer_tables)}
        full["weights"] = {"file": WEIGHTS_FILE, "nbytes": weights_nbytes, "block_alignment": BLOCK_ALIGNMENT,
                           "tensor_alignment": TENSOR_ALIGNMENT}
        full["blocks"] = block_table
        full["tensors"] = tensor_table
        _write_file(tmp / MANIFEST_FILE, json.dumps(full, indent=1).encode("utf-8"))
        (tmp / TEMP_MARKER).unlink()
        _fsync_dir(tmp)
        move_into_place(tmp, out)
        return full
    except OSError as e:
        shutil.rmtree(tmp, ignore_errors=True)
        raise OutputError(_describe_os_error(e, out)) from None
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _write_weights(path: Path, placed: list[_Placed], on_progress: Callable[[int], None] | None
                   ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    block_table, tensor_table = [], []
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        for p in placed:
            crc, written = 0, 0

            def emit(data: memoryview) -> None:
                nonlocal crc, written
                for start in range(0, len(data), _WRITE_CHUNK):
                    piece = data[start:start + _WRITE_CHUNK]
                    _write_all(fd, piece, path)
                    crc = zlib.crc32(piece, crc)
                    if on_progress:
                        on_progress(len(piece))
                written += len(data)

            names = []
            for (t, role), offset in zip(p.plan.tensors, p.tensor_offsets):
                emit(memoryview(bytes(offset - written)))
                raw = memoryview(np.ascontiguousarray(t.raw)).cast("B")
                emit(raw)
                names.append(t.name)
                tensor_table.append({"name": t.name, "block": p.plan.name, "offset": offset, "nbytes": t.nbytes,
                                     "format": t.fmt, "shape": list(t.shape), "crc32": zlib.crc32(raw),
                                     "role": role})
            arena = None
            if p.plan.arena is not None:
                a = p.plan.arena
                emit(memoryview(bytes(p.arena_offset - written)))
                emit(memoryview(np.ascontiguousarray(a.data)).cast("B"))
                arena = {"layer": a.layer, "n_neurons": int(a.data.shape[0]), "d_model": a.d_model,
                         "stride": a.stride, "offset": p.arena_offset,
                         "parts": [{"name": n, "format": f, "offset": o, "nbytes": nb} for n, f, o, nb in a.parts],
                         "order": pack_array(a.order, "int32")}
            emit(memoryview(bytes(p.nbytes - written)))
            block_table.append({"name": p.plan.name, "kind": p.plan.kind, "layer": p.plan.layer, "offset": p.offset,
                                "nbytes": p.nbytes, "data_nbytes": p.data_nbytes, "crc32": crc, "tensors": names,
                                "arena": arena})
        os.fsync(fd)
    finally:
        os.close(fd)
    return block_table, tensor_table


def _write_all(fd: int, data: memoryview, path: Path) -> None:
    try:
        while len(data):
            n = os.write(fd, data)
            data = data[n:]
    except OSError as e:
        e.filename = e.filename or str(path)  # name the file in the one-line error
        raise


def _write_file(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        _write_all(fd, memoryview(data), path)
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def move_into_place(tmp: Path, out: Path) -> None:
    """Replace `out` by the finished directory `tmp`. An old `out` moves aside first and goes only
    once the new one is in place: a kill in between leaves one complete output, never none."""
    old = None
    if out.exists() and any(out.iterdir()):
        old = out.parent / f"{out.name}.old-{os.getpid()}"
        os.rename(out, old)
    os.rename(tmp, out)  # replaces an empty directory too
    _fsync_dir(out.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _describe_os_error(e: OSError, out: Path) -> str:
    where = e.filename or out
    if e.errno == errno.ENOSPC:
        return f"{where}: no space left on device while writing the bundle for {out}"
    if e.errno == errno.EDQUOT:
        return f"{where}: disk quota exceeded while writing the bundle for {out}"
    if e.errno == errno.EFBIG:
        return f"{where}: file too large (file system or process file-size limit) while writing the bundle for {out}"
    if e.errno in (errno.EACCES, errno.EPERM):
        return f"{where}: permission denied (cannot write the bundle {out})"
    if e.errno == errno.EROFS:
        return f"{where}: read-only file system (cannot write the bundle {out})"
    return f"{where}: cannot write the bundle {out} ({e.strerror or e})"
