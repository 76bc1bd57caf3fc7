"""The arena order: hot neurons first, then neurons that fire together in neighbouring slots."""

from __future__ import annotations

import numpy as np
import torch
from edgeflash.export.statistics import CLUSTER_NEURONS, HOT_FREQUENCY, coactivation_order


def groups_per_run(order: np.ndarray, latent: np.ndarray, start: int) -> float:
    runs = [len(set(latent[order[i:i + CLUSTER_NEURONS]])) for i in range(start, len(order), CLUSTER_NEURONS)]
    return float(np.mean(runs))


def test_neurons_that_fire_together_share_runs_and_hot_ones_lead():
    rng = np.random.default_rng(0)
    tokens, d_ff, n_groups = 1024, 2048, 64
    latent = rng.integers(0, n_groups, d_ff)  # each neuron follows one hidden cause
    cause = rng.random((tokens, n_groups)) < 0.25
    active = cause[:, latent] & (rng.random((tokens, d_ff)) < 0.9)
    always = rng.choice(d_ff, 100, replace=False)
    active[:, always] = rng.random((tokens, 100)) < 0.95  # hot neurons
    freq = active.mean(axis=0).astype(np.float32)
    order = coactivation_order(torch.from_numpy(active), freq)
    assert sorted(order.tolist()) == list(range(d_ff))
    hot = int(np.sum(freq >= HOT_FREQUENCY))
    assert hot >= 90 and set(order[:hot].tolist()) == set(np.flatnonzero(freq >= HOT_FREQUENCY).tolist())
    by_freq = np.argsort(-freq, kind="stable")
    # a run of slots holds neurons of few causes, where the frequency order mixes many
    assert groups_per_run(order, latent, hot) < 0.3 * groups_per_run(by_freq, latent, hot)
    assert np.array_equal(order, coactivation_order(torch.from_numpy(active), freq))  # deterministic
