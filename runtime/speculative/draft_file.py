"""The file a draft model is read from under a memory budget: a copy of its GGUF file with every
matrix of more bits per weight than q4_0 in q4_0.

Under a budget the draft model streams from flash the layers its share cannot keep, for every
draft token. Qwen2.5-Coder-0.5B's GGUF file holds q5_0, q6_k and q8_0 matrices (392 MB with the
output matrix whose rows become its shortlist head); in q4_0 they take 278 MB, so more layers stay
resident and each draft token reads less. Without a budget the same conversion happens in memory
at load (draft_model.DRAFT_REQUANTIZE); a budgeted run converts nothing in memory (its plan counts
the file's bytes), so it reads a converted file instead.

The copy is written once, into the model cache, a slice of rows at a time (memory stays at a few
MB whatever the model), under a temporary name renamed into place, so a reader never sees half of
one. Metadata bytes are copied as they are; the token embedding keeps its format (its rows are
read one token at a time); each layer's tensors are written in the order its block reads them, so
its attention and its FFN are groups a plan can keep or stream apart (_grouped). Later loads reuse
the copy while the original's size and modification time are unchanged; a new copy replaces the
copies of earlier versions of a file of that name.
"""

from __future__ import annotations

import os
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import BinaryIO

import numpy as np
from edgeflash import kernels
from edgeflash.base.errors import UserError
from edgeflash.base.packaged_models import cache_dir
from edgeflash.kernels.formats import get_format
from edgeflash.memory.layout import block_position
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.sources.gguf import GGUFFile, TensorInfo, align_up
from edgeflash.runtime.tensors import dequantize_raw

DRAFT_FILE_FORMAT = "q4_0"
# What the writing holds at a time, so that a first budgeted load stays near its plan: values of
# a slice of rows being converted (as float32), and bytes of a tensor copied as it is.
CONVERT_VALUES = 1 << 18
COPY_BYTES = 1 << 20
KEPT = frozenset({"token_embd.weight"})  # read a row a token: converting would only lose precision
COPY_LAYOUT = "grouped"  # in a copy's name: its tensors written layer group by group (_grouped)


def budgeted_draft_path(draft: ModelSource) -> Path:
    """The file a budgeted run reads draft model `draft` from: its q4_0 copy (written now if there
    is none yet), or its own file when nothing in it converts (not a GGUF file, or no wider
    matrices)."""
    gguf: GGUFFile | None = draft.info.get("gguf")
    if gguf is None or not any(_converts(info) for info in gguf.tensors.values()):
        return Path(draft.path)
    stat = os.stat(draft.path)
    name = f"{Path(draft.path).stem}.{stat.st_size}-{stat.st_mtime_ns}.{DRAFT_FILE_FORMAT}.{COPY_LAYOUT}.gguf"
    copy = cache_dir() / "draft-copies" / name
    if not copy.is_file():
        _write_copy(gguf, copy)
        for stale in copy.parent.glob(f"{Path(draft.path).stem}.*.gguf"):
            if stale != copy:  # of an earlier version of the file (size or time), or an earlier layout
                stale.unlink(missing_ok=True)
    return copy


def _grouped(gguf: GGUFFile) -> list[TensorInfo]:
    """The tensors in the order the copy writes them: each layer's where the file has its first
    one, in the order its block reads them (attention, then the FFN's norm, gate, up and down). A
    layer whose attention and FFN interleave in the file is planned as one group, kept resident or
    streamed whole (memory/layout.py); apart, a budget can keep one and stream the other (on
    Qwen2.5-Coder-0.5B, whose files put the FFN between the attention norm and its matrices: 1 and
    7 MiB instead of 8)."""
    tensors = list(gguf.tensors.values())
    first: dict[int, int] = {}
    for i, info in enumerate(tensors):
        position = block_position(info.name)
        if position is not None:
            first.setdefault(position[0], i)

    def key(i: int) -> tuple[int, int, int]:
        position = block_position(tensors[i].name)
        return (i, 0, 0) if position is None else (first[position[0]], position[1], i)

    return [tensors[i] for i in sorted(range(len(tensors)), key=key)]


def _converts(info: TensorInfo) -> bool:
    if info.name in KEPT or len(info.shape) != 2:
        return False
    wanted = get_format(DRAFT_FILE_FORMAT)
    return info.shape[1] % wanted.block_elems == 0 and \
        get_format(info.fmt).bits_per_weight > wanted.bits_per_weight


def _write_copy(gguf: GGUFFile, copy: Path) -> None:
    started = time.perf_counter()
    try:
        copy.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{copy.name}.", suffix=".partial", dir=copy.parent)
    except OSError as e:
        raise UserError(f"draft model {gguf.path}: cannot write its {DRAFT_FILE_FORMAT} copy into "
                        f"{copy.parent} ({e.strerror}); set EDGEFLASH_CACHE to a writable folder") from None
    tmp = Path(tmp_name)
    formats = {name: DRAFT_FILE_FORMAT if _converts(info) else info.fmt
               for name, info in gguf.tensors.items()}
    try:
        os.fchmod(fd, 0o644)
        # The original is read with pread, not through its memory map: mapped pages would count in
        # this process's memory, which a budgeted load must keep inside its budget.
        with os.fdopen(fd, "wb") as out, open(gguf.path, "rb", buffering=0) as src:
            _copy_bytes(src.fileno(), out, 0, gguf.metadata_end)  # magic, version, counts, metadata
            offset, order = 0, _grouped(gguf)
            for info in order:
                out.write(_table_entry(info, formats[info.name], offset))
                offset += align_up(_nbytes(info, formats[info.name]), gguf.alignment)
            _pad(out, gguf.alignment)
            data_start = out.tell()
            for info in order:
                _write_tensor(src.fileno(), out, info, formats[info.name])
                _pad(out, gguf.alignment)
            out.flush()
            os.fsync(out.fileno())
            if out.tell() != data_start + offset:
                raise OSError(0, f"wrote {out.tell()} bytes, expected {data_start + offset}")
        os.replace(tmp, copy)
    except OSError as e:
        raise UserError(f"draft model {gguf.path}: cannot write its {DRAFT_FILE_FORMAT} copy {copy} "
                        f"({e.strerror})") from None
    finally:
        tmp.unlink(missing_ok=True)
    print(f"edgeflash: draft model {gguf.path.name}: wrote its {DRAFT_FILE_FORMAT} copy for budgeted runs, "
          f"{copy} ({copy.stat().st_size / 1e6:.0f} MB, {time.perf_counter() - started:.1f} s)",
          file=sys.stderr, flush=True)


def _nbytes(info: TensorInfo, fmt: str) -> int:
    return _rows(info) * get_format(fmt).row_bytes(info.shape[-1])


def _rows(info: TensorInfo) -> int:
    return int(np.prod(info.shape[:-1])) if len(info.shape) > 1 else 1


def _table_entry(info: TensorInfo, fmt: str, offset: int) -> bytes:
    name = info.name.encode("utf-8")
    dims = tuple(reversed(info.shape))  # GGML order: columns first
    return (struct.pack("<Q", len(name)) + name + struct.pack("<I", len(dims)) +
            struct.pack(f"<{len(dims)}Q", *dims) + struct.pack("<IQ", get_format(fmt).ggml_type, offset))


def _pad(out: BinaryIO, alignment: int) -> None:
    out.write(b"\0" * (align_up(out.tell(), alignment) - out.tell()))


def _read(fd: int, offset: int, count: int) -> bytes:
    data = os.pread(fd, count, offset)
    if len(data) != count:
        raise OSError(0, f"the file ends before byte {offset + count}")
    return data


def _copy_bytes(fd: int, out: BinaryIO, offset: int, count: int) -> None:
    for start in range(offset, offset + count, COPY_BYTES):
        out.write(_read(fd, start, min(COPY_BYTES, offset + count - start)))


def _write_tensor(fd: int, out: BinaryIO, info: TensorInfo, fmt: str) -> None:
    """The tensor's bytes as the file holds them (not as a family's loader may rewrite them), in
    `fmt`: copied, or converted a slice of rows at a time."""
    if fmt == info.fmt:
        _copy_bytes(fd, out, info.offset, info.nbytes)
        return
    cols, row_bytes = info.shape[-1], get_format(info.fmt).row_bytes(info.shape[-1])
    rows, step = _rows(info), max(1, CONVERT_VALUES // cols)
    for r0 in range(0, rows, step):
        n = min(step, rows - r0)
        part = np.frombuffer(_read(fd, info.offset + r0 * row_bytes, n * row_bytes), dtype=np.uint8)
        out.write(kernels.quantize(dequantize_raw(part.reshape(n, row_bytes), info.fmt, cols), fmt))
