"""Loading a model for a run: the engine, its weights and, under a memory budget, every fixed cost
the budget must hold besides the weights (the tokenizer and manifest as measured after opening,
the opening's own peak, a speculative drafter's reserve). The public API only forwards its
arguments here.

Everything a load may need is imported with this module, not inside `load_model`, so that the
memory a budgeted load measures is the model's, not the library's code.
"""

from __future__ import annotations

import gc
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import edgeflash.runtime.bundle  # noqa: F401
import edgeflash.runtime.speculative  # noqa: F401
import edgeflash.runtime.tokenizer  # noqa: F401
from edgeflash.base.errors import UserError
from edgeflash.base.heap import keep_large_allocations_mapped, release_free_heap
from edgeflash.base.rss import current_rss_bytes, peak_rss_bytes, reset_peak_rss
from edgeflash.base.sizes import parse_size
from edgeflash.kernels.formats import KV_FORMATS
from edgeflash.runtime.budgeted import BUDGETED_HEAD_CHUNK, BudgetedWeights
from edgeflash.runtime.native_config import default_context, engine_options
from edgeflash.runtime import sparsity_tuning
from edgeflash.runtime.native_engine import NativeEngine
from edgeflash.runtime.source import ModelSource
from edgeflash.runtime.sources import open_model
from edgeflash.runtime.speculative import make_drafter
from edgeflash.runtime.speculative.budget import speculative_reserve

ENGINES = ("auto", "native", "reference")
ACTIVATIONS = ("q8x2", "q8", "f32")
# Tokens per forward call in a budgeted run: smaller work buffers (prefill runs in more chunks).
BUDGETED_MAX_BATCH = 16


@dataclass
class LoadedModel:
    source: ModelSource
    engine: Any  # NativeEngine or the reference engine
    speculative: str  # the drafter generation uses by default ("none" or a kind)
    drafter: Any = None  # built at load, so its memory is taken (and checked) up front


def load_model(path: str | Path, *, memory_budget: str | int | None = None, threads: int = 2, engine: str = "auto",
               context_length: int | None = None, strategy: str = "flash", activations: str = "q8x2",
               kv_cache: str = "f16", sparsity: float | str | None = None, window: int = 4,
               head_shortlist: int | None = None, speculative: str | None = "none", ffn_fallback: bool = True,
               neuron_chunk: int = 0, requantize: str | None = None) -> LoadedModel:
    """The arguments of `edgeflash.load` (see there), for a resolved path."""
    _check_options(engine, threads, context_length, activations, kv_cache)
    if speculative is None:  # as in generate(): no speculation
        speculative = "none"
    if not isinstance(speculative, str):
        raise UserError(f"speculative = {speculative!r}: expected a drafter name such as 'none', 'lookup' or 'auto'")
    if requantize is not None and (memory_budget is not None or engine == "reference"):
        raise UserError(f"requantize = {requantize!r} converts weights in memory at load, which a "
                        + ("memory budget cannot hold (flash is read as it is): export a bundle with "
                           f"`--quant {requantize}` instead" if memory_budget is not None else
                           "reference engine does not run (it keeps float32 weights): use engine = 'native'"))
    if kv_cache == "kivi2" and speculative != "none":
        raise UserError(f"speculative = {speculative!r} with kv_cache = 'kivi2': a 2-bit KV cache does not verify "
                        "token trees; use kv_cache = 'f16' or 'q8_0' with speculative decoding")
    if memory_budget is not None and engine == "reference":
        raise UserError("memory_budget needs the native engine (the reference runtime keeps every weight in float32)")
    budget = parse_size(memory_budget) if memory_budget is not None else None
    # what every budgeted load of this call shares (measured settings and the final load)
    shared = {"threads": threads, "context_length": context_length, "strategy": strategy,
              "activations": activations, "kv_cache": kv_cache, "head_shortlist": head_shortlist,
              "neuron_chunk": neuron_chunk}
    auto_note = None
    rss_baseline = None  # the RSS a budget is counted from (None: each load's own start)
    if sparsity == "auto" and budget is not None:
        # auto measures settings one after another in this process; what each leaves resident (code
        # it ran, Python heap) stays, so every later load, the final one included, counts from here
        rss_baseline = current_rss_bytes()

        def load_one(s: float | None, k: int) -> LoadedModel:
            return _load_budgeted(path, budget, rss_baseline, sparsity=s, window=k, speculative="none",
                                  ffn_fallback=False, **shared)

        sparsity, window, auto_note = choose_sparsity(path, budget, load_one)
    elif isinstance(sparsity, str):
        raise UserError(f"sparsity = {sparsity!r}: expected a calibrated level such as 0.5, or 'auto' "
                        "(with a memory budget)")
    if budget is None:
        if sparsity is not None or head_shortlist is not None:
            raise UserError("sparsity and head_shortlist are modes of a budgeted run: give memory_budget too")
        source = open_model(path)
        if engine == "reference":
            from edgeflash.runtime.reference import ReferenceEngine

            run = ReferenceEngine(source, context_length=context_length)
        else:
            run = NativeEngine(source, threads=threads, context_length=context_length, activations=activations,
                               kv_format=kv_cache, requantize=requantize)
        return LoadedModel(source, run, speculative, _drafter(speculative, run))
    return _load_budgeted(path, budget, rss_baseline, sparsity=sparsity, window=window, speculative=speculative,
                          ffn_fallback=ffn_fallback, auto_note=auto_note, **shared)


def _load_budgeted(path: str | Path, budget: int, rss_baseline: int | None, *, threads: int,
                   context_length: int | None, strategy: str, activations: str, kv_cache: str,
                   sparsity: float | None, window: int, head_shortlist: int | None, speculative: str,
                   ffn_fallback: bool, neuron_chunk: int, auto_note: str | None = None) -> LoadedModel:
    """A load under `budget` bytes over `rss_baseline` (None: the RSS when this load starts)."""
    keep_large_allocations_mapped()  # freed temporaries leave the process instead of the heap
    before = current_rss_bytes()
    left_by_earlier_loads = 0 if rss_baseline is None else max(0, before - rss_baseline)
    # Building the tokenizer makes temporaries several times the size of what it keeps. They are
    # freed before any weight loads, but the budget covers loading too, so the plan is told this
    # peak. (Measuring it resets the process's peak-RSS mark, which restarts at the current RSS.)
    peak_measured = reset_peak_rss()
    source = open_model(path, verify=False)  # checksums are verified with direct I/O while loading
    # The tokenizer builds its tables on first use: build them now, free what parsing left behind,
    # and count what stays (tokenizer and manifest) as a fixed cost of the budget.
    source.tokenizer.decode(source.tokenizer.encode("warm up the tokenizer"))
    gc.collect()
    release_free_heap()
    # Tensors the loader rewrote (llama q/k rows from a GGUF) are in that delta too; the plan
    # counts them as pinned weights.
    rewritten = sum(source.tensors[n].nbytes for n in source.info.get("rewritten_tensors", []))
    fixed = {"tokenizer_and_manifest": max(0, current_rss_bytes() - before - rewritten)}
    if left_by_earlier_loads:
        fixed["left_by_earlier_loads"] = left_by_earlier_loads
    opening_peak = peak_rss_bytes() - before if peak_measured else 0
    if context_length is None:
        context_length = default_context(source.spec, budget, kv_format=kv_cache)
    options = engine_options(source.spec, context_length=context_length, max_batch=BUDGETED_MAX_BATCH,
                             kv_format=kv_cache, activations=activations, head_chunk=BUDGETED_HEAD_CHUNK)
    if speculative != "none":  # a draft model's share depends on what the target needs at the least
        fixed["speculative"] = speculative_reserve(speculative, source, context_length, kv_cache, budget=budget,
                                                   options=options, fixed=fixed, strategy=strategy)
    weights = BudgetedWeights(source, budget=budget, options=options, strategy=strategy, fixed_costs=fixed,
                              opening_peak=opening_peak, sparsity=sparsity, window=window,
                              head_shortlist=head_shortlist, fallback=ffn_fallback, neuron_chunk=neuron_chunk,
                              panels=True)
    if auto_note:
        weights.plan.notes.append(auto_note)
    run = NativeEngine(source, weights=weights, threads=threads, options=options)
    drafter = _drafter(speculative, run)
    if drafter is not None:
        weights.check_reserve("speculative", drafter.memory_bytes())
    return LoadedModel(source, run, speculative, drafter)


def choose_sparsity(path: str | Path, budget: int, load_one: Any) -> tuple[float | None, int, str]:
    """`sparsity="auto"`: the bundle's calibrated levels, measured at this budget (runtime/sparsity_tuning.py)."""
    source = open_model(path, verify=False)
    if source.kind != "bundle":
        raise UserError(f"{path}: --ffn-sparsity auto needs a bundle made by `edgeflash export`")
    levels = list((source.info["manifest"].get("calibration") or {}).get("sparsity", {}).get("targets", []))
    weights_path = source.info["bundle"].weights_path
    del source
    gc.collect()
    release_free_heap()  # what opening it parsed leaves the process before the first measured load
    return sparsity_tuning.choose(weights_path, budget, levels, load_one)


def _check_options(engine: str, threads: int, context_length: int | None, activations: str, kv_cache: str) -> None:
    if engine not in ENGINES:
        raise UserError(f"engine = {engine!r}: expected one of {', '.join(ENGINES)}")
    if threads < 1:
        raise UserError(f"threads = {threads}: expected an integer >= 1")
    if context_length is not None and context_length < 2:
        raise UserError(f"context_length = {context_length}: expected an integer >= 2")
    if activations not in ACTIVATIONS:
        raise UserError(f"activations = {activations!r}: expected {', '.join(ACTIVATIONS)}")
    if kv_cache not in KV_FORMATS:
        raise UserError(f"kv_cache = {kv_cache!r}: expected {', '.join(KV_FORMATS)}")
    if engine == "reference" and kv_cache != "f16":
        raise UserError(f"kv_cache = {kv_cache!r} needs the native engine (the reference runtime keeps its cache "
                        "in float32)")


def _drafter(kind: str, engine: Any) -> Any:
    """The drafter of `kind`, built now: a bad option fails at load, and its memory is taken up front."""
    if kind == "none":
        return None
    if not hasattr(engine, "forward_tree"):
        raise UserError(f"speculative decoding needs the native engine, not {engine.name!r}")
    return make_drafter(kind, engine)
