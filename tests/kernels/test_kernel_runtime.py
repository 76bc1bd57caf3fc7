"""Dispatch: one table by CPU features, a forced scalar reference, and the thread pool."""

from __future__ import annotations

import platform

import edgeflash.kernels as K
from edgeflash.kernels import _native
import numpy as np


def test_best_level_is_chosen_and_no_kernel_runs_the_reference():
    feats = K.cpu_features()
    levels = K.available_isas()
    assert levels[0] == "ref"
    if platform.machine() == "x86_64" and "avx2" in feats["flags"]:
        assert "avx2" in levels
    K.use_isa("auto")
    assert K.current_isa() == levels[-1]
    if len(levels) > 1:
        on_ref = {name for name, level in K.implementations().items() if level == "ref"}
        # The int8 down-column product exists only where it pays (AVX-512 VNNI); on other levels the
        # engine keeps those columns in float, and only tests call the scalar twin.
        optional = {"columns_q8_q8_0", "columns_q8_packed_q8_0"}
        assert on_ref <= optional, on_ref - optional
        if on_ref:
            assert not _native.prefers_int8_columns("q8_0")


def test_use_isa_ref_switches_every_kernel():
    try:
        K.use_isa("ref")
        impl = K.implementations()
        assert set(impl.values()) == {"ref"} and len(impl) >= 29
    finally:
        K.use_isa("auto")


def test_thread_pool_resizes_and_stays_correct():
    before = K.get_num_threads()
    rng = np.random.default_rng(1)
    q = K.quantize(rng.standard_normal((4096, 256)).astype(np.float32), "q8_0")
    x = rng.standard_normal((2, 256)).astype(np.float32)
    want = K.matmul(q, "q8_0", x)
    try:
        for n in (1, 2, 3, 1, 2):
            K.set_num_threads(n)
            assert K.get_num_threads() == n
            np.testing.assert_array_equal(K.matmul(q, "q8_0", x), want)
    finally:
        K.set_num_threads(before)


def test_kernels_work_in_a_forked_child():
    import os

    rng = np.random.default_rng(2)
    q = K.quantize(rng.standard_normal((4096, 256)).astype(np.float32), "q8_0")
    x = rng.standard_normal((2, 256)).astype(np.float32)
    want = K.matmul(q, "q8_0", x)  # the pool's workers exist now
    pid = os.fork()
    if pid == 0:  # child: single-threaded until asked, then a fresh pool
        ok = np.array_equal(K.matmul(q, "q8_0", x), want)
        K.set_num_threads(2)
        ok = ok and np.array_equal(K.matmul(q, "q8_0", x), want)
        os._exit(0 if ok else 3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0
