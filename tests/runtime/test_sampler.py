"""Sampling filters do what their names say, and bad parameters are refused clearly."""

from __future__ import annotations

import numpy as np
import pytest
from edgeflash.base.errors import UserError
from edgeflash.runtime.sampler import Sampler, SamplingParams

LOGITS = np.log(np.array([0.5, 0.2, 0.15, 0.1, 0.05], dtype=np.float32))


def test_greedy_is_argmax():
    assert Sampler(SamplingParams())(LOGITS) == 0


def test_temperature_one_follows_softmax():
    probs = Sampler(SamplingParams(temperature=1.0)).probabilities(LOGITS)
    np.testing.assert_allclose(probs, [0.5, 0.2, 0.15, 0.1, 0.05], rtol=1e-5)


def test_top_k_keeps_k_best():
    probs = Sampler(SamplingParams(temperature=1.0, top_k=2)).probabilities(LOGITS)
    assert (probs[2:] == 0).all()
    np.testing.assert_allclose(probs[:2], [0.5 / 0.7, 0.2 / 0.7], rtol=1e-5)


def test_top_p_keeps_smallest_prefix_reaching_p():
    probs = Sampler(SamplingParams(temperature=1.0, top_p=0.8)).probabilities(LOGITS)
    assert (probs[:3] > 0).all() and (probs[3:] == 0).all()  # 0.5 + 0.2 + 0.15 >= 0.8


def test_min_p_drops_unlikely():
    probs = Sampler(SamplingParams(temperature=1.0, min_p=0.25)).probabilities(LOGITS)
    assert (probs[3:] == 0).all() and probs[2] > 0  # 0.1 < 0.25 * 0.5 <= 0.15


def test_repetition_penalty_demotes_seen_tokens():
    sampler = Sampler(SamplingParams(repetition_penalty=10.0))
    assert sampler(LOGITS, history=[0]) == 1


def test_seed_reproduces_and_frequencies_match():
    a = [Sampler(SamplingParams(temperature=1.0, seed=7))(LOGITS) for _ in range(3)]
    b = [Sampler(SamplingParams(temperature=1.0, seed=7))(LOGITS) for _ in range(3)]
    assert a == b
    s = Sampler(SamplingParams(temperature=1.0, seed=1))
    counts = np.bincount([s(LOGITS) for _ in range(20000)], minlength=5) / 20000
    np.testing.assert_allclose(counts, [0.5, 0.2, 0.15, 0.1, 0.05], atol=0.015)


@pytest.mark.parametrize("kwargs", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(top_k=-2),
                                    dict(min_p=1.0), dict(repetition_penalty=0)])
def test_bad_parameters(kwargs):
    with pytest.raises(UserError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)
