"""The write stage: lay blocks out in weights.bin and write the bundle so it is never half there.

Everything goes into a sibling directory `OUT.tmp-<pid>`; blocks are written as their layers
finish, files are fsynced, the manifest is written last, and only then is the directory renamed to OUT (and the parent directory fsynced).
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
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.export.partition import BlockSpec
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
class Placed:
    spec: BlockSpec
    offset: int
    data_nbytes: int
    nbytes: int
    tensor_offsets: list[int]  # in the block, parallel to spec.tensors
    arena_offset: int | None


def layout(blocks: list[BlockSpec]) -> list[Placed]:
    """Offsets of every block, tensor and arena (no I/O)."""
    placed, pos = [], 0
    for b in blocks:
        cursor, offsets = 0, []
        for t in b.tensors:
            cursor = align_up(cursor, TENSOR_ALIGNMENT)
            offsets.append(cursor)
            cursor += t.nbytes
        arena_offset = None
        if b.arena is not None:
            cursor = align_up(cursor, TENSOR_ALIGNMENT)
            arena_offset = cursor
            cursor += b.arena.nbytes
        nbytes = max(align_up(cursor, BLOCK_ALIGNMENT), BLOCK_ALIGNMENT)
        placed.append(Placed(b, pos, cursor, nbytes, offsets, arena_offset))
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


Chunks = np.ndarray | Iterable[np.ndarray]  # a tensor's bytes, whole or as consecutive pieces


class BundleWriter:
    """Writes a bundle block by block, in any order, each at the offset the layout gives it.

        w = BundleWriter(out, blocks)             # OUT.tmp-<pid>/weights.bin
        w.write_block("layer.0.attention", {"blk.0.attn_q.weight": raw, ...})
        ...
        w.finish(manifest, tokenizer_json, tables)   # tables filled in, manifest written last
        w.commit()                                # fsync, rename to OUT
    Every written block is synced and dropped from the page cache: a memory cgroup counts the
    page cache, and an export must fit in one with the model bigger than the cgroup."""

    def __init__(self, out: Path, blocks: list[BlockSpec], overwrite: bool = False,
                 cleanup_note: Callable[[str], None] | None = None):
        self.out = Path(out)
        check_output(self.out, overwrite)
        for stale in stale_temp_dirs(self.out):
            shutil.rmtree(stale, ignore_errors=True)
            if cleanup_note:
                cleanup_note(f"removed {stale}, left by an export that did not finish")
        self.placed = {p.spec.name: p for p in layout(blocks)}
        last = list(self.placed.values())[-1] if self.placed else None
        self.weights_nbytes = last.offset + last.nbytes if last else 0
        self.tmp = temp_dir_for(self.out)
        self.block_table: dict[str, dict[str, Any]] = {}
        self.tensor_table: dict[str, dict[str, Any]] = {}
        self._fd = -1
        try:
            self.out.parent.mkdir(parents=True, exist_ok=True)
            free = shutil.disk_usage(self.out.parent).free
            if free < self.weights_nbytes:
                raise OutputError(f"{self.out.parent}: not enough free space for the bundle "
                                  f"({self.weights_nbytes / 2**20:.1f} MiB needed, {free / 2**20:.1f} MiB free)")
            if self.tmp.exists():
                shutil.rmtree(self.tmp)
            self.tmp.mkdir()
            (self.tmp / TEMP_MARKER).write_text(json.dumps({"pid": os.getpid(), "out": str(self.out)}))
            self._fd = os.open(self.tmp / WEIGHTS_FILE, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        except OSError as e:
            self.abort()
            raise OutputError(_describe_os_error(e, self.out)) from None
        except BaseException:
            self.abort()
            raise

    @property
    def path(self) -> Path:
        """Where the bundle is while it is written (a complete bundle once `finish` has run)."""
        return self.tmp

    def write_block(self, name: str, tensors: dict[str, Chunks], arena: Chunks | None = None,
                    arena_order: np.ndarray | None = None) -> None:
        """The block's tensors (every one its spec lists, bytes in file order) and its arena
        (`arena_order`: slot -> neuron id)."""
        p = self.placed[name]
        if name in self.block_table:
            raise ValueError(f"block {name} was already written")
        missing = [t.name for t in p.spec.tensors if t.name not in tensors]
        if missing or (p.spec.arena is not None) != (arena is not None):
            raise ValueError(f"block {name}: missing {missing or 'the arena'}")
        crc, cursor = 0, 0
        pos = p.offset

        def emit(data: memoryview) -> None:
            nonlocal crc, cursor, pos
            for start in range(0, len(data), _WRITE_CHUNK):
                piece = data[start:start + _WRITE_CHUNK]
                _pwrite_all(self._fd, piece, pos, self.tmp / WEIGHTS_FILE)
                crc = zlib.crc32(piece, crc)
                pos += len(piece)
            cursor += len(data)

        def emit_chunks(chunks: Chunks, nbytes: int, what: str) -> int:
            tensor_crc, done = 0, 0
            for chunk in [chunks] if isinstance(chunks, np.ndarray) else chunks:
                raw = memoryview(np.ascontiguousarray(chunk)).cast("B")
                emit(raw)
                tensor_crc = zlib.crc32(raw, tensor_crc)
                done += len(raw)
            if done != nbytes:
                raise ValueError(f"{what}: {done} bytes given, the layout has {nbytes}")
            return tensor_crc

        try:
            for t, offset in zip(p.spec.tensors, p.tensor_offsets):
                emit(memoryview(bytes(offset - cursor)))
                tensor_crc = emit_chunks(tensors[t.name], t.nbytes, t.name)
                self.tensor_table[t.name] = {"name": t.name, "block": name, "offset": offset, "nbytes": t.nbytes,
                                             "format": t.fmt, "shape": list(t.shape), "crc32": tensor_crc,
                                             "role": t.role}
            arena_entry = None
            if p.spec.arena is not None:
                a = p.spec.arena
                emit(memoryview(bytes(p.arena_offset - cursor)))
                emit_chunks(arena, a.nbytes, f"{name} arena")
                arena_entry = {"layer": a.layer, "n_neurons": a.n_neurons, "d_model": a.d_model, "stride": a.stride,
                               "offset": p.arena_offset,
                               "parts": [{"name": n, "format": f, "offset": o, "nbytes": nb} for n, f, o, nb in a.parts],
                               "order": pack_array(arena_order, "int32")}
            emit(memoryview(bytes(p.nbytes - cursor)))
            os.fdatasync(self._fd)
            os.posix_fadvise(self._fd, p.offset, p.nbytes, os.POSIX_FADV_DONTNEED)
        except OSError as e:
            self.abort()
            raise OutputError(_describe_os_error(e, self.out)) from None
        self.block_table[name] = {"name": name, "kind": p.spec.kind, "layer": p.spec.layer, "offset": p.offset,
                                  "nbytes": p.nbytes, "data_nbytes": p.data_nbytes, "crc32": crc,
                                  "tensors": [t.name for t in p.spec.tensors], "arena": arena_entry}

    def finish(self, manifest: dict[str, Any], tokenizer_json: str, tokenizer_tables: bytes | None = None
               ) -> dict[str, Any]:
        """Write the tokenizer and the manifest (tables filled in); returns the complete manifest.
        May run again (a manifest with more in it) before `commit`."""
        unwritten = [n for n in self.placed if n not in self.block_table]
        if unwritten:
            raise ValueError(f"blocks never written: {', '.join(unwritten[:5])}")
        try:
            tok_bytes = tokenizer_json.encode("utf-8")
            _write_file(self.tmp / TOKENIZER_FILE, tok_bytes)
            full = dict(manifest)
            full["tokenizer"] = {"file": TOKENIZER_FILE, "nbytes": len(tok_bytes), "crc32": zlib.crc32(tok_bytes)}
            if tokenizer_tables is not None:
                _write_file(self.tmp / TOKENIZER_TABLES_FILE, tokenizer_tables)
                full["tokenizer"]["tables"] = {"file": TOKENIZER_TABLES_FILE, "format": TABLES_FORMAT,
                                               "nbytes": len(tokenizer_tables), "crc32": zlib.crc32(tokenizer_tables)}
            full["weights"] = {"file": WEIGHTS_FILE, "nbytes": self.weights_nbytes, "block_alignment": BLOCK_ALIGNMENT,
                               "tensor_alignment": TENSOR_ALIGNMENT}
            full["blocks"] = [self.block_table[n] for n in self.placed]
            full["tensors"] = [self.tensor_table[t.name] for p in self.placed.values() for t in p.spec.tensors]
            os.fsync(self._fd)
            _write_file(self.tmp / MANIFEST_FILE, json.dumps(full, indent=1).encode("utf-8"))
            return full
        except OSError as e:
            self.abort()
            raise OutputError(_describe_os_error(e, self.out)) from None

    def commit(self) -> Path:
        """Move the finished bundle to OUT (nothing half-written is ever at OUT)."""
        try:
            os.close(self._fd)
            self._fd = -1
            (self.tmp / TEMP_MARKER).unlink()
            _fsync_dir(self.tmp)
            move_into_place(self.tmp, self.out)
            return self.out
        except OSError as e:
            self.abort()
            raise OutputError(_describe_os_error(e, self.out)) from None

    def abort(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)
            self._fd = -1
        shutil.rmtree(self.tmp, ignore_errors=True)


def _pwrite_all(fd: int, data: memoryview, pos: int, path: Path) -> None:
    try:
        while len(data):
            n = os.pwrite(fd, data, pos)
            data, pos = data[n:], pos + n
    except OSError as e:
        e.filename = e.filename or str(path)  # name the file in the one-line error
        raise


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
