"""Approximate mode of a budgeted run: opt-in, with a measured quality cost.

- Sparse FFN (`sparsity`): per layer the bundle's low-rank predictor picks the neurons a token
  will activate; only their bundles (gate row, up row, down column) are read, into a windowed
  neuron cache that keeps the union of the last `window` tokens' neurons; the sparse kernel skips
  any whose gate falls under the calibrated threshold. The dense FFN is never read.
- Shortlist head (`head_shortlist`): only the rows of the most frequent calibration tokens are
  kept (resident); every other logit is -inf. Its top-1 agreement with the full head is measured
  by `benchmarks/memory/` and reported in docs/memory-budget.md.
"""

from __future__ import annotations

import math
import os
from typing import TYPE_CHECKING, Any

import edgeflash.kernels as kernels
import numpy as np
from edgeflash.base.errors import UserError
from edgeflash.kernels import _native
from edgeflash.memory.direct_io import open_direct, read_range
from edgeflash.memory.layout import align_down, align_up
from edgeflash.memory.planner import BudgetError, MemoryPlan, make_plan
from edgeflash.memory.sparse_cost import SparseLayerGeometry, neuron_read_bytes

if TYPE_CHECKING:
    from edgeflash.runtime.budgeted import BudgetedWeights

MIN_CAPACITY = 32  # neurons per layer: below this the cache only thrashes
HOT_FREQUENCY = 0.9  # a neuron active on this share of calibration tokens is kept resident in chunk mode
ROW_READ_BYTES = 256 << 10  # BudgetedWeights.read_rows's buffer: held only while the shortlist loads
BOUNCE_BYTES = 2 << 20  # memory/native/neuron_cache.cpp's read buffer (two batches)


class ApproximateMode:
    def __init__(self, weights: BudgetedWeights):
        self.weights, self.layout = weights, weights.layout
        self.source = source = weights.source
        self.spec = source.spec
        self.bundle = source.info["bundle"]
        self.calibration = source.info["manifest"].get("calibration") or {}
        self.sparsity, self.window, self.shortlist = weights.sparsity, weights.window, weights.head_shortlist
        self.neuron_chunk = int(getattr(weights, "neuron_chunk", 0) or 0)
        self.capacity = 0
        self.chunk_neurons, self.resident = 0, 0

    @classmethod
    def configure(cls, weights: BudgetedWeights) -> ApproximateMode:
        if weights.source.kind != "bundle":
            raise UserError(f"{weights.source.path}: --ffn-sparsity and --head-shortlist need a bundle made by "
                            "`edgeflash export` (it holds the neuron arenas, predictors and token counts)")
        mode = cls(weights)
        mode._check()
        return mode

    # -- what the bundle must provide -------------------------------------------------------------

    def _check(self) -> None:
        where = self.source.path
        if self.sparsity is not None:
            targets = self.calibration.get("sparsity", {}).get("targets", [])
            match = [k for k, t in enumerate(targets) if abs(t - self.sparsity) < 1e-6]
            if not match:
                raise UserError(f"--ffn-sparsity {self.sparsity}: {where} was calibrated for {targets or 'no sparsity'}; "
                                "export with --sparsity-levels to add a level")
            self.level = match[0]
            if not self.calibration.get("predictors"):
                raise UserError(f"{where}: sparse mode needs the bundle's neuron predictors (export with "
                                "--predictor-rank 32 or more)")
            for layer in range(self.spec.n_layers):
                try:
                    self.bundle.arena_block(layer)
                except KeyError:
                    raise UserError(f"{where}: sparse mode needs the neuron arena of layer {layer}, which this bundle "
                                    "lacks (exported with --no-neuron-arena)") from None
                if f"layer.{layer}.predictor" not in self.bundle.blocks:
                    raise UserError(f"{where}: sparse mode needs block layer.{layer}.predictor, which this bundle "
                                    "lacks")
            if self.window < 0:
                raise UserError(f"window = {self.window}: expected an integer >= 0")
        if self.shortlist is not None:
            ids = self.calibration.get("token_frequencies", {}).get("ids", [])
            if self.shortlist < 1 or not ids:
                raise UserError(f"--head-shortlist {self.shortlist}: {where} has {len(ids)} counted tokens; "
                                "expected a positive size and a bundle exported with --top-tokens")
            self.ids = np.asarray(ids[:self.shortlist], dtype=np.int32)

    # -- planning ---------------------------------------------------------------------------------

    def _arena(self, layer: int):
        return self.bundle.arena_block(layer).arena

    def _bundle_bytes(self) -> int:
        """Bytes of one neuron's bundle in the cache: the largest of any layer (layers may keep their
        down columns in different formats)."""
        sizes = []
        for layer in range(self.spec.n_layers):
            parts = {p.name: p.fmt for p in self._arena(layer).parts}
            sizes.append(kernels.bundle_bytes(self.spec.d_model, parts["gate"], parts["up"], parts["down"]))
        return max(sizes)

    def _ffn_norms(self) -> list[str]:
        suffixes = ("ffn_norm.weight", "post_ffw_norm.weight")
        return [f"blk.{i}.{s}" for i in range(self.spec.n_layers) for s in suffixes
                if f"blk.{i}.{s}" in self.source.tensors]

    def _head_tensor(self) -> str:
        return "token_embd.weight" if self.spec.tied_embeddings else "output.weight"

    def fixed_costs(self, capacity: int) -> dict[str, int]:
        spec, out = self.spec, {}
        if self.sparsity is not None:
            out["neuron_caches"] = spec.n_layers * capacity * self._bundle_bytes() + BOUNCE_BYTES \
                + self._bookkeeping_bytes(capacity)
            out["ffn_norms"] = sum(align_up(self.source.tensors[n].nbytes) for n in self._ffn_norms())
        if self.shortlist is not None:
            head = self.source.tensors[self._head_tensor()]
            out["head_shortlist"] = len(self.ids) * (head.nbytes // head.rows) + ROW_READ_BYTES
        return out

    def _bookkeeping_bytes(self, capacity: int) -> int:
        """memory/native/neuron_cache.cpp's other allocations: per layer a slot for every neuron and
        per cached neuron its id and last use; the predictor's outputs for a batch; the active,
        missing and stamp lists (1.5B: about 3 MiB, which the runtime reserve did not hold)."""
        d_ff, batch = self.spec.d_ff, self.weights.options.max_batch
        rank = int(self.calibration.get("predictors", {}).get("rank") or 64)
        per_layer = d_ff * 4 + capacity * (4 + 8)
        return self.spec.n_layers * per_layer + batch * (d_ff + rank) * 4 + 4 * d_ff * 4 + (257 + 64) * 8

    def _chunking(self) -> tuple[int, int]:
        """(neurons per chunk, resident hot neurons per layer) of chunk-aware selection: chunks of at
        least `neuron_chunk` bytes in every layer (the smallest stride decides), and as resident the
        neurons active on at least HOT_FREQUENCY of the calibration tokens (the median layer's count,
        in whole chunks), the arena holding them first."""
        if not self.neuron_chunk or self.sparsity is None:
            return 0, 0
        strides = [self._arena(layer).stride for layer in range(self.spec.n_layers)]
        chunk = max(1, math.ceil(self.neuron_chunk / min(strides)))
        frequency = (self.calibration.get("neurons") or {}).get("frequency")
        resident = 0
        if frequency:
            hot = sorted(int(np.sum(np.asarray(f) >= HOT_FREQUENCY)) for f in frequency)
            resident = hot[len(hot) // 2] // chunk * chunk
        return chunk, resident

    def plan(self, fixed: dict[str, int], threads: int, chunk: int) -> MemoryPlan:
        """The largest neuron cache (up to what the window needs) that leaves a feasible plan."""
        n = self.spec.n_layers
        skip = frozenset(f"layer.{i}.ffn" if self.sparsity is not None else f"layer.{i}.predictor" for i in range(n))
        target = self.spec.d_ff
        if self.sparsity is not None:
            active = max(self.calibration["predictors"].get("predicted_active") or [1.0])
            self.chunk_neurons, self.resident = self._chunking()
            if self.chunk_neurons:  # a fixed share of chunks a token, besides the resident neurons
                active = 1.0 - self.sparsity
            # The union over a window of k tokens grows with k; a quarter of the active set per token is typical.
            target = min(self.spec.d_ff, self.resident + math.ceil(active * self.spec.d_ff * (1 + 0.25 * self.window)))
        capacity, error = target, None
        while True:
            try:
                plan = make_plan(self.layout, self.weights.budget, self.weights.strategy,
                                 {**fixed, **self.fixed_costs(capacity)}, io_threads=threads, chunk_bytes=chunk,
                                 skip=skip, full_head=self.shortlist is None,
                                 head_chunk_limit=self.weights.options.head_chunk)
                break
            except BudgetError as e:
                error = e
                if self.sparsity is None or capacity <= MIN_CAPACITY:
                    raise error from None
                capacity = max(MIN_CAPACITY, capacity * 3 // 4)
        self.capacity = capacity
        self.resident = min(self.resident, capacity // 2 // max(1, self.chunk_neurons) * self.chunk_neurons)
        if self.sparsity is not None:
            plan.notes.append(f"sparse FFN at {self.sparsity:.0%} sparsity: neuron cache of {capacity} of "
                              f"{self.spec.d_ff} neurons per layer, window {self.window} tokens"
                              + (f", chunks of {self.chunk_neurons} neurons ({self.neuron_chunk // 1024} KiB+), "
                                 f"{self.resident} hot neurons resident" if self.chunk_neurons else ""))
        if self.shortlist is not None:
            plan.notes.append(f"approximate head: {len(self.ids)} most frequent tokens of {self.spec.vocab_size}")
        return plan

    def active_fractions(self) -> list[float]:
        """Per layer, the share of neurons the predictor flags at this level: measured at the level it
        was fitted for, scaled by the kept share (1 - sparsity) for the others."""
        pred = self.calibration["predictors"]
        fitted = pred.get("sparsity", 0.5)
        scale = (1.0 - self.sparsity) / max(1e-6, 1.0 - fitted)
        active = pred.get("predicted_active") or [1.0 - fitted] * self.spec.n_layers
        return [min(1.0, a * scale) for a in active]

    def neuron_read_estimate(self) -> float:
        """Expected neuron bytes a token reads with this plan's cache (memory/sparse_cost.py); with
        chunks, the chosen share of each arena besides its resident neurons, in large reads."""
        if self.chunk_neurons:
            keep = 1.0 - self.sparsity
            return float(sum(max(0.0, keep * self.spec.d_ff - self.resident) * self._arena(layer).stride
                             for layer in range(self.spec.n_layers)))
        frequency = (self.calibration.get("neurons") or {}).get("frequency")
        layers = []
        for layer in range(self.spec.n_layers):
            arena, block = self._arena(layer), self.bundle.arena_block(layer)
            order = np.asarray(arena.order, dtype=np.int64)  # arena slot -> neuron
            f = np.asarray(frequency[layer], dtype=np.float64)[order] if frequency else np.ones(len(order))
            layers.append(SparseLayerGeometry(f, arena.stride, block.offset + arena.offset))
        return neuron_read_bytes(layers, self.active_fractions(), self.window, self.capacity)

    # -- loading ----------------------------------------------------------------------------------

    def resident_tensors(self) -> dict[str, Any]:
        """FFN norms (sparse mode reads no FFN block), read once with direct I/O."""
        out = {}
        if self.sparsity is None:
            return out
        fd, _ = open_direct(self.layout.path)
        try:
            for name in self._ffn_norms():
                loc = self.layout.locations[name]
                start = align_down(loc.offset)
                buf = read_range(fd, self.layout.path, start, align_up(loc.offset + loc.nbytes) - start)
                out[name] = self.source.tensors[name].with_bytes_from(buf, loc.offset - start)
        finally:
            os.close(fd)
        return out

    def install(self, native: Any) -> None:
        if self.sparsity is not None:
            cal, spec = self.calibration, self.spec
            targets = cal["sparsity"]["targets"]
            mid = min(range(len(targets)), key=lambda k: abs(targets[k] - cal["predictors"].get("sparsity", targets[k])))
            layers = []
            for layer in range(spec.n_layers):
                arena = self._arena(layer)
                block = self.bundle.arena_block(layer)
                act = cal["sparsity"]["act_threshold"][layer]
                # The predictor's threshold was fitted at the middle level; scale it like the true thresholds.
                scale = act[self.level] / act[mid] if act[mid] > 0 else 1.0
                spec_ = _native.SparseLayerSpec()
                spec_.arena_offset, spec_.stride = block.offset + arena.offset, arena.stride
                order = np.asarray(arena.order, dtype=np.int64)  # arena slot -> neuron
                if sorted(order.tolist()) != list(range(len(order))):
                    raise UserError(f"{self.source.path}: layer {layer}'s arena order is not a permutation of "
                                    "its neurons; the bundle is corrupted")
                spec_.file_slot_of_neuron = np.argsort(order).astype(np.int32).tolist()  # neuron -> arena slot
                spec_.pred_threshold = float(cal["predictors"]["threshold"][layer]) * scale
                # CATS: the kernel skips a neuron whose |act(gate . x)| is under the level's threshold
                spec_.act_threshold = float(act[self.level])
                spec_.down_fmt = next(p.fmt for p in arena.parts if p.name == "down")
                layers.append(spec_)
            parts = {p.name: p.fmt for p in self._arena(0).parts}
            native.set_sparse_ffn(layers, parts["gate"], parts["up"], parts["down"], self.capacity, self.window)
            if self.chunk_neurons:
                native.set_sparse_chunks(self.chunk_neurons, 1.0 - self.sparsity, self.resident)
        if self.shortlist is not None:
            head = self.source.tensors[self._head_tensor()]
            native.set_head_shortlist(self.weights.read_rows(self._head_tensor(), self.ids), head.fmt, self.ids)

    def stats(self, native: Any) -> dict[str, Any]:
        out: dict[str, Any] = {}
        if self.sparsity is not None:
            n = native.neuron_stats()
            out.update({"sparsity": self.sparsity, "window": self.window, "neuron_cache_capacity": self.capacity,
                        "neuron_cache_hit_rate": round(n.hits / n.lookups, 4) if n.lookups else None,
                        "neuron_bytes_read": n.bytes_read, "neurons_loaded": n.loaded,
                        "predicted_active_fraction": round(n.predicted / max(1, n.passes)
                                                           / self.spec.d_ff / self.spec.n_layers, 4),
                        "neuron_reads": n.reads, "neuron_read_median_bytes": median_read_bytes(n.read_pages),
                        "neuron_chunk_neurons": self.chunk_neurons, "resident_neurons": self.resident})
        if self.shortlist is not None:
            out["head_shortlist"] = len(self.ids)
        return out


def median_read_bytes(read_pages: list[int]) -> int | None:
    """The median neuron read in bytes, from the cache's histogram of reads by 4 KiB pages (its last
    entry counts every longer read, so a median there is a lower bound)."""
    total = sum(read_pages)
    if not total:
        return None
    seen = 0
    for pages, count in enumerate(read_pages):
        seen += count
        if 2 * seen >= total:
            return pages * 4096
    return None
