"""The bundle mutator on a real bundle: each seed gives the same mutation every time, and applying
it changes the directory the way it says. (Running edgeflash on mutated bundles is
benchmarks/fuzz/run_fuzz.py --bundles: until every byte a bundle run uses is checksummed, those
runs are kept out of the test suite.)"""

from __future__ import annotations

import filecmp
import shutil

from bundle_mutator import SAME, BundleModel, mutate_bundle
from fuzz_harness import _copy_bundle, scratch_dir

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
