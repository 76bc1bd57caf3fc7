"""Seeded GGUF mutations run through the real command line: every run must end cleanly (exit 2
with one line, or a correct run), never with a traceback, a hang, a signal, raw bytes on the
terminal, an invalid file accepted, or output from bytes the file does not hold for that tensor.

The scale run (thousands of cases, every run kind per case) is benchmarks/fuzz/run_fuzz.py
(`make fuzz`); here each case runs one of generate, budgeted generate and inspect in turn.
"""

from __future__ import annotations

import shutil
import sys
from collections import Counter
from pathlib import Path

import pytest
from fuzz_harness import Harness, Target, scratch_dir, summarize
from fuzz_tiny_gguf import build_tiny_gguf

# (cases, first seed): the same cases on every run; `make fuzz` runs thousands more.
CASES = {"tiny": 150, "smollm2-135m": 90}
SEED = 7


@pytest.fixture(scope="module")
def work():
    path = scratch_dir()
    yield path
    shutil.rmtree(path, ignore_errors=True)


@pytest.mark.parametrize("name", list(CASES))
def test_gguf_mutations_end_cleanly(name, work, smollm_path):
    path = build_tiny_gguf(smollm_path, work / "tiny.gguf") if name == "tiny" else smollm_path
    budget = {"tiny": "30MB", "smollm2-135m": "60MB"}[name]
    harness = Harness(str(Path(sys.executable).parent / "edgeflash"), work, timeout=120, rotate=True, fork=True)
    seeds = [(case, SEED * 1_000_003 + case) for case in range(CASES[name])]
    outcomes = harness.run(Target(name, path, budget), seeds, workers=2)
    failures = [o for o in outcomes if o.failed]
    report = "\n".join(f"case {o.case} (seed {o.seed}) {o.run}: {o.klass} [{o.op}: {o.detail}] {o.stderr[-400:]}"
                       for o in failures)
    assert not failures, f"{len(failures)} of {len(outcomes)} runs failed:\n{report}"
    # The cases reach both sides: files refused and files that run.
    classes = Counter(o.klass for o in outcomes)
    assert classes["clean_error"] > len(outcomes) // 2 and classes["ran"] > 10, summarize(outcomes)
