"""Fixtures for the kernel tests: every instruction-set level this CPU has, at 1 and 2 threads."""

from __future__ import annotations

import edgeflash.kernels as K
import numpy as np
import pytest


@pytest.fixture(params=K.available_isas())
def isa(request):
    """Runs the test once per level (ref included), restoring the automatic choice afterwards."""
    K.use_isa(request.param)
    yield request.param
    K.use_isa("auto")


@pytest.fixture(params=[1, 2])
def threads(request):
    before = K.get_num_threads()
    K.set_num_threads(request.param)
    yield request.param
    K.set_num_threads(before)


@pytest.fixture
def rng():
    return np.random.default_rng(0)
