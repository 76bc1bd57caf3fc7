"""The memory planner: one byte budget split between fixed costs, resident weights and the
staging buffers that streamed weights pass through.

Fixed costs are what the run needs whatever the weights do: KV cache, activations, logits, the
tokenizer, and a stated reserve for the interpreter's own allocations during a run. The rest of
the budget holds weights; what does not fit is read from flash for every forward pass.

Strategies (for comparison, `--strategy`):
  naive   nothing resident that need not be; every streamed unit read whole, synchronously.
  hybrid  resident weights in execution order until the budget is full, the rest read whole and
          synchronously each token (the baseline of "LLM in a flash").
  flash   residency by cost per byte (small groups first: they stream worst), the streamed groups
          spread through the pass, chunked reads on several I/O threads, and prefetch so reading
          overlaps compute.
"""

from __future__ import annotations

import os
from dataclasses import asdict, dataclass, field

from edgeflash.base.errors import UserError
from edgeflash.base.sizes import format_size
from edgeflash.memory.huge_pages import fills_huge_pages, staging_arena_bytes, whole_huge_pages
from edgeflash.memory.io_profile import DEFAULT_CHUNK, DEFAULT_THREADS
from edgeflash.memory.layout import ALIGN, WeightGroup, WeightLayout, align_up, layer_units

STRATEGIES = ("naive", "hybrid", "flash")

# Allocations a run makes besides the ones the plan lists: kernel scratch and quantized
# activations, thread stacks touched by the pools, Python objects created per call, the
# embedding-row page buffer. Measured at 3-6 MiB on both real models; 8 MiB is the allowance.
RUNTIME_RESERVE = 8 * 2**20
MIN_HEAD_CHUNK = 1 * 2**20
MIN_READ = 64 * 2**10  # smaller direct reads cost more per byte than parallelism gains
MAX_PREFETCH_SLOTS = 16  # deeper is no use here: a token computes in 6-12 ms, ~10 MB of reads at 1 GB/s


class BudgetError(UserError):
    """The budget cannot hold even the minimum a run needs (`minimum_bytes` when it is known)."""

    def __init__(self, message: str, minimum_bytes: int | None = None):
        super().__init__(message)
        self.minimum_bytes = minimum_bytes


@dataclass
class IoSettings:
    threads: int
    chunk_bytes: int
    slots: int
    prefetch: bool


@dataclass
class MemoryPlan:
    budget: int
    strategy: str
    fixed: dict[str, int]
    resident: list[str]
    streamed: list[str]
    resident_bytes: int
    staging_bytes: int
    head_chunk_rows: int  # rows per streamed head chunk (0 = head resident)
    io: IoSettings
    stream_bytes_per_pass: int  # flash bytes a forward pass reads (layers, plus the head when it needs logits)
    unit_bytes: int  # one staging slot: the largest unit a pass streams (the slots share one arena)
    notes: list[str] = field(default_factory=list)
    # Bytes of another engine's staging arena this plan streams through (a draft model's target's;
    # 0: an arena of its own). They cost it nothing (staging_bytes is 0), and there its first
    # streamed units keep their place while it computes (memory/native/streaming.h).
    borrowed_staging: int = 0

    @property
    def fixed_bytes(self) -> int:
        return sum(self.fixed.values())

    @property
    def total(self) -> int:
        return self.fixed_bytes + self.resident_bytes + self.staging_bytes

    def to_dict(self) -> dict:
        d = asdict(self)
        d["total"] = self.total
        return d

    def describe(self) -> str:
        lines = [f"memory plan ({self.strategy}): budget {format_size(self.budget)}, planned {format_size(self.total)}"]
        for name, n in self.fixed.items():
            lines.append(f"  {name:<18} {format_size(n):>12}")
        lines.append(f"  {'resident weights':<18} {format_size(self.resident_bytes):>12}  ({len(self.resident)} groups)")
        where = " in the lender's arena" if self.borrowed_staging else \
            (" in huge pages" if fills_huge_pages(self.staging_bytes) else "")
        lines.append(f"  {'staging buffers':<18} {format_size(self.staging_bytes):>12}  ({self.io.slots} x "
                     f"{format_size(self.unit_bytes)}{where}, "
                     f"{self.io.threads} I/O threads, {format_size(self.io.chunk_bytes)} reads"
                     f"{', prefetch' if self.io.prefetch else ''})")
        lines.append(f"  streamed: {len(self.streamed)} groups, {format_size(self.stream_bytes_per_pass)} per token")
        lines.extend(f"  note: {n}" for n in self.notes)
        return "\n".join(lines)


def make_plan(layout: WeightLayout, budget: int, strategy: str, fixed: dict[str, int], *, head_chunk_limit: int,
              io_threads: int = DEFAULT_THREADS, chunk_bytes: int = DEFAULT_CHUNK, skip: frozenset[str] = frozenset(),
              full_head: bool = True, lent_staging: int = 0) -> MemoryPlan:
    """`fixed`: what the run needs besides weights (KV cache, activations, logits, tokenizer...);
    `head_chunk_limit`: the engine's rows per logits pass, the most a streamed head chunk may hold;
    `io_threads`, `chunk_bytes`: the device's best read depth and size (`edgeflash probe-io`);
    `skip`: groups the run never reads per token (the dense FFN in sparse mode); `full_head`
    False: an approximate head replaces the full one (its rows are a fixed cost); `lent_staging`:
    the bytes of a staging arena another engine lends (a draft model's target, which computes in
    turn with it): where two of this plan's units fit in it, its slots are there and cost nothing."""
    if strategy not in STRATEGIES:
        raise UserError(f"strategy = {strategy!r}: expected one of {', '.join(STRATEGIES)}")
    args = (layout, budget, strategy, fixed, io_threads, chunk_bytes, skip, full_head, head_chunk_limit)
    if strategy != "flash":
        return _round_staging_to_huge_pages(_plan(*args, slots=1))
    if lent_staging:
        plan = _plan(*args, slots=2, lent=lent_staging)
        if plan.borrowed_staging:
            return _shape_reads(plan, io_threads, chunk_bytes)
    # Prefetch needs at least two staging slots; a third lets reads run two units ahead, but under
    # a tight budget its bytes are worth more as resident weights. Keep whichever reads less per
    # token (the deeper prefetch on a tie).
    plans = []
    for slots in (3, 2):
        try:
            plans.append(_plan(*args, slots=slots))
        except BudgetError as e:
            error = e
    if not plans:
        raise error
    plan = _deepen_prefetch(min(plans, key=lambda p: p.stream_bytes_per_pass))
    return _shape_reads(_round_staging_to_huge_pages(plan), io_threads, chunk_bytes)


def _deepen_prefetch(plan: MemoryPlan) -> MemoryPlan:
    """Budget no weight group fits in becomes extra staging slots: reads then run further ahead
    of compute (a model that keeps every layer and streams only its head in small units gains the
    most). Residency is decided first, so this never streams more."""
    if not plan.io.prefetch or not plan.staging_bytes:
        return plan
    room = plan.budget - plan.fixed_bytes - plan.resident_bytes
    while plan.io.slots < MAX_PREFETCH_SLOTS and staging_arena_bytes(plan.unit_bytes * (plan.io.slots + 1)) <= room:
        plan.io.slots += 1
        plan.staging_bytes = plan.unit_bytes * plan.io.slots
    return plan


def _round_staging_to_huge_pages(plan: MemoryPlan) -> MemoryPlan:
    """The one place the staging arena is rounded up to whole huge pages (memory/huge_pages.py):
    whenever the budget has the room once everything else is decided, however much that adds (a
    1 MiB slot then sits in a huge page too). Residency already gave way where that cost little."""
    rounded = whole_huge_pages(plan.staging_bytes)
    if plan.total + rounded - plan.staging_bytes <= plan.budget:
        plan.staging_bytes = rounded
    return plan


def _shape_reads(plan: MemoryPlan, threads: int, chunk_bytes: int) -> MemoryPlan:
    """The streamed reads' size and I/O threads, once the slots are known (`split_reads`)."""
    if plan.io.prefetch:
        plan.io.threads, plan.io.chunk_bytes = split_reads(chunk_bytes, plan.unit_bytes, threads,
                                                           units_in_flight=plan.io.slots - 1)
    return plan


def _plan(layout: WeightLayout, budget: int, strategy: str, fixed: dict[str, int],
          io_threads: int, chunk_bytes: int, skip: frozenset[str], full_head: bool, head_chunk_limit: int,
          slots: int, lent: int = 0) -> MemoryPlan:
    fixed = dict(fixed)
    fixed["runtime_reserve"] = RUNTIME_RESERVE
    groups = layout.groups
    pinned = sum(layout.locations[n].nbytes for g in groups.values() for n in g.pinned)
    globals_bytes = sum(align_up(layout.locations[n].nbytes) for n in groups["globals"].tensors) \
        if "globals" in groups else 0
    fixed["pinned_weights"] = pinned + globals_bytes
    head_name = "head" if "head" in groups else "embedding"  # a tied head is the embedding table
    if not full_head:
        head_name = None

    # Candidates in execution order: every layer's groups, then the head.
    order = [g.name for i in range(layout.n_layers) for g in layout.layer_groups(i) if g.name not in skip]
    if head_name:
        order.append(head_name)
    if head_name != "embedding" and "embedding" in groups:
        order.insert(0, "embedding")  # a table that only serves rows: cheap to stream, last to keep
    flash = strategy == "flash"
    io = IoSettings(threads=io_threads if flash else 1, chunk_bytes=chunk_bytes, slots=slots, prefetch=flash)

    # a plan that may borrow an arena reads layers in parts always: smaller units pack closer there
    whole_below = 0 if lent else None

    def staging(resident: set[str]) -> tuple[int, int]:
        """The slots' bytes, and one slot: the largest unit (a streamed head chunk spans as much)."""
        unit = _largest_unit(layout, resident, skip, head_name, whole_below)
        return unit * io.slots, unit

    def fits_lent(unit: int) -> bool:
        """Whether slots of `unit` bytes fit in the lent arena (two of them at the least)."""
        return 0 < unit and 2 * unit <= lent

    def own_staging(resident: set[str]) -> int:
        """The slots' bytes this plan pays for: none where they fit in the lent arena."""
        slots_bytes, unit = staging(resident)
        return 0 if fits_lent(unit) else slots_bytes

    fixed_total = sum(fixed.values())
    minimum = fixed_total + own_staging(set())  # rounding up to huge pages is never what refuses
    if minimum > budget:
        raise BudgetError(
            f"memory budget {format_size(budget)} is too small for this model: at least {format_size(minimum)} "
            f"is needed ({', '.join(f'{k} {format_size(v)}' for k, v in fixed.items())}, "
            f"staging {format_size(own_staging(set()))}); raise --memory-budget or shorten the context", minimum)

    def cost(resident: set[str]) -> int:
        """With the arena rounded up to huge pages where that costs little: residency gives way to it."""
        return fixed_total + sum(groups[n].nbytes for n in resident) + staging_arena_bytes(own_staging(resident))

    resident: set[str] = set()
    if strategy != "naive":
        # Small groups first (they stream worst per byte); a separate embedding table last of all,
        # as streaming it costs one page per token, not its size.
        rows_only = "embedding" if head_name != "embedding" else None
        candidates = order if strategy == "hybrid" else \
            sorted(order, key=lambda n: (n == rows_only, groups[n].nbytes, order.index(n)))
        for name in candidates:
            if cost(resident | {name}) <= budget:
                resident = resident | {name}
            elif strategy == "hybrid":
                break  # hybrid keeps a prefix of the execution order
    if flash:
        spread = _spread_streamed(resident, order, groups)
        if cost(spread) <= budget and staging(spread)[0] <= staging(resident)[0]:
            resident = spread
    staging_bytes, unit_bytes = staging(resident)  # make_plan rounds it up where the budget has room
    lends = lent if fits_lent(unit_bytes) else 0
    if lends:  # as many units as the lent arena holds: reads are shaped for that many in flight
        io.slots, staging_bytes = lent // unit_bytes, 0
    head_chunk_rows = 0
    if head_name and head_name not in resident:
        row_bytes = layout.locations[groups[head_name].tensors[0]].nbytes // layout.head_rows
        # at most the engine's logits pass (EngineOptions::head_chunk), whose buffers are sized for it
        # a chunk's rows start and end mid-page: their aligned span is up to two pages more
        head_chunk_rows = max(1, min(layout.head_rows, head_chunk_limit, (unit_bytes - 2 * ALIGN) // row_bytes))
    streamed = [n for n in order if n not in resident]
    # An embedding table serves one row per token; as the tied head it is read whole every pass.
    per_pass = sum(groups[n].nbytes for n in streamed if n != "embedding" or n == head_name)
    plan = MemoryPlan(budget=budget, strategy=strategy, fixed=fixed, resident=[n for n in order if n in resident],
                      streamed=streamed, resident_bytes=sum(groups[n].nbytes for n in resident),
                      staging_bytes=staging_bytes, head_chunk_rows=head_chunk_rows, io=io,
                      stream_bytes_per_pass=per_pass, unit_bytes=unit_bytes, borrowed_staging=lends)
    if lends:
        plan.notes.append(f"streams through {format_size(lent)} of the target's staging arena: its first "
                          "streamed units stay there while this model computes")
    if "embedding" in streamed:
        plan.notes.append("embedding rows are read on demand (one 4 KiB page per token)")
    return plan


def _largest_unit(layout: WeightLayout, resident: set[str], skip: frozenset[str], head_name: str | None,
                  whole_below: int | None = None) -> int:
    """One staging slot: the largest read unit of the streamed layer groups (a part of the block,
    `layer_units`), or a streamed head chunk's span."""
    def layer_unit(i: int) -> int:
        streamed = [g for g in layout.layer_groups(i) if g.name not in resident and g.name not in skip]
        return max((u.nbytes for u in layer_units(layout, streamed, whole_below)), default=0)

    unit = max([layer_unit(i) for i in range(layout.n_layers)] + [0])
    if head_name is not None and head_name not in resident:
        unit = max(unit, MIN_HEAD_CHUNK)
    return unit


def lendable_staging(layout: WeightLayout, skip: frozenset[str] = frozenset()) -> int:
    """The staging arena a flash plan of `layout` (its full head streamed too) holds at its
    minimum, with nothing resident: two slots of its largest unit. A draft model streams through
    its target's arena (`make_plan(lent_staging=...)`) only when the target is at its minimum: any
    budget left over goes to the draft model first."""
    head_name = "head" if "head" in layout.groups else "embedding"
    return 2 * _largest_unit(layout, set(), skip, head_name)


def _spread_streamed(resident: set[str], order: list[str], groups: dict[str, WeightGroup]) -> set[str]:
    """About the same bytes resident, but among like layer groups (the same kind, sizes within 2%)
    the streamed ones spread evenly through the pass, the first at its start.

    With prefetch, reads stop whenever every staging slot holds a unit compute has not reached.
    Streaming the last layers (the greedy's choice) leaves the first ones, all resident, computing
    with nothing to read: the slots already hold the first streamed units, loaded while the
    previous token's head ran. Spread out, every resident stretch overlaps a read."""
    spread = set(resident)
    for members in _like_groups(order, groups):
        n, k = len(members), sum(1 for m in members if m not in resident)
        if 0 < k < n:
            streamed = {members[i * n // k] for i in range(k)}
            spread -= set(members)
            spread |= {m for m in members if m not in streamed}
    return spread


def _like_groups(order: list[str], groups: dict[str, WeightGroup]) -> list[list[str]]:
    """Layer groups of one kind ("ffn", "attention", whole layers) whose sizes are within 2% of the
    smallest, each list in execution order. Alignment makes equal layers differ by a page or so."""
    kinds: dict[str, list[str]] = {}
    for name in order:
        layer = groups[name].layer
        if layer is not None:  # "layer.3.ffn" is of kind ".ffn", a whole "layer.3" of kind ""
            kinds.setdefault(name.removeprefix(f"layer.{layer}"), []).append(name)
    classes = []
    for names in kinds.values():
        by_size = sorted(names, key=lambda n: groups[n].nbytes)
        current: list[str] = []
        for name in by_size:
            if current and groups[name].nbytes > 1.02 * groups[current[0]].nbytes:
                classes.append(current)
                current = []
            current.append(name)
        classes.append(current)
    return [sorted(c, key=order.index) for c in classes]


def split_reads(chunk_bytes: int, unit_bytes: int, threads: int, cores: int | None = None,
                units_in_flight: int = 1) -> tuple[int, int]:
    """(I/O threads, read size) for streaming units of `unit_bytes` with prefetch; `chunk_bytes` and
    `threads` are the device's best read size and depth (`edgeflash probe-io`).

    With one unit in flight (two staging slots, a tight budget) every unit is split into the same
    number of equal reads per thread, so that all of them are busy to the end, and there are no
    more I/O threads than cores. Reads stay near the device's best size: one per thread, or as
    many per thread as the unit needs (a 2.1 MiB unit on 2 threads against a 1 MiB best is two
    reads of 1.06 MiB, not three of 0.71 with one thread idle for the last).

    With more units in flight each unit is read whole (up to the device's best read size) and
    there are as many I/O threads as reads in flight, up to the device's depth: a thread waiting
    on a read takes no core, and more reads in flight keep a flash device's queue full.
    docs/memory-budget.md has the measurements behind both rules."""
    if units_in_flight <= 1:
        threads = max(1, min(threads, cores or os.cpu_count() or 1))
        reads_per_thread = max(1, round(unit_bytes / (threads * chunk_bytes)))
        return threads, max(MIN_READ, align_up(-(-unit_bytes // (threads * reads_per_thread))))
    read = max(MIN_READ, min(chunk_bytes, align_up(unit_bytes)))
    return max(1, min(threads, units_in_flight * -(-unit_bytes // read))), read
