"""Each native kernel swapped into the numpy reference forward pass, on the real models: with
one op switched the logits stay within float tolerance of the pure-numpy pass; with every op
switched (and Q8 activations) the top-1 token still agrees almost everywhere."""

from __future__ import annotations

import numpy as np
import pytest
from edgeflash.export.corpus import heldout_windows
from edgeflash.runtime.reference import ReferenceEngine
from edgeflash.runtime.reference.kernel_ops import KERNEL_OPS, KernelOps
from edgeflash.runtime.sources import open_model

# Relative to the largest |logit|. Each swapped op differs from numpy only in float32 rounding
# (attention's f16 cache is reproduced by the reference's kv_dtype="f16"), but 18-30 layers
# amplify any rounding difference: measured 1.5e-4 .. 4e-4 for every op, so 1e-3 is the bound.
TOLERANCE = 1e-3


@pytest.fixture(scope="module", params=["smollm2-135m", "gemma3-270m"])
def case(request, model_path):
    source = open_model(model_path(request.param))
    ids = source.tokenizer.encode(heldout_windows(1, chars_per_window=600, offset_chars=90_000)[0])[:96]
    expected = ReferenceEngine(source, kv_dtype="f16").forward(ids, all_logits=True)
    return request.param, source, ids, expected


@pytest.mark.parametrize("op", KERNEL_OPS)
def test_one_kernel_op_inside_the_model(case, op):
    alias, source, ids, expected = case
    got = ReferenceEngine(source, ops=KernelOps((op,)), kv_dtype="f16").forward(ids, all_logits=True)
    err = np.abs(got - expected).max() / np.abs(expected).max()
    print(f"{alias} {op}: relative max error {err:.2e}")
    assert err <= TOLERANCE


def test_all_kernel_ops_with_q8_activations(case):
    alias, source, ids, expected = case
    got = ReferenceEngine(source, ops=KernelOps(KERNEL_OPS, precise=False), kv_dtype="f16").forward(ids, all_logits=True)
    agreement = float((got.argmax(-1) == expected.argmax(-1)).mean())
    print(f"{alias}: top-1 agreement with every op on the kernels {agreement:.3f}")
    assert agreement >= 0.9
