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


def dense_probabilities(sampler: Sampler, logits: np.ndarray, history: list[int]) -> np.ndarray:
    """The filters in order over the whole vocabulary, as written down: penalties, temperature,
    top-k (ties at the k-th kept), softmax, min-p, top-p."""
    p = sampler.params
    x = sampler.adjusted_logits(logits, history).astype(np.float64) / p.temperature
    keep = np.isfinite(x)
    if p.top_k:
        keep &= x >= np.sort(x)[-p.top_k]
    probs = np.where(keep, np.exp(x - x.max()), 0.0)
    probs /= probs.sum()
    probs[probs < p.min_p * probs.max()] = 0.0
    if p.top_p < 1.0:
        order = np.argsort(-probs, kind="stable")
        cut = int(np.searchsorted(np.cumsum(probs[order]), p.top_p)) + 1
        probs[order[cut:]] = 0.0
    return probs / probs.sum()


@pytest.mark.parametrize("params", [
    dict(temperature=0.8, top_k=40, top_p=0.95, min_p=0.05, repetition_penalty=1.1),  # the command line's
    dict(temperature=1.3, top_p=0.9),  # no top-k: every token is a candidate
    dict(temperature=0.5, top_k=7, presence_penalty=0.5, frequency_penalty=0.2),
])
def test_the_candidates_law_is_the_whole_vocabularys(params):
    """Only top-k's candidates are worked on past the penalties; the law is the one the filters
    give over the whole vocabulary (a tie at the k-th value included)."""
    rng = np.random.default_rng(0)
    logits = (rng.standard_normal(151_936) * 3).astype(np.float32)
    logits[[5, 9]] = logits.max() - 0.5  # a tie among the best
    logits[77] = -np.inf  # a token a constraint forbids
    history = rng.integers(0, logits.size, 64).tolist() + [5]
    sampler = Sampler(SamplingParams(**params))
    ids, probs = sampler.distribution(logits, history)
    want = dense_probabilities(sampler, logits, history)
    assert ids.tolist() == np.flatnonzero(want).tolist() and 77 not in ids
    np.testing.assert_allclose(probs, want[ids], rtol=1e-12)
    np.testing.assert_array_equal(sampler.probabilities(logits, history)[ids], probs)


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


def test_frequency_and_presence_penalties_follow_openai():
    """logit -= frequency * count + presence * (count > 0), over the window."""
    sampler = Sampler(SamplingParams(frequency_penalty=0.5, presence_penalty=0.25))
    got = sampler.adjusted_logits(LOGITS, history=[1, 1, 2])
    want = LOGITS.copy()
    want[1] -= 2 * 0.5 + 0.25
    want[2] -= 0.5 + 0.25
    np.testing.assert_allclose(got, want, rtol=1e-6)


def test_penalties_look_at_the_last_n_tokens_only():
    history = [0, 0, 0, 3]
    assert Sampler(SamplingParams(repetition_penalty=10.0, repeat_last_n=1))(LOGITS, history) == 0  # only 3 is recent
    assert Sampler(SamplingParams(repetition_penalty=10.0, repeat_last_n=-1))(LOGITS, history) == 1
    assert Sampler(SamplingParams(repetition_penalty=10.0, repeat_last_n=0))(LOGITS, history) == 0


def test_exempt_tokens_are_never_penalized():
    """End-of-turn tokens follow every message of a chat prompt; penalizing them would keep replies going."""
    params = SamplingParams(repetition_penalty=10.0, frequency_penalty=2.0)
    np.testing.assert_array_equal(Sampler(params, exempt=[0]).adjusted_logits(LOGITS, [0, 0]), LOGITS)
    assert Sampler(params)(LOGITS, [0, 0]) == 1


def test_greedy_with_a_penalty_is_not_argmax_only():
    assert not SamplingParams().penalized
    assert SamplingParams(presence_penalty=0.1).penalized
    assert not SamplingParams(repetition_penalty=1.3, repeat_last_n=0).penalized


def test_masked_tokens_are_never_sampled():
    logits = LOGITS.copy()
    logits[0] = -np.inf
    probs = Sampler(SamplingParams(temperature=1.0, top_k=3)).probabilities(logits)
    assert probs[0] == 0 and (probs[1:4] > 0).all() and probs[4] == 0


def test_defaults_are_llama_cpps():
    from edgeflash.runtime.sampler import SAMPLING_DEFAULTS

    params = SamplingParams(**SAMPLING_DEFAULTS)
    assert (params.temperature, params.top_k, params.top_p, params.min_p) == (0.8, 40, 0.95, 0.05)
    assert (params.repetition_penalty, params.repeat_last_n) == (1.1, 64) and params.penalized


@pytest.mark.parametrize("kwargs", [dict(frequency_penalty=2.5), dict(presence_penalty=-3), dict(repeat_last_n=-2)])
def test_bad_penalties(kwargs):
    with pytest.raises(UserError, match=next(iter(kwargs))):
        SamplingParams(**kwargs)
