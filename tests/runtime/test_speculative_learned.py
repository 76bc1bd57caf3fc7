"""What speculation learned is kept between runs (runtime/speculative/learned.py): a new load of the
same model with the same settings starts from the costs and calibration the last run ended with;
other settings, and files that do not read back, start from priors."""

from __future__ import annotations

import json

import edgeflash as ef
import numpy as np
import pytest
from edgeflash.runtime.speculative import learned
from edgeflash.runtime.speculative.controller import PRIOR_SLOPE, Acceptance, CostModel

PROMPT = "The cat sat on the mat. The dog sat on the log. The cat sat on the"


@pytest.fixture
def cache(tmp_path, monkeypatch):
    monkeypatch.setenv("EDGEFLASH_SPECULATIVE_STATE", str(tmp_path / "cache" / "speculative"))
    return tmp_path / "cache"


def learned_state(costs: CostModel, acceptance: Acceptance) -> None:
    costs.record_plain(0.02)
    costs.record_verify(4, 0.03)
    costs.record_verify(2, 0.05)  # a busy moment: above the prior of a 2-node pass
    costs.record_draft("draft", 0.005)
    costs.record_catch_up("draft", 0.001)
    for _ in range(30):
        acceptance.record("draft", 0.95, 1, False)
    for _ in range(8):
        acceptance.record("lookup", 2, 1, False)
    for _ in range(Acceptance.CONFIDENCE_STEPS):  # the answer that just ended
        acceptance.record_confidence(0.6)


def test_costs_and_calibration_round_trip(cache):
    path = cache / "speculative" / "state.json"
    costs, acceptance = CostModel(), Acceptance()
    learned_state(costs, acceptance)
    learned.store(path, costs, acceptance)
    again, calibrated = CostModel(), Acceptance()
    assert learned.restore(path, again, calibrated)
    assert (again.plain, again.verify[4]) == (costs.plain, costs.verify[4])
    assert (again.draft("draft"), again.catch_up("draft")) == \
        (pytest.approx(costs.draft("draft")), pytest.approx(costs.catch_up("draft")))
    assert again.verify[2] == pytest.approx(0.02 * (1 + PRIOR_SLOPE))
    assert again.verify[2] < costs.verify[2]
    assert calibrated.estimate("draft", 0.95, 1) == acceptance.estimate("draft", 0.95, 1) < 0.2
    assert calibrated.recent("draft") == acceptance.long_run("draft") < 0.5
    # how sure the target usually is, the answer that just ended counted in
    assert calibrated.usual_confidence == pytest.approx(0.6) and calibrated.confidence == [0.0, 0]
    # lookup restarts with each text: first tokens from the counts over earlier answers
    assert calibrated.estimate("lookup", 2, 1) == pytest.approx(2 * Acceptance.LOOKUP_PRIOR / 10)
    assert calibrated.estimate("lookup", 3, 1) == Acceptance.LOOKUP_PRIOR
    assert calibrated.estimate("lookup", 2, 2) == Acceptance.LOOKUP_LATER_PRIOR


@pytest.mark.parametrize("damage", [
    lambda d: "{not json",
    lambda d: json.dumps({**d, "version": learned.VERSION + 1}),
    lambda d: json.dumps({**d, "costs": {**d["costs"], "plain": -1.0}}),
    lambda d: json.dumps({**d, "costs": {**d["costs"], "verify": {"1": 0.1}}}),
    lambda d: json.dumps({**d, "acceptance": {"draft": [[1.0, 2.0]]}}),
    lambda d: json.dumps({**d, "acceptance": {"draft": [[3.0, 2.0]] * Acceptance.BINS}}),
    lambda d: json.dumps({k: v for k, v in d.items() if k != "costs"}),
    lambda d: json.dumps({**d, "lookup_first": [[3.0, 2.0]] * (Acceptance.LOOKUP_SLOTS - 1)}),
    lambda d: json.dumps({**d, "usual_confidence": 1.5}),
])
def test_a_file_that_does_not_read_back_is_ignored(cache, damage):
    path = cache / "speculative" / "state.json"
    costs, acceptance = CostModel(), Acceptance()
    learned_state(costs, acceptance)
    learned.store(path, costs, acceptance)
    path.write_text(damage(json.loads(path.read_text())))
    fresh, prior = CostModel(), Acceptance()
    assert not learned.restore(path, fresh, prior)
    assert fresh.plain is None and not fresh.verify and not prior.model


def test_an_unwritable_cache_is_no_error(cache):
    cache.mkdir(parents=True)
    (cache / "speculative").write_text("a file where the folder would go")
    learned.store(cache / "speculative" / "state.json", CostModel(), Acceptance())  # nothing raised


def test_a_new_run_starts_from_what_the_last_one_learned(cache, smollm_path):
    m = ef.load(smollm_path, speculative="lookup")
    first = m._drafters["lookup"].state(True)[0]
    assert first.plain is None  # nothing learned yet
    r = m.generate(PROMPT, max_tokens=24)
    assert r.stats["spec_passes"] > 0
    files = list((cache / "speculative").glob("*.json"))
    assert len(files) == 1
    measured = dict(first.verify)

    again = ef.load(smollm_path, speculative="lookup")
    restored = again._drafters["lookup"].state(True)[0]
    assert restored.plain == pytest.approx(first.plain)
    assert restored.verify == pytest.approx({w: min(s, first.plain * (1 + PRIOR_SLOPE * (w - 1)))
                                             for w, s in measured.items()})
    assert again.generate(PROMPT, max_tokens=24).tokens == r.tokens

    # other settings learn apart: another activation mode, sampled verification
    other = ef.load(smollm_path, speculative="lookup", activations="q8")
    assert other._drafters["lookup"].state(True)[0].plain is None
    assert again._drafters["lookup"].state(False)[0].plain is None
    assert np.isfinite(restored.plain)
