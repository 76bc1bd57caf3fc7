"""The controller that decides how much to speculate, driven with made-up pass costs and
acceptance so each regime (flash-bound, compute-bound, text that turns repetitive) is exact."""

from __future__ import annotations

import edgeflash.runtime.speculative.controller as controller_module
from edgeflash.runtime.speculative.controller import MAX_PAUSE, SHALLOW_DEPTH, Controller

PLAIN = 0.010  # seconds per plain step


def drive(controller: Controller, steps: int, accepted, pass_cost) -> list:
    """Run `steps` decisions; a drafted pass of n nodes yields accepted(step, depth) drafted tokens
    and costs pass_cost(n). Returns the decisions (None = plain step)."""
    decisions = []
    for step in range(steps):
        choice = controller.choose()
        decisions.append(choice)
        if choice is None:
            controller.record_plain(PLAIN)
            continue
        nodes, depth = choice
        controller.record(nodes, depth, 1 + min(depth, accepted(step, depth)), pass_cost(nodes))
    return decisions


def test_flash_bound_text_that_starts_repeating_gets_the_largest_deep_trees_at_once():
    c = Controller(max_nodes=16)
    flash_bound = lambda nodes: PLAIN * 1.05  # a pass reads the same weights a plain step does
    # 40 steps of free prose: nothing accepted, so the controller pauses and probes.
    prose = drive(c, 40, lambda step, depth: 0, flash_bound)
    assert prose.count(None) > 20
    # Then the answer starts copying its prompt: every draft is accepted in full.
    copying = drive(c, 30, lambda step, depth: depth, flash_bound)
    first_pass = next(i for i, d in enumerate(copying) if d is not None)
    assert first_pass <= MAX_PAUSE + 1  # a probe comes within one pause
    later = [d for d in copying[first_pass + 4:] if d is not None]
    # The biggest tree, drafted as deep as it allows, past the shallow depth.
    assert later and all(d == (16, 15) for d in later) and 15 > SHALLOW_DEPTH


def test_compute_bound_passes_that_do_not_pay_are_mostly_skipped():
    c = Controller(max_nodes=16)
    compute_bound = lambda nodes: PLAIN * (1 + nodes / 4)  # every node costs compute
    decisions = drive(c, 200, lambda step, depth: 0, compute_bound)
    drafted = [d for d in decisions if d is not None]
    assert len(drafted) < 200 / MAX_PAUSE  # probes only: about one per longest pause
    assert all(n <= 16 for n, _ in drafted)


def test_compute_bound_picks_the_size_with_the_best_rate():
    c = Controller(max_nodes=16)
    # Two drafted tokens accepted per pass, whatever the size: small trees pay, big ones cost more.
    decisions = drive(c, 100, lambda step, depth: 2, lambda nodes: PLAIN * (1 + nodes / 4))
    settled = [d for d in decisions[20:] if d is not None]
    assert settled and all(n == 4 for n, _ in settled)
    assert decisions[20:].count(None) < 10  # it keeps speculating: 3 tokens for 2 steps' cost


def test_a_probe_that_finds_nothing_to_draft_stays_due(monkeypatch):
    monkeypatch.setattr(controller_module, "REMEASURE_PLAIN", 10**9)  # no scheduled plain step in between
    c = Controller(max_nodes=16)
    drive(c, 30, lambda step, depth: 0, lambda nodes: PLAIN * 3)  # nothing pays: paused
    assert c.pause > 0 or c.probe_due
    while c.pause:
        assert c.choose() is None
        c.record_plain(PLAIN)
    # The probe comes; the drafter has nothing (a plain step, no record): the next step probes again.
    assert c.choose() is not None
    c.record_plain(PLAIN)
    assert c.choose() is not None
