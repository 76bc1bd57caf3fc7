"""Shared fixtures: the two real models and their transformers references (loaded once)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

# `python -m pytest` puts the repository root on sys.path, where the top-level folder `kernels/`
# would shadow the `kernels` package transformers probes for (and load our extension twice).
REPO = Path(__file__).resolve().parent.parent
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != REPO]

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
# Two test workers share two cores. Threads of torch's OpenMP pool and of numpy's OpenBLAS that
# wait for work sleep at once instead of spinning, which takes the core the other worker needs:
# torch- and numpy-heavy tests run in about 30% less time while the other worker is busy, in the
# same time alone. The thread counts, and so the results, stay the same. Set here, before either
# library is loaded (they read these when they load), and inherited by the tests' subprocesses.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
os.environ.setdefault("OPENBLAS_THREAD_TIMEOUT", "4")  # the minimum: 2^4 cycles of spinning

REAL_MODELS = ("gemma3-270m", "smollm2-135m")


@pytest.fixture(scope="session")
def model_path():
    from edgeflash.base.models import resolve_model

    return lambda alias: resolve_model(alias)


@pytest.fixture(scope="session")
def gemma_path() -> Path:
    from edgeflash.base.models import resolve_model

    return resolve_model("gemma3-270m")


@pytest.fixture(scope="session")
def smollm_path() -> Path:
    from edgeflash.base.models import resolve_model

    return resolve_model("smollm2-135m")


def _export_bundle(tmp_path_factory, alias: str, name: str) -> Path:
    """A bundle of a real model, exported once per session with a small calibration (the export
    tests cover full-size calibration and the quality report). Test workers (pytest-xdist) share
    it: the first to need it exports it (15-25 s) under a lock, the others read it. Tests only
    read bundles; one that changes a bundle copies it first."""
    import fcntl
    import shutil
    import subprocess
    import sys

    base = tmp_path_factory.getbasetemp()
    if os.environ.get("PYTEST_XDIST_WORKER"):
        base = base.parent  # the run's temporary directory, which holds each worker's own
    shared = base / "shared-bundles"
    shared.mkdir(exist_ok=True)
    out = shared / name
    with open(shared / f"{name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not out.exists():
            part = shared / f"{name}.part"
            shutil.rmtree(part, ignore_errors=True)  # left by a worker that failed
            subprocess.run([sys.executable, "-m", "edgeflash.cli.main", "export", alias, "-o", str(part), "--quant",
                            "q4_0", "--calibration-tokens", "512", "--eval-tokens", "0", "--no-baseline", "--quiet"],
                           check=True, capture_output=True, timeout=900)
            part.rename(out)
    return out


@pytest.fixture(scope="session")
def smol_bundle(tmp_path_factory) -> Path:
    return _export_bundle(tmp_path_factory, "smollm2-135m", "smollm2-q4_0")


@pytest.fixture(scope="session")
def gemma_bundle(tmp_path_factory) -> Path:
    return _export_bundle(tmp_path_factory, "gemma3-270m", "gemma3-q4_0")


@pytest.fixture(autouse=True)
def _speculative_state(tmp_path_factory, monkeypatch):
    """Each test learns speculation afresh: what runs learned is kept between them on disk
    (runtime/speculative/learned.py), which would make one test's choices depend on another's."""
    monkeypatch.setenv("EDGEFLASH_SPECULATIVE_STATE", str(tmp_path_factory.mktemp("speculative-state")))


# Test files that take a minute or more on the 2-core CI machine, with their seconds there. With
# `-n 2 --dist loadfile` pytest-xdist hands out whole files, by default those with the most tests
# first, which leaves these (few tests each: exports, the C++ suites) for the end: one of them then
# keeps a worker busy for minutes after the other has run out of files. They go first instead, the
# longest first, and the many short files even out the end of the run.
HEAVY_FILES = {
    "tests/targets/test_target_executorch.py": 520,
    "tests/kernels/test_cpp_suite.py": 280,
    "tests/runtime/test_speculative.py": 210,
    "tests/targets/test_target_onnx.py": 200,
    "tests/runtime/test_real_model_parity.py": 200,
    "tests/memory/test_sparse_fallback.py": 175,
    "tests/runtime/test_native_engine.py": 105,
    "tests/export/test_export_kill.py": 95,
    "tests/fuzz/test_gguf_fuzz.py": 80,
    "tests/memory/test_budget.py": 75,
    "tests/targets/test_target_coreml.py": 70,
    "tests/kernels/test_kernel_linear.py": 65,
    "tests/export/test_export_gemma.py": 45,
    "tests/export/test_export_smollm.py": 45,
    "tests/export/test_export_cli.py": 40,
}


@pytest.hookimpl(optionalhook=True)  # a hook of pytest-xdist: unknown to pytest without it
def pytest_xdist_make_scheduler(config, log):
    """--dist loadfile with HEAVY_FILES handed out first (the other files in xdist's own order)."""
    if config.getvalue("dist") != "loadfile":
        return None
    from collections import OrderedDict

    from xdist.scheduler import LoadFileScheduling

    class HeavyFilesFirst(LoadFileScheduling):
        def _assign_work_unit(self, node):
            # The queue is complete when the first unit is assigned; sorting keeps xdist's order
            # among the files not listed.
            if not getattr(self, "_heavy_first", False):
                self._heavy_first = True
                self.workqueue = OrderedDict(sorted(self.workqueue.items(),
                                                    key=lambda item: -HEAVY_FILES.get(item[0], 0)))
            super()._assign_work_unit(node)

    return HeavyFilesFirst(config, log)
