"""The bundle mutator on a real bundle: each seed gives the same mutation every time, and applying
it changes the directory the way it says; and seeded bundle mutations run through the real
command line (plain, budgeted and sparse generate, inspect, one per case in turn) all end cleanly:
exit 2 with one line, or a correct run, never a traceback, a hang, a signal, raw bytes, a changed
byte accepted or other output from a bundle that must print the original's. The scale run is
benchmarks/fuzz/run_fuzz.py --bundles (benchmarks/fuzz/campaign.sh)."""

from __future__ import annotations

import filecmp
import shutil
import sys
from collections import Counter
from pathlib import Path

from bundle_mutator import SAME, BundleModel, mutate_bundle
from fuzz_harness import BUNDLE_RUN_KINDS, BundleTarget, Harness, _copy_bundle, scratch_dir, summarize

RUN_CASES, RUN_SEED = 60, 11

SEEDS = range(40)


def test_mutations_are_deterministic_and_change_the_bundle(smol_bundle):
    model = BundleModel(smol_bundle)
    work = scratch_dir()
    try:
        ops = set()
        for seed in SEEDS:
            first, again = mutate_bundle(model, seed), mutate_bundle(model, seed)
            assert (first.op, first.detail, first.expect) == (again.op, again.detail, again.expect)
            copy = _copy_bundle(smol_bundle, work / f"seed{seed}")
            first.apply(copy)
            names = sorted(p.name for p in copy.iterdir())
            changed = names != sorted(p.name for p in smol_bundle.iterdir()) or any(
                not (copy / name).is_file() or (copy / name).is_symlink()
                or not filecmp.cmp(copy / name, smol_bundle / name, shallow=False) for name in names)
            assert changed or first.expect == SAME, (first.op, first.detail)
            ops.add(first.op)
            shutil.rmtree(copy)
        assert len(ops) >= 8, ops
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_bundle_mutations_end_cleanly(smol_bundle):
    work = scratch_dir()
    try:
        harness = Harness(str(Path(sys.executable).parent / "edgeflash"), work, timeout=120, runs=BUNDLE_RUN_KINDS,
                          rotate=True, fork=True)
        seeds = [(case, RUN_SEED * 1_000_003 + case) for case in range(RUN_CASES)]
        outcomes = harness.run(BundleTarget("smollm2-135m-q4_0", smol_bundle, "60MB"), seeds, workers=2)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    failures = [o for o in outcomes if o.failed]
    report = "\n".join(f"case {o.case} (seed {o.seed}) {o.run}: {o.klass} [{o.op}: {o.detail}] {o.stderr[-400:]}"
                       for o in failures)
    assert not failures, f"{len(failures)} of {len(outcomes)} runs failed:\n{report}"
    classes = Counter(o.klass for o in outcomes)
    assert classes["clean_error"] > len(outcomes) // 2 and classes["ran"] > 0, summarize(outcomes)
