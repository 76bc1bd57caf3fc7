"""Staging slots in transparent huge pages: a direct read into one is a single scatter-gather
segment, where 4 KiB pages make it hundreds (memory/huge_pages.py)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

import edgeflash as ef
from edgeflash.memory import huge_pages
from edgeflash.memory.huge_pages import HUGE_PAGE, staging_slot_bytes, transparent_huge_pages

MiB = 2**20


def test_slots_round_up_to_huge_pages_only_when_it_costs_little():
    assert staging_slot_bytes(int(1.91 * MiB), huge_pages=True) == 2 * MiB  # SmolLM2's layers at 25%
    assert staging_slot_bytes(15 * MiB, huge_pages=True) == 16 * MiB
    assert staging_slot_bytes(int(2.1 * MiB), huge_pages=True) == int(2.1 * MiB)  # its first 2 MiB are huge already
    assert staging_slot_bytes(1 * MiB, huge_pages=True) == 1 * MiB  # doubling it costs more than it gains
    assert staging_slot_bytes(int(1.91 * MiB), huge_pages=False) == int(1.91 * MiB)
    assert staging_slot_bytes(0, huge_pages=True) == 0


def test_the_rounded_slot_is_counted_in_the_budget(monkeypatch, smol_bundle):
    """The plan holds the slots at their rounded size and still fits the budget; without huge pages
    the same budget plans slots of exactly the largest unit."""
    plans = {}
    for available in (True, False):
        monkeypatch.setattr(huge_pages, "transparent_huge_pages", lambda: available)
        plans[available] = ef.load(smol_bundle, memory_budget="33MB", strategy="flash").engine.plan
    rounded, exact = plans[True], plans[False]
    assert rounded.unit_bytes % HUGE_PAGE == 0
    assert exact.unit_bytes % HUGE_PAGE != 0 and exact.unit_bytes < rounded.unit_bytes
    assert rounded.total <= rounded.budget and exact.total <= exact.budget
    assert rounded.staging_bytes == rounded.io.slots * rounded.unit_bytes


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
    plan = m.engine.plan
    print(json.dumps({"slot": plan.unit_bytes, "slots": plan.io.slots, "advised_kb": advised, "huge_kb": huge}))
""")


@pytest.mark.skipif(not transparent_huge_pages(),
                    reason="this kernel hands out no 2 MiB transparent huge pages "
                           "(/sys/kernel/mm/transparent_hugepage/enabled is [never] or missing)")
@pytest.mark.parametrize("strategy", ["flash", "hybrid"])
def test_staging_slots_are_backed_by_huge_pages(strategy, smol_bundle):
    """In a fresh process (numpy's own huge-page advice off, so every advised mapping is ours), the
    staging slots of a quarter-budget SmolLM2 bundle (1.91 MiB layers) sit in huge pages once reads have filled them."""
    env = {**os.environ, "NUMPY_MADVISE_HUGEPAGE": "0"}
    proc = subprocess.run([sys.executable, "-c", SMAPS_SCRIPT, str(smol_bundle), "33MB", strategy],
                          capture_output=True, text=True, timeout=600, env=env)
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    print(out)
    slots_kb = out["slots"] * out["slot"] // 1024
    assert out["slot"] % HUGE_PAGE == 0
    assert out["advised_kb"] >= slots_kb
    assert out["huge_kb"] >= slots_kb, "the kernel gave 4 KiB pages (memory too fragmented for 2 MiB ones?)"
