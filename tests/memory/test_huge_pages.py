"""Staging slots in transparent huge pages: a direct read into one is a single scatter-gather
segment, where 4 KiB pages make it hundreds (memory/huge_pages.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import edgeflash as ef
import pytest
from edgeflash.memory import huge_pages
from edgeflash.memory.huge_pages import HUGE_PAGE, staging_arena_bytes, transparent_huge_pages

MiB = 2**20


def test_the_arena_rounds_up_to_huge_pages_when_it_costs_little(monkeypatch):
    monkeypatch.setattr(huge_pages, "transparent_huge_pages", lambda: True)
    assert staging_arena_bytes(int(2 * 1.91 * MiB)) == 4 * MiB  # SmolLM2's two slots at 25%
    assert staging_arena_bytes(15 * MiB) == 16 * MiB
    assert staging_arena_bytes(int(2.1 * MiB)) == int(2.1 * MiB)  # its first 2 MiB are huge already
    assert staging_arena_bytes(1 * MiB) == 1 * MiB  # doubling it costs more than resident bytes gain
    assert staging_arena_bytes(0) == 0
    monkeypatch.setattr(huge_pages, "transparent_huge_pages", lambda: False)
    assert staging_arena_bytes(int(2 * 1.91 * MiB)) == int(2 * 1.91 * MiB)


def plans_with_and_without_huge_pages(monkeypatch, model, budget: str, strategy: str) -> tuple:
    plans = {}
    for available in (False, True):  # left on for the caller
        monkeypatch.setattr(huge_pages, "transparent_huge_pages", lambda: available)
        plans[available] = ef.load(model, memory_budget=budget, strategy=strategy, context_length=256).engine.weights.plan
    return plans[True], plans[False]


def test_the_rounded_arena_is_counted_in_the_budget(monkeypatch, smol_bundle):
    """SmolLM2's two 1.88 MiB slots at a 40 MB budget take 4 MiB, inside the budget; without huge
    pages the same budget plans exactly the slots."""
    rounded, exact = plans_with_and_without_huge_pages(monkeypatch, smol_bundle, "40MB", "flash")
    assert rounded.staging_bytes % HUGE_PAGE == 0 and rounded.staging_bytes > rounded.io.slots * rounded.unit_bytes
    assert exact.staging_bytes == exact.io.slots * exact.unit_bytes and exact.staging_bytes % HUGE_PAGE
    assert rounded.total <= rounded.budget and exact.total <= exact.budget
    assert "in huge pages" in rounded.describe() and "in huge pages" not in exact.describe()


def test_spare_budget_rounds_any_arena_up(monkeypatch):
    """Room no weight group fits in rounds even a one-slot 1 MiB arena (hybrid streaming Gemma 3's
    head) up to a huge page, streaming the same bytes; never past the budget."""
    rounded, exact = plans_with_and_without_huge_pages(monkeypatch, "gemma3-270m", "150MB", "hybrid")
    assert exact.staging_bytes == exact.unit_bytes == 1 * MiB
    assert rounded.staging_bytes == HUGE_PAGE and rounded.unit_bytes == 1 * MiB
    assert rounded.stream_bytes_per_pass == exact.stream_bytes_per_pass and rounded.total <= rounded.budget


SMAPS_SCRIPT = textwrap.dedent("""
    import json, sys
    import edgeflash as ef
    m = ef.load(sys.argv[1], memory_budget=sys.argv[2], strategy=sys.argv[3])
    m.generate("Once upon a time", max_tokens=4)
    advised = huge = 0  # kB over mappings that asked for huge pages ("hg" in VmFlags)
    size = anon_huge = 0
    with open("/proc/self/smaps") as f:
        for line in f:
            key, _, rest = line.partition(":")
            if key == "Size":
                size = int(rest.split()[0])
            elif key == "AnonHugePages":
                anon_huge = int(rest.split()[0])
            elif key == "VmFlags" and "hg" in rest.split():
                advised += size
                huge += anon_huge
    print(json.dumps({"staging": m.engine.weights.plan.staging_bytes, "advised_kb": advised, "huge_kb": huge}))
""")


@pytest.mark.skipif(not transparent_huge_pages(),
                    reason="this kernel hands out no 2 MiB transparent huge pages "
                           "(/sys/kernel/mm/transparent_hugepage/enabled is [never] or missing)")
@pytest.mark.parametrize("strategy", ["flash", "hybrid"])
def test_staging_slots_are_backed_by_huge_pages(strategy, smol_bundle):
    """In a fresh process (numpy's own huge-page advice off, so every advised mapping is ours), the
    staging arena of a SmolLM2 bundle at 40 MB sits in huge pages once reads have filled it: every
    whole 2 MiB of it (the plan rounds the arena up to whole huge pages only where the budget has
    room, and whether it has depends on how the bundle's blocks pack)."""
    env = {**os.environ, "NUMPY_MADVISE_HUGEPAGE": "0"}
    proc = subprocess.run([sys.executable, "-c", SMAPS_SCRIPT, str(smol_bundle), "40MB", strategy],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    staging_kb, whole_huge_kb = out["staging"] // 1024, out["staging"] // HUGE_PAGE * HUGE_PAGE // 1024
    assert whole_huge_kb >= 2048, out
    assert out["advised_kb"] >= staging_kb
    assert out["huge_kb"] >= whole_huge_kb, "the kernel gave 4 KiB pages (memory too fragmented for 2 MiB ones?)"


def test_rounding_never_refuses_a_budget(monkeypatch, smol_bundle):
    """The minimum a refusal names holds the slots unrounded, and a budget of exactly that plans
    (with slots that are not whole huge pages)."""
    from edgeflash.memory.planner import BudgetError, make_plan

    monkeypatch.setattr(huge_pages, "transparent_huge_pages", lambda: True)
    engine = ef.load(smol_bundle, memory_budget="33MB", strategy="flash", context_length=256).engine
    fixed = {k: v for k, v in engine.weights.plan.fixed.items() if k != "runtime_reserve"}
    layout, chunk = engine.weights.layout, engine.head_chunk
    with pytest.raises(BudgetError) as refused:
        make_plan(layout, 20_000_000, "flash", fixed, head_chunk_limit=chunk, io_threads=2, chunk_bytes=1 << 20)
    minimum = refused.value.minimum_bytes
    plan = make_plan(layout, minimum, "flash", fixed, head_chunk_limit=chunk, io_threads=2, chunk_bytes=1 << 20)
    assert plan.total <= minimum and plan.staging_bytes == plan.io.slots * plan.unit_bytes
    assert plan.staging_bytes % HUGE_PAGE  # rounded, it would not have fit
    with pytest.raises(BudgetError):
        make_plan(layout, minimum - 1, "flash", fixed, head_chunk_limit=chunk, io_threads=2, chunk_bytes=1 << 20)
