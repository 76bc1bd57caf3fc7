"""A native engine's weights under one byte budget. The planner (edgeflash.memory.planner) decides
what stays resident; resident weights are read once with direct I/O into the process's own memory,
the rest streams from flash for every forward pass (memory/native does the reading).

    weights = BudgetedWeights(source, budget=..., options=engine_options(...), fixed_costs=...)
    engine = NativeEngine(source, weights=weights, options=weights.options)

Planning happens before the engine exists, with the engine's own memory function, so a budget
that cannot work is refused before anything large is allocated."""

from __future__ import annotations

import os
import zlib
from typing import Any

import numpy as np
from edgeflash.base.errors import IntegrityError, UserError
from edgeflash.base.sizes import format_size
from edgeflash.kernels import _native
from edgeflash.memory.direct_io import aligned_empty, open_direct, read_range
from edgeflash.memory.io_profile import best_settings
from edgeflash.memory.layout import (LAYER_PARTS, Location, WeightLayout, align_down, align_up, build_layout,
                                     layer_units)
from edgeflash.memory.planner import BudgetError, make_plan
from edgeflash.memory.sparse_cost import CHUNK_READ_PENALTY, SMALL_READ_PENALTY, choose_ffn
from edgeflash.memory.sparsity_profile import lookup
from edgeflash.runtime.approximate import ROW_READ_BYTES, ApproximateMode
from edgeflash.runtime.bundle.arena import arena_layer
from edgeflash.runtime.native_config import engine_memory
from edgeflash.runtime.native_engine import LAYER_SLOTS, NativeEngine
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.tensors import Tensor

# Head rows per logits pass under a budget: a quarter of the unbudgeted engine's, so its buffers
# (3 x max_batch x rows floats) leave room for weights; the extra passes cost little next to
# reading the head from flash.
BUDGETED_HEAD_CHUNK = 4096
OPENING_PEAK_MARGIN = 1.05  # the opening peak moves by a few hundred KiB between runs
VERIFY_READ_BYTES = 4 << 20  # the buffer streamed blocks are checksummed through at load


def source_layout(source: ModelSource) -> WeightLayout:
    """Where each tensor of a GGUF file or bundle lies in its file, grouped for the planner."""
    if source.kind == "gguf":
        gguf = source.info["gguf"]
        path, locations = gguf.path, {n: Location(i.offset, i.nbytes) for n, i in gguf.tensors.items()}
    elif source.kind == "bundle":
        bundle = source.info["bundle"]
        path = bundle.weights_path
        locations = {n: Location(bundle.blocks[e.block].offset + e.offset, e.nbytes) for n, e in bundle.tensors.items()}
        for name in bundle.ffn_arenas():  # a layer's FFN stored once, as its arena
            block = bundle.arena_block(arena_layer(name))
            locations[name] = Location(block.offset + block.arena.offset, block.arena.nbytes)
    else:
        raise UserError(f"{source.path}: a memory budget needs a GGUF file or an edgeflash bundle "
                        f"(export this {source.kind} model with `edgeflash export`)")
    head = source.tensors["output.weight" if "output.weight" in source.tensors else "token_embd.weight"]
    return build_layout(path, locations, n_layers=source.spec.n_layers, head_rows=head.rows,  # a rank's rows
                        pinned=frozenset(source.info.get("rewritten_tensors", [])))


class BudgetedWeights:
    def __init__(self, source: ModelSource, *, budget: int, options: _native.EngineOptions, strategy: str = "flash",
                 fixed_costs: dict[str, int] | None = None, io_threads: int | None = None,
                 chunk_bytes: int | None = None, verify: bool = True, sparsity: float | None = None,
                 window: int = 4, head_shortlist: int | None = None, opening_peak: int = 0,
                 fallback: bool = True, full_head: bool = True, neuron_chunk: int = 0, panels: bool = False,
                 lent_staging: int = 0):
        """`fixed_costs`: what the loader measured or reserved besides the engine (tokenizer,
        speculation); `opening_peak`: how far RSS rose while the model was opened (tokenizer and
        metadata built, their temporaries freed): the budget must hold that too. `io_threads`,
        `chunk_bytes`: None takes `edgeflash probe-io`'s profile of this storage, else defaults.
        `full_head` False: the head is neither kept nor streamed; the caller gives the engine one of
        its own after `install` (a draft model's shortlist head, counted in `fixed_costs`).
        `panels`: resident layer matrices are laid out in panels where they were read (no copy), for
        faster products (q4_0 at AVX2: a token in a third of the time from rows). Nothing can then
        read them as rows: a self-drafter shares the engine's laid-out layers instead
        (`resident_layers`). Not with sparsity or a head shortlist. `lent_staging`: the bytes of
        the staging arena of an engine that computes in turn with this one and lends it (a draft
        model's target; `install(lender=...)`), which this plan's slots may use instead of its own."""
        self.source, self.spec, self.options = source, source.spec, options
        self.budget, self.strategy, self.verify = budget, strategy, verify
        self.sparsity, self.window, self.head_shortlist = sparsity, window, head_shortlist
        self.neuron_chunk = neuron_chunk
        self.panels = panels and not (sparsity or head_shortlist)
        self.requested_sparsity, self.fallback, self.ffn_choice = sparsity, fallback, None
        self.layout = layout = source_layout(source)
        mem = engine_memory(self.spec, options)
        fixed = {"kv_cache": mem.kv_cache, "activations": mem.activations, "logits": self.spec.vocab_size * 4,
                 **(fixed_costs or {})}
        measured_threads, measured_chunk, measured = best_settings(layout.path)
        threads, chunk = io_threads or measured_threads, chunk_bytes or measured_chunk
        self.approx = ApproximateMode.configure(self) if (sparsity or head_shortlist) else None
        try:
            if self.approx is None:  # exact mode never reads the sparse-mode predictors
                skip = frozenset(g for g in layout.groups if g.endswith(".predictor"))
                self.plan = make_plan(layout, budget, strategy, fixed, head_chunk_limit=options.head_chunk,
                                      io_threads=threads, chunk_bytes=chunk, skip=skip, full_head=full_head,
                                      lent_staging=lent_staging)
            else:
                self.plan = self.approx.plan(fixed, threads, chunk)
                if sparsity is not None:
                    self._keep_sparse_only_if_it_pays(fixed, threads, chunk)
        except BudgetError as error:
            self._check_opening_peak(opening_peak, error.minimum_bytes or 0)
            raise
        self._check_opening_peak(opening_peak, 0)
        if not measured and strategy == "flash":
            self.plan.notes.append("I/O settings are defaults; run `edgeflash probe-io` to measure this storage")
        self.resident_tensors: dict[str, Tensor] = {}  # filled by install; a self-drafter may share them
        self.full_head = full_head
        # a tied embedding laid out in place as the head: its rows are read from flash on demand
        self.embedding_on_demand = False
        self.resident_layers = self._leading_resident_layers()
        self.direct_io = True

    def _leading_resident_layers(self) -> int:
        """How many of the first layers the plan keeps resident whole (what a self-drafter can share)."""
        resident = set(self.plan.resident)
        count = 0
        while count < self.spec.n_layers and all(g.name in resident or g.name.endswith(".predictor")
                                                 for g in self.layout.layer_groups(count)):
            count += 1
        return count

    def _keep_sparse_only_if_it_pays(self, fixed: dict[str, int], threads: int, chunk: int) -> None:
        """A sparse FFN that would be slower than exact flash at this budget is not used: the plan
        says so and reads the FFN exactly (memory/sparse_cost.py; measured tokens/s decide when
        the bundle was measured at this budget, `sparsity_profile`)."""
        sparse_plan, sparse_mode, sparsity = self.plan, self.approx, self.sparsity
        self.sparsity = None
        try:
            exact_mode = ApproximateMode.configure(self) if self.head_shortlist else None
            if exact_mode is not None:
                exact_plan = exact_mode.plan(fixed, threads, chunk)
            else:
                skip = frozenset(g for g in self.layout.groups if g.endswith(".predictor"))
                exact_plan = make_plan(self.layout, self.budget, self.strategy, fixed,
                                       head_chunk_limit=self.options.head_chunk, io_threads=threads, chunk_bytes=chunk,
                                       skip=skip)
        except BudgetError:  # exact mode does not fit where the sparse one does: keep it
            self.sparsity = sparsity
            return
        self.sparsity = sparsity
        measured = lookup(self.layout.path, self.budget, sparsity, self.window)
        choice = choose_ffn(exact_plan.stream_bytes_per_pass, sparse_plan.stream_bytes_per_pass,
                            sparse_mode.neuron_read_estimate(), measured,
                            CHUNK_READ_PENALTY if sparse_mode.chunk_neurons else SMALL_READ_PENALTY)
        self.ffn_choice = choice
        if choice.sparse or not self.fallback:
            sparse_plan.notes.append(f"sparse FFN kept: {choice.reason}" if choice.sparse else
                                     f"sparse FFN kept as asked, though {choice.reason}")
            return
        self.sparsity, self.approx, self.plan = None, exact_mode, exact_plan
        exact_plan.notes.append(f"sparse FFN at {sparsity:.0%} sparsity, window {self.window} not used: {choice.reason}; "
                                "the FFN is read exactly (exact flash)")

    def _check_opening_peak(self, opening_peak: int, plan_minimum: int) -> None:
        """Refuse a budget below what opening the model already took, when that is the larger
        minimum (the plan's own refusal says the rest)."""
        minimum = int(opening_peak * OPENING_PEAK_MARGIN)
        if opening_peak > self.budget and minimum > plan_minimum:
            raise BudgetError(
                f"memory budget {format_size(self.budget)} is too small for this model: at least "
                f"{format_size(minimum)} is needed, as opening it (tokenizer and metadata) alone took "
                f"{format_size(opening_peak)} at its peak, before any weight was loaded; raise --memory-budget",
                minimum)

    # -- loading ------------------------------------------------------------------------------------

    def install(self, engine: NativeEngine, lender: NativeEngine | None = None) -> None:
        """`lender`: the engine whose staging arena a plan with borrowed staging streams through."""
        layout, plan = self.layout, self.plan
        if plan.borrowed_staging and lender is None:
            raise ValueError("a plan with borrowed staging needs the engine that lends it")
        fd, self.direct_io = open_direct(layout.path)
        try:
            tensors = self._read_resident(fd)
            if self.verify and self.source.kind == "bundle":
                self._verify_streamed(fd)
        finally:
            os.close(fd)
        if not self.direct_io:
            plan.notes.append(f"{layout.path.parent} does not support direct I/O: reads go through the page cache")
        if self.approx is not None:
            tensors.update(self.approx.resident_tensors())
        if self.panels:  # in place: only in buffers read here (a pinned tensor's are the source's own)
            pinned = {t for group in layout.groups.values() for t in group.pinned}
            read = {n: t for n, t in tensors.items() if n not in pinned}
            engine.set_tensors(read, panels=True, in_place=True, head=self.full_head)
            engine.set_tensors({n: t for n, t in tensors.items() if n in pinned})
            # the matrices laid out in place hold panels, not rows: only the rest can be shared
            head = "token_embd.weight" if self.spec.tied_embeddings else "output.weight"
            laid_out_head = head if engine.head_in_place else None
            tensors = {n: t for n, t in tensors.items()
                       if n in pinned or (n != laid_out_head and (not n.startswith("blk.") or len(t.shape) < 2))}
            self.embedding_on_demand = engine.tied_head_in_place
        else:
            engine.set_tensors(tensors)
        self.resident_tensors = tensors
        streaming = self.embedding_plan()
        streaming.io_threads, streaming.chunk_bytes = plan.io.threads, plan.io.chunk_bytes
        streaming.units, streaming.slots, streaming.prefetch = self._stream_units(), plan.io.slots, plan.io.prefetch
        streaming.staging_bytes = plan.borrowed_staging or plan.staging_bytes  # a borrower: the bytes it may use
        try:
            engine._engine.set_streaming(streaming, lender._engine if plan.borrowed_staging else None)
            if self.approx is not None:
                self.approx.install(engine._engine)
        except (ValueError, RuntimeError) as e:
            raise UserError(f"{layout.path}: {e}") from None

    def embedding_plan(self) -> _native.StreamingPlan:
        """A streaming plan that reads just the embedding rows on demand when the plan streams the
        table or its bytes became the head's panels (a self-drafter shares the target's table this
        way), else reads nothing."""
        plan = _native.StreamingPlan()
        plan.path, plan.direct, plan.io_threads, plan.slots, plan.prefetch = str(self.layout.path), self.direct_io, 1, 1, False
        plan.chunk_bytes = 64 * 1024
        if "embedding" in self.plan.streamed or self.embedding_on_demand:
            t, loc = self.source.tensors["token_embd.weight"], self.layout.locations["token_embd.weight"]
            plan.stream_embedding = True
            plan.embedding = _streamed(t, loc.offset)
        return plan

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

    def _read_resident(self, fd: int) -> dict[str, Tensor]:
        """Resident groups and global tensors, read once into this process's memory."""
        source, layout = self.source, self.layout
        tensors = {}
        for name in self.plan.resident:
            group = layout.groups[name]
            buf = read_range(fd, layout.path, group.start, group.nbytes)
            self._check_blocks(group.start, buf)
            for t in group.tensors:
                tensors[t] = source.tensors[t].with_bytes_from(buf, layout.locations[t].offset - group.start)
        for t in layout.groups["globals"].tensors if "globals" in layout.groups else []:
            loc = layout.locations[t]
            start = align_down(loc.offset)
            buf = read_range(fd, layout.path, start, align_up(loc.offset + loc.nbytes) - start)
            tensors[t] = source.tensors[t].with_bytes_from(buf, loc.offset - start)
        for group in layout.groups.values():  # tensors whose bytes differ from the file (already in memory)
            for t in group.pinned:
                tensors[t] = source.tensors[t]
        return tensors

    def _blocks_in(self, start: int, end: int) -> list:
        bundle = self.source.info.get("bundle")
        if bundle is None:
            return []
        return [b for b in bundle.blocks.values() if start <= b.offset and b.offset + b.nbytes <= end]

    def _check_blocks(self, start: int, buf: np.ndarray) -> None:
        if not self.verify:
            return
        for block in self._blocks_in(start, start + len(buf)):
            data = buf[block.offset - start: block.offset - start + block.nbytes]
            if zlib.crc32(data) != block.crc32:
                raise IntegrityError(f"{self.layout.path}: checksum mismatch in block {block.name}; the file is "
                                     "corrupted")

    def _verify_streamed(self, fd: int) -> None:
        """Check the CRC of every block not read whole into memory (streamed blocks, and in sparse
        mode the FFN blocks whose norms and neuron arenas are read piece by piece) once at load,
        through one small buffer."""
        scratch = None
        resident = [self.layout.groups[name] for name in self.plan.resident]
        checked = {id(b) for g in resident for b in self._blocks_in(g.start, g.end)}
        bundle = self.source.info.get("bundle")
        for block in bundle.blocks.values() if bundle is not None else []:
            if id(block) in checked:
                continue
            crc, done = 0, 0
            while done < block.nbytes:
                n = min(VERIFY_READ_BYTES, block.nbytes - done)
                if scratch is None:
                    scratch = aligned_empty(VERIFY_READ_BYTES)
                crc = zlib.crc32(read_range(fd, self.layout.path, block.offset + done, n, scratch), crc)
                done += n
            if crc != block.crc32:
                raise IntegrityError(f"{self.layout.path}: checksum mismatch in block {block.name}; the file is "
                                     "corrupted")

    def _stream_units(self) -> list[_native.StreamUnit]:
        layout, plan, units = self.layout, self.plan, []
        streamed = set(plan.streamed)
        for layer in range(self.spec.n_layers):
            groups = [g for g in layout.layer_groups(layer) if g.name in streamed]
            for lu in layer_units(layout, groups, 0 if plan.borrowed_staging else None):
                tensors = []
                for name in lu.tensors:
                    st = _streamed(self.source.tensors[name], lu.slot_offset(name, layout.locations))
                    st.target = LAYER_SLOTS[name.split(".", 2)[2]]
                    tensors.append(st)
                units.append(_unit(lu.ranges, tensors, layer=layer, parts=lu.parts))
        if plan.head_chunk_rows:
            name = "output.weight" if "head" in layout.groups else "token_embd.weight"
            t, loc = self.source.tensors[name], layout.locations[name]
            row_bytes = loc.nbytes // t.rows
            for chunk, r0 in enumerate(range(0, t.rows, plan.head_chunk_rows)):
                r1 = min(t.rows, r0 + plan.head_chunk_rows)
                begin, end = loc.offset + r0 * row_bytes, loc.offset + r1 * row_bytes
                start = align_down(begin)
                st = _streamed(t, begin - start)
                st.rows = r1 - r0
                units.append(_unit([(start, align_up(end) - start)], [st], head_chunk=chunk, head_row0=r0))
        return units

    # -- statistics ---------------------------------------------------------------------------------

    def stats(self, engine: NativeEngine) -> dict[str, Any]:
        native = engine._engine
        streamed = native.stream_stats()
        out = {"memory_budget_bytes": self.budget, "strategy": self.strategy, "planned_bytes": self.plan.total,
               "resident_weight_bytes": self.plan.resident_bytes, "direct_io": self.direct_io,
               "prefetched_units": streamed.prefetched_units if streamed else 0,
               "units_read": streamed.units_read if streamed else 0}
        if self.plan.borrowed_staging:
            out.update(retained_units=native.retained_units, retained_hits=streamed.retained_hits if streamed else 0)
        if self.approx is not None:
            out.update(self.approx.stats(native))
        if self.requested_sparsity is not None and self.sparsity is None:  # the planner kept exact flash
            out["ffn_sparsity_requested"] = self.requested_sparsity
            out["ffn_fallback"] = self.ffn_choice.reason if self.ffn_choice else None
        return out


def _streamed(t: Tensor, offset: int) -> _native.StreamedTensor:
    """A tensor as the streaming engine reads it: a matrix [rows, cols] or a vector {length, 1}."""
    st = _native.StreamedTensor()
    st.offset, st.fmt = offset, t.fmt
    st.rows, st.cols = (t.rows, t.cols) if len(t.shape) > 1 else (t.cols, 1)
    st.stride = getattr(t, "stride", 0)  # a neuron arena's rows are its bundles
    return st


def _unit(ranges: list[tuple[int, int]], tensors: list[_native.StreamedTensor], *, layer: int = -1,
          parts: tuple[int, int] = (0, len(LAYER_PARTS) - 1), head_chunk: int = -1,
          head_row0: int = 0) -> _native.StreamUnit:
    u = _native.StreamUnit()
    u.layer, u.parts, u.head_chunk, u.head_row0 = layer, parts, head_chunk, head_row0
    u.ranges, u.tensors = ranges, tensors
    return u

