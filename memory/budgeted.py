"""BudgetedEngine: the native engine inside one byte budget. The planner decides what stays
resident; resident weights are read once with direct I/O into the process's own memory, the rest
streams from flash for every forward pass (runtime/native + memory/native do the reading)."""

from __future__ import annotations

import errno
import os
import zlib
from typing import Any, Sequence

import numpy as np
from edgeflash.base.errors import IntegrityError, ModelFormatError, UserError
from edgeflash.base.sizes import format_size
from edgeflash.memory.approximate import ROW_READ_BYTES, ApproximateMode
from edgeflash.memory.io_profile import best_settings
from edgeflash.memory.layout import WeightLayout, align_down, align_up, tensor_view_of, weight_layout
from edgeflash.memory.planner import BudgetError, MemoryPlan, group_units, make_plan
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.source import ModelSource

# Head rows per logits pass under a budget: a quarter of the unbudgeted engine's, so its buffers
# (3 x max_batch x rows floats: 3 MiB at 16 tokens and 16384 rows) leave room for weights; the
# extra passes cost little next to reading the head from flash.
BUDGETED_HEAD_CHUNK = 4096
OPENING_PEAK_MARGIN = 1.05  # the opening peak moves by a few hundred KiB between runs

# canonical suffix -> the engine's name for a layer tensor
LAYER_TARGETS = {
    "attn_q.weight": "q", "attn_k.weight": "k", "attn_v.weight": "v", "attn_output.weight": "o",
    "ffn_gate.weight": "gate", "ffn_up.weight": "up", "ffn_down.weight": "down",
    "attn_norm.weight": "attn_norm", "ffn_norm.weight": "ffn_norm", "post_attention_norm.weight": "post_attn_norm",
    "post_ffw_norm.weight": "post_ffn_norm", "attn_q_norm.weight": "q_norm", "attn_k_norm.weight": "k_norm",
    "attn_q.bias": "q_bias", "attn_k.bias": "k_bias", "attn_v.bias": "v_bias",
    "predictor_a.weight": "pred_a", "predictor_b.weight": "pred_b",
}


def aligned_empty(nbytes: int) -> np.ndarray:
    """uint8 buffer whose first byte is 4 KiB aligned (direct I/O destinations must be)."""
    raw = np.empty(nbytes + 4096, dtype=np.uint8)
    skip = (-raw.ctypes.data) % 4096
    return raw[skip:skip + nbytes]


def open_direct(path) -> tuple[int, bool]:
    """A read-only descriptor with O_DIRECT when the file system allows it (tmpfs does not)."""
    flags = os.O_RDONLY | getattr(os, "O_CLOEXEC", 0)
    if hasattr(os, "O_DIRECT"):
        try:
            return os.open(path, flags | os.O_DIRECT), True
        except OSError as e:
            if e.errno != errno.EINVAL:
                raise
    return os.open(path, flags), False


def read_range(fd: int, path, offset: int, nbytes: int, out: np.ndarray | None = None) -> np.ndarray:
    """Read [offset, offset + nbytes); an aligned range may run past the end of the file, whose
    missing tail reads as zeros."""
    buf = aligned_empty(nbytes) if out is None else out[:nbytes]
    view = memoryview(buf)
    size = os.fstat(fd).st_size
    done = 0
    while done < nbytes:
        got = os.preadv(fd, [view[done:]], offset + done)
        if got == 0 and offset + done >= size:
            buf[done:] = 0
            break
        if got == 0:
            raise ModelFormatError(f"{path}: the file ends at byte {offset + done}, {offset + nbytes} expected "
                                   "(truncated?)")
        done += got
    return buf


class BudgetedEngine(NativeEngine):
    def __init__(self, source: ModelSource, *, budget: int, strategy: str = "flash",
                 fixed_costs: dict[str, int] | None = None, io_threads: int | None = None,
                 chunk_bytes: int | None = None, verify: bool = True, sparsity: float | None = None,
                 window: int = 4, head_shortlist: int | None = None, opening_peak: int = 0, **options: Any):
        """`opening_peak`: how far RSS rose while the model was opened (tokenizer and metadata
        built, their temporaries freed): the budget must hold that too."""
        self.budget, self.strategy = budget, strategy
        self._opening_peak = opening_peak
        self.sparsity, self.window, self.head_shortlist = sparsity, window, head_shortlist
        self._fixed_costs = dict(fixed_costs or {})
        self._io = (io_threads, chunk_bytes)  # None: from `edgeflash probe-io`'s profile, else defaults
        self._verify = verify
        self._decode_bytes = 0
        self._decode_passes = 0
        super().__init__(source, head_chunk=BUDGETED_HEAD_CHUNK, **options)

    def _check_opening_peak(self, plan_minimum: int) -> None:
        """Refuse a budget below what opening the model already took, when that is the larger
        minimum (the plan's own refusal says the rest)."""
        minimum = int(self._opening_peak * OPENING_PEAK_MARGIN)
        if self._opening_peak > self.budget and minimum > plan_minimum:
            raise BudgetError(
                f"memory budget {format_size(self.budget)} is too small for this model: at least "
                f"{format_size(minimum)} is needed, as opening it (tokenizer and metadata) alone took "
                f"{format_size(self._opening_peak)} at its peak, before any weight was loaded; "
                "raise --memory-budget", minimum)

    def _load_weights(self) -> None:
        spec, source = self.spec, self.source
        layout = weight_layout(source)
        mem = self._engine.memory()
        fixed = {"kv_cache": mem["kv_cache"], "activations": mem["activations"],
                 "logits": self._last_logits.nbytes, **self._fixed_costs}
        measured_threads, measured_chunk, measured = best_settings(layout.path)
        threads, chunk = self._io[0] or measured_threads, self._io[1] or measured_chunk
        self.layout = layout
        approx = ApproximateMode.configure(self, layout) if (self.sparsity or self.head_shortlist) else None
        self.approx = approx
        try:
            if approx is None:  # exact mode never reads the sparse-mode predictors
                skip = frozenset(g for g in layout.groups if g.endswith(".predictor"))
                plan = make_plan(layout, spec, self.budget, self.strategy, fixed, threads, chunk, skip=skip,
                                 head_chunk_limit=self.head_chunk)
            else:
                plan = approx.plan(fixed, threads, chunk)
        except BudgetError as error:
            self._check_opening_peak(error.minimum_bytes or 0)
            raise
        self._check_opening_peak(0)
        self.plan = plan
        if not measured and self.strategy == "flash":
            plan.notes.append("I/O settings are defaults; run `edgeflash probe-io` to measure this storage")
        fd, direct = open_direct(layout.path)
        try:
            tensors = self._read_resident(fd, layout, plan)
            if self._verify and source.kind == "bundle":
                self._verify_streamed(fd, plan)
        finally:
            os.close(fd)
        if not direct:
            plan.notes.append(f"{layout.path.parent} does not support direct I/O: reads go through the page cache")
        if approx is not None:
            tensors.update(approx.resident_tensors())
        self.resident_tensors = tensors  # a self-drafter may share the resident ones
        self._set_weights(tensors)
        units = self._stream_units(layout, plan)
        embedding = None
        if "embedding" in plan.streamed:
            t, loc = source.tensors["token_embd.weight"], layout.locations["token_embd.weight"]
            embedding = {"offset": loc.offset, "fmt": t.fmt, "rows": t.rows, "cols": t.cols}
        try:
            self._engine.set_streaming(str(layout.path), direct, plan.io.threads, plan.io.chunk_bytes, units,
                                       plan.io.slots, plan.io.prefetch, embedding, staging_bytes=plan.staging_bytes)
            if approx is not None:
                approx.install(self._engine)
        except (ValueError, RuntimeError) as e:
            raise UserError(f"{layout.path}: {e}") from None
        self.direct_io = direct
        self.embedding_stream = (str(layout.path), direct, embedding)

    def check_reserve(self, name: str, actual: int) -> None:
        """A fixed cost the plan reserved before the thing existed must hold what it became."""
        reserved = self.plan.fixed.get(name, 0)
        if actual > reserved:
            raise BudgetError(f"the {name} part takes {actual / 2**20:.1f} MiB but the plan reserved "
                              f"{reserved / 2**20:.1f} MiB; raise --memory-budget")

    def read_rows(self, name: str, ids: np.ndarray) -> np.ndarray:
        """Rows of a tensor, read with direct I/O (no page cache, no memory map): [len(ids), row_bytes]."""
        t, loc = self.source.tensors[name], self.layout.locations[name]
        row_bytes = loc.nbytes // t.rows
        out = np.empty((len(ids), row_bytes), dtype=np.uint8)
        order = np.argsort(ids)
        wanted = ids[order]
        scratch = aligned_empty(ROW_READ_BYTES)
        rows_per_read = max(1, (ROW_READ_BYTES - 8192) // row_bytes)  # room for the page alignment at both ends
        fd, _ = open_direct(self.layout.path)
        try:
            k = 0
            while k < len(order):
                r0 = int(wanted[k])
                # One read from this row up to the last wanted row within reach, not past it.
                r1 = int(wanted[np.searchsorted(wanted, r0 + rows_per_read) - 1]) + 1
                begin = loc.offset + r0 * row_bytes
                start = align_down(begin)
                buf = read_range(fd, self.layout.path, start, align_up(loc.offset + r1 * row_bytes) - start, scratch)
                while k < len(order) and int(wanted[k]) < r1:
                    at = begin - start + (int(wanted[k]) - r0) * row_bytes
                    out[order[k]] = buf[at:at + row_bytes]
                    k += 1
        finally:
            os.close(fd)
        return out

    def _read_resident(self, fd: int, layout: WeightLayout, plan: MemoryPlan) -> dict:
        """Resident groups and global tensors, read once into this process's memory."""
        source = self.source
        tensors = {}
        for name in plan.resident:
            group = layout.groups[name]
            buf = read_range(fd, layout.path, group.start, group.nbytes)
            self._check_blocks(group.start, buf)
            for t in group.tensors:
                tensors[t] = tensor_view_of(source.tensors[t], buf, layout.locations[t].offset - group.start)
        for t in layout.groups["globals"].tensors if "globals" in layout.groups else []:
            loc = layout.locations[t]
            start = align_down(loc.offset)
            buf = read_range(fd, layout.path, start, align_up(loc.offset + loc.nbytes) - start)
            tensors[t] = tensor_view_of(source.tensors[t], buf, loc.offset - start)
        for group in layout.groups.values():  # tensors whose bytes differ from the file (already in memory)
            for t in group.pinned:
                tensors[t] = source.tensors[t]
        return tensors

    def _blocks_in(self, start: int, end: int):
        bundle = self.source.info.get("bundle")
        if bundle is None:
            return []
        return [b for b in bundle.blocks.values() if start <= b.offset and b.offset + b.nbytes <= end]

    def _check_blocks(self, start: int, buf: np.ndarray) -> None:
        if not self._verify:
            return
        for block in self._blocks_in(start, start + len(buf)):
            data = buf[block.offset - start: block.offset - start + block.nbytes]
            if zlib.crc32(data) != block.crc32:
                raise IntegrityError(f"{self.layout.path}: checksum mismatch in block {block.name}; the file is "
                                     "corrupted")

    def _verify_streamed(self, fd: int, plan: MemoryPlan) -> None:
        """Check every streamed block's CRC once at load, through one small buffer."""
        scratch = None
        for name in plan.streamed:
            group = self.layout.groups[name]
            for block in self._blocks_in(group.start, group.end):
                crc, done = 0, 0
                while done < block.nbytes:
                    n = min(4 << 20, block.nbytes - done)
                    if scratch is None:
                        scratch = aligned_empty(4 << 20)
                    crc = zlib.crc32(read_range(fd, self.layout.path, block.offset + done, n, scratch), crc)
                    done += n
                if crc != block.crc32:
                    raise IntegrityError(f"{self.layout.path}: checksum mismatch in block {block.name}; the file is "
                                         "corrupted")

    def _stream_units(self, layout: WeightLayout, plan: MemoryPlan) -> list[dict]:
        units = []
        streamed = set(plan.streamed)
        for layer in range(self.spec.n_layers):
            groups = [g for g in layout.layer_groups(layer) if g.name in streamed]
            if not groups:
                continue
            ranges = group_units(layout, groups)
            placed, at = [], 0  # (file offset, bytes, where the range lands in the staging slot)
            for start, nbytes in ranges:
                placed.append((start, nbytes, at))
                at += nbytes
            tensors = []
            for g in groups:
                for name in g.tensors:
                    if name in g.pinned:
                        continue
                    loc, t = layout.locations[name], self.source.tensors[name]
                    start, slot_at = next((s, a) for s, n, a in placed if s <= loc.offset < s + n)
                    suffix = name.split(".", 2)[2]
                    tensors.append({"target": LAYER_TARGETS[suffix], "offset": loc.offset - start + slot_at,
                                    "fmt": t.fmt, "rows": t.rows if len(t.shape) > 1 else t.cols,
                                    "cols": t.cols if len(t.shape) > 1 else 1})
            units.append({"layer": layer, "ranges": ranges, "tensors": tensors})
        if plan.head_chunk_rows:
            name = "output.weight" if "head" in layout.groups else "token_embd.weight"
            t, loc = self.source.tensors[name], layout.locations[name]
            row_bytes = loc.nbytes // t.rows
            for chunk, r0 in enumerate(range(0, t.rows, plan.head_chunk_rows)):
                r1 = min(t.rows, r0 + plan.head_chunk_rows)
                begin, end = loc.offset + r0 * row_bytes, loc.offset + r1 * row_bytes
                start = align_down(begin)
                units.append({"head_chunk": chunk, "row0": r0, "ranges": [(start, align_up(end) - start)],
                              "tensors": [{"target": "head", "offset": begin - start, "fmt": t.fmt,
                                           "rows": r1 - r0, "cols": t.cols}]})
        return units

    def forward(self, tokens: Sequence[int], *, all_logits: bool = False) -> np.ndarray:
        before = self._engine.io_stats()["bytes_read"] if len(tokens) == 1 else None
        try:
            out = super().forward(tokens, all_logits=all_logits)
        except RuntimeError as e:  # a read failed or the file changed under us
            raise ModelFormatError(str(e)) from None
        if before is not None:
            self._decode_bytes += self._engine.io_stats()["bytes_read"] - before
            self._decode_passes += 1  # one token per decode pass
        return out

    def forward_tree(self, tokens, depths, mask, *, argmax_only: bool = False) -> np.ndarray:
        before = self._engine.io_stats()["bytes_read"]
        try:
            out = super().forward_tree(tokens, depths, mask, argmax_only=argmax_only)
        except RuntimeError as e:
            raise ModelFormatError(str(e)) from None
        self._decode_bytes += self._engine.io_stats()["bytes_read"] - before
        return out

    def commit_tree(self, path) -> None:
        super().commit_tree(path)
        self._decode_passes += len(path)  # tokens this verification pass produced

    def stats(self) -> dict[str, Any]:
        out = super().stats()
        io = self._engine.io_stats()
        out.update({
            "memory_budget_bytes": self.budget, "strategy": self.strategy,
            "planned_bytes": self.plan.total, "resident_weight_bytes": self.plan.resident_bytes,
            "flash_bytes_read": io["bytes_read"], "io_wait_s": round(io["io_wait_s"], 6),
            "flash_bytes_per_token": (self._decode_bytes // self._decode_passes) if self._decode_passes else None,
            "prefetched_units": io["prefetched_units"], "units_read": io["units_read"], "direct_io": io["direct_io"],
        })
        if self.approx is not None:
            out.update(self.approx.stats(self._engine))
        return out
