"""The controller that decides how much to speculate, driven with made-up pass costs and
acceptance so each regime (flash-bound, compute-bound, text that turns repetitive, a draft model
worth or not worth its forwards) is exact."""

from __future__ import annotations

import itertools

import pytest
from edgeflash.runtime.speculative.controller import (
    CATCH_UP_HORIZON,
    EXPLORE_AFTER,
    FIRST_CATCH_UP,
    GUARD_MIN,
    MAX_PAUSE,
    PRIOR_SLOPE,
    PROBE_EVERY,
    Acceptance,
    Controller,
    CostModel,
    top_probability,
)
from edgeflash.runtime.speculative.tree import DraftTree

PLAIN = 0.010  # seconds per plain step


def costs(pass_cost) -> CostModel:
    c = CostModel()
    c.record_plain(PLAIN)
    for w in range(2, 33):
        c.verify[w] = pass_cost(w)
    return c


def lookup_chain(tokens) -> DraftTree:
    tree = DraftTree.root(0)
    tree.add_chain(0, list(tokens), 64, "lookup")
    return tree


def test_cost_model_interpolates_and_extrapolates_what_it_measured():
    c = CostModel()
    c.record_plain(0.010)
    assert c.pass_cost(5) == pytest.approx(0.010 * (1 + PRIOR_SLOPE * 4))  # the prior, before any pass
    c.record_verify(2, 0.012)
    c.record_verify(4, 0.016)
    assert c.pass_cost(3) == pytest.approx(0.014)
    assert c.pass_cost(8) == pytest.approx(0.016 + 4 * 0.002, rel=0.05)  # along the measured slope
    flat = costs(lambda w: PLAIN)
    assert flat.pass_cost(40) == pytest.approx(PLAIN)
    slow = CostModel()
    slow.record_plain(0.010)
    slow.record_verify(2, 0.016)  # one slow moment: unmeasured widths are not priced off it
    assert slow.pass_cost(3) == pytest.approx(0.016 + 0.010 * PRIOR_SLOPE)


def test_a_pass_never_costs_more_than_a_wider_one_measured():
    """A width measured dear in a slow moment is priced at most what a wider pass measured, so the
    draft that would verify it is not stopped short of it for good."""
    c = CostModel()
    c.record_plain(0.70)
    for w, s in {2: 0.76, 3: 0.74, 4: 1.16, 6: 1.00, 7: 0.91, 8: 1.11}.items():
        c.record_verify(w, s)
    assert c.pass_cost(4) == pytest.approx(0.91)
    assert c.pass_cost(5) == pytest.approx(0.91)
    assert c.pass_cost(2) == pytest.approx(0.74)
    assert c.pass_cost(8) == pytest.approx(1.11)
    assert c.verify[4] == pytest.approx(1.16)  # what was measured is kept as it was
    assert c.pass_cost(4) - c.pass_cost(3) < 0.25 < 1.16 - 0.74  # a third drafted token is not priced 0.42 s


def test_selection_is_the_best_rate_and_keeps_parents():
    """With every estimate known, the chosen subtree has the best expected tokens per second of
    all parent-closed subtrees (checked exhaustively on a small tree)."""
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.2 * (w - 1))), Acceptance())
    tree = DraftTree.root(0)
    a = tree.add(0, 1, "draft", 0.95)
    b = tree.add(a, 2, "draft", 0.9)
    tree.add(b, 3, "draft", 0.35)
    tree.add(0, 4, "draft+runner-up", 0.05)
    tree.add(a, 5, "draft+runner-up", 0.08)
    memo: dict[int, float] = {}
    chosen = c.select(tree, memo)
    best = 1 / PLAIN
    for k in range(1, tree.size):
        for nodes in itertools.combinations(range(1, tree.size), k):
            if all(tree.parents[n] == 0 or tree.parents[n] in nodes for n in nodes):
                rate = (1 + sum(c.reach(tree, n, memo) for n in nodes)) / c.costs.pass_cost(k + 1)
                best = max(best, rate)
    assert chosen is not None
    assert chosen.expected_tokens / chosen.seconds == pytest.approx(best)
    assert all(tree.parents[n] in chosen.nodes for n in chosen.nodes[1:])
    assert 4 not in chosen.nodes and 5 not in chosen.nodes  # unlikely leaves are not worth a row


def test_flash_bound_passes_take_wide_trees_and_compute_bound_ones_narrow():
    tree = DraftTree.root(0)
    node = 0
    for t in range(1, 9):
        tree.add(node, 100 + t, "draft+runner-up", 0.25)  # a runner-up at every depth
        node = tree.add(node, t, "draft", 0.7)
    flash = Controller(32, costs(lambda w: PLAIN * 1.05), Acceptance()).select(tree)
    compute = Controller(32, costs(lambda w: PLAIN * (1 + 0.3 * (w - 1))), Acceptance()).select(tree)
    assert flash is not None and compute is not None
    assert len(flash.nodes) == tree.size  # reading the weights once dominates: verify everything
    assert len(compute.nodes) <= 4 and all(tree.origins[n] != "draft+runner-up" for n in compute.nodes[1:])


def test_a_draft_level_widens_where_passes_are_cheap_and_the_runner_up_is_likely():
    """The second node of a draft model's tree level costs a fifth of a forward and its place in
    the pass: taken when flash-bound for a likely node, not for an unlikely one, nor when each node
    of a pass costs compute, nor when the tree is full."""
    def controller(pass_cost, max_nodes=32):
        c = Controller(max_nodes, costs(pass_cost), Acceptance())
        c.costs.record_draft("draft", 0.2 * PLAIN)
        c.acceptance.model_recent["draft"] = 0.7
        return c

    flash = controller(lambda w: PLAIN * 1.05)
    assert flash.widen("draft", 0.3, 4)
    assert not flash.widen("draft", 0.01, 4)  # 0.007 plain steps of worth against 0.04 of a forward
    assert not controller(lambda w: PLAIN * (1 + 0.3 * (w - 1))).widen("draft", 0.3, 4)
    assert not controller(lambda w: PLAIN * 1.05, max_nodes=4).widen("draft", 0.3, 4)


def test_text_that_is_never_accepted_gets_plain_steps():
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    verified = 0
    for step in range(200):
        if c.plain_now():
            c.record_plain(PLAIN)
            continue
        tree = lookup_chain(range(1, 9))
        selection = c.select(tree)
        if selection is None:
            c.record_plain(PLAIN)
            continue
        verified += 1
        small = tree.keep(selection.nodes)
        c.record_pass(small, [0], c.costs.pass_cost(small.size))
    assert verified < 200 / 8  # now and then only: estimates drift back and get tested again
    assert verified > 2


def test_text_that_starts_repeating_is_drafted_for_within_a_few_steps():
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.05 * (w - 1))), Acceptance())
    for _ in range(60):  # prose: lookup never right
        if not c.plain_now() and (s := c.select(lookup_chain(range(1, 9)))) is not None:
            t = lookup_chain(range(1, 9)).keep(s.nodes)
            c.record_pass(t, [0], PLAIN)
        else:
            c.record_plain(PLAIN)
    first_full = None
    for step in range(40):  # now the answer copies its prompt: every lookup token is right
        if c.plain_now():
            c.record_plain(PLAIN)
            continue
        s = c.select(lookup_chain(range(1, 16)))
        if s is None:
            c.record_plain(PLAIN)
            continue
        t = lookup_chain(range(1, 16)).keep(s.nodes)
        c.record_pass(t, list(range(t.size)), PLAIN)
        if t.size == 16 and first_full is None:
            first_full = step
    assert first_full is not None and first_full <= MAX_PAUSE + 8


def test_draft_model_drafts_deep_only_while_its_tokens_are_worth_a_forward():
    cheap = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    cheap.costs.record_draft("draft", 0.1 * PLAIN)
    for _ in range(50):
        cheap.acceptance.record("draft", 0.95, 1, True)  # its tokens are usually right
    cheap.steps = 1
    assert cheap.draft_more("draft", 1.0, 1, first=True)
    assert cheap.draft_more("draft", 0.8, 3)
    assert not cheap.draft_more("draft", 0.1, 3)  # a token this unlikely is not worth a forward
    dear = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    dear.costs.record_draft("draft", PLAIN)  # a draft forward costs what a target step costs
    for _ in range(50):
        dear.acceptance.record("draft", 0.95, 1, True)
    decisions = []
    for _ in range(4 * PROBE_EVERY):
        if dear.plain_now():
            continue
        decisions.append(dear.draft_more("draft", 1.0, 1, first=True))
    assert 0 < sum(decisions) <= 4  # only the probes that keep its cost current


def test_a_draft_model_measured_in_a_busy_moment_drafts_again_when_the_machine_is_quiet():
    """A draft model's cost is measured only while it drafts. Kept in plain steps, what it measured
    while the machine ran three times slower follows the plain steps measured after it."""
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    for _ in range(20):
        c.costs.record_plain(3 * PLAIN)  # a busy moment: everything takes three times as long
    c.costs.record_draft("draft", 3 * 0.3 * PLAIN)
    c.costs.record_catch_up("draft", 3 * 0.02 * PLAIN)
    for _ in range(20):
        c.costs.record_plain(PLAIN)  # quiet again: only plain steps are measured
    assert c.costs.draft("draft") == pytest.approx(0.3 * PLAIN, rel=0.01)
    assert c.costs.catch_up("draft") == pytest.approx(0.02 * PLAIN, rel=0.01)
    assert c.draft_more("draft", 1.0, 1)  # worth 0.5 plain steps, costs 0.4


def test_guard_benches_lookup_when_it_loses_to_plain_decoding():
    c = Controller(16, costs(lambda w: PLAIN), Acceptance())
    c.plain_now()
    for _ in range(8):  # passes that promised much but yielded one token for two steps' time
        c.record_step(None, 1, 2 * PLAIN)
    assert c.guard.pause > 0
    paused = 0
    while c.lookup_benched():
        paused += 1
    assert 0 < paused <= MAX_PAUSE


def test_a_draft_model_that_loses_does_not_bench_lookup_and_a_new_answer_ends_lookups_pause():
    """Steps the draft model drafted in are its guard's alone: lookup, which costs nothing, is not
    benched for them. Lookup's own pause ends with its answer; its backoff does not, so a probe in
    the next answer that loses again pauses it as long as before."""
    guards: dict = {}
    c = Controller(16, costs(lambda w: PLAIN), Acceptance(), guards)
    c.plain_now()
    for _ in range(GUARD_MIN):
        c.record_step("draft", 1, 2 * PLAIN)
    assert guards["draft"].pause > 0 and not c.lookup_benched()
    for _ in range(4):  # lookup loses four probes in a row: a pause of 8 steps
        for _ in range(GUARD_MIN):
            c.record_step(None, 1, 2 * PLAIN)
        if c.guard.pause < 8:
            while c.lookup_benched():
                pass
    assert c.guard.pause == 8 and c.lookup_benched()
    again = Controller(16, c.costs, c.acceptance, guards)  # the next answer
    assert not again.lookup_benched()
    for _ in range(GUARD_MIN):
        again.record_step(None, 1, 2 * PLAIN)
    assert again.guard.pause == 16


def test_a_losing_path_pauses_longer_each_time_and_across_generations():
    """Probes that keep losing double the pause up to MAX_PAUSE; a new generation (a controller over
    the same learned state) keeps that backoff, not starting from scratch; winning halves it again."""
    guards: dict = {}
    c = Controller(16, costs(lambda w: PLAIN), Acceptance(), guards)
    c.plain_now()
    pauses = []
    for _ in range(10):
        for _ in range(GUARD_MIN):
            c.record_step(None, 1, 2 * PLAIN)
        pauses.append(c.guard.pause)
        while c.guard.paused():
            pass
    assert pauses == sorted(pauses) and pauses[0] == 1 and pauses[-1] == MAX_PAUSE
    again = Controller(16, c.costs, c.acceptance, guards)
    for _ in range(GUARD_MIN):
        again.record_step(None, 1, 2 * PLAIN)
    assert again.guard.pause == MAX_PAUSE
    for _ in range(8):
        again.record_step(None, 3, PLAIN)  # three tokens for one step's time
    assert again.guard.backoff < MAX_PAUSE


def test_a_draft_model_that_loses_is_benched_while_lookup_goes_on():
    """Steps in which the draft model drafted yield fewer tokens per second than plain decoding:
    the model sits out the next steps (it is not asked to draft, not even by a probe) while
    speculation as a whole, lookup's passes, is not paused."""
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    c.costs.record_draft("draft", 0.1 * PLAIN)
    for _ in range(50):
        c.acceptance.record("draft", 0.95, 1, True)
    assert not c.plain_now() and c.draft_more("draft", 1.0, 1, first=True)
    for _ in range(GUARD_MIN):
        c.record_step("draft", 1, 1.5 * PLAIN)  # one token for 1.5 plain steps' time
    asked = []
    for _ in range(PROBE_EVERY + 4):
        assert not c.plain_now() or c.steps % 32 == 0
        assert not c.lookup_benched()  # lookup goes on
        asked.append(c.draft_more("draft", 1.0, 1, first=True))
    assert asked[0] is False and any(asked)  # benched for its pause, then probed again
    assert c.select(lookup_chain(range(1, 4))) is not None  # lookup is still verified meanwhile


def test_a_long_catch_up_is_charged_to_the_first_draft_token():
    """A draft model whose cache must first take in a whole prompt pays for that catch-up (its share
    of the steps the catch-up serves); a cache a token or two behind does not, and a probe never
    forces a long catch-up."""
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    c.costs.record_draft("draft", 0.2 * PLAIN)
    c.costs.record_catch_up("draft", 0.05 * PLAIN)  # per context token, batched
    for _ in range(50):
        c.acceptance.record("draft", 0.95, 1, True)
    c.acceptance.model_recent["draft"] = 0.7
    c.steps += 2 * CATCH_UP_HORIZON
    assert c.draft_more("draft", 1.0, 1, first=True, behind=2)
    assert not c.draft_more("draft", 1.0, 1, first=True, behind=200)  # 200 x 0.05 / 16 = 0.63 plain steps
    c.steps += 10 * PROBE_EVERY
    assert not c.draft_more("draft", 1.0, 1, first=True, behind=200)


def test_a_catch_up_waits_until_the_answer_has_shown_it_is_long():
    """At the start of an answer a catch-up is charged to the few steps taken so far, since the
    answer may end after them; as it goes on the charge falls to its share of CATCH_UP_HORIZON steps.
    A draft model that never caught up does so FIRST_CATCH_UP steps into an answer, whatever the
    priors say, so that what it costs gets measured."""
    def controller() -> Controller:
        c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
        c.acceptance.model_recent["draft"] = 0.7
        return c

    def asked(c: Controller, steps: int) -> list[bool]:
        out = []
        for _ in range(steps):
            c.steps += 1
            out.append(c.draft_more("draft", 1.0, 1, first=True, behind=50))
        return out

    assert asked(controller(), FIRST_CATCH_UP) == [False] * (FIRST_CATCH_UP - 1) + [True]
    c = controller()
    c.costs.record_draft("draft", 0.2 * PLAIN)
    c.costs.record_catch_up("draft", 0.04 * PLAIN)  # 50 context tokens: 2 plain steps
    seen = asked(c, CATCH_UP_HORIZON)
    assert seen[:3] == [False] * 3 and seen[-1]  # 2 / 16 = 0.13: worth its 0.7 plain steps of tokens


def test_lookup_rates_start_each_answer_from_what_earlier_answers_showed():
    """Lookup rates follow the text, so a new answer starts them afresh: a chain's first token from
    how often first tokens were accepted over earlier answers, a later token from the prior (one
    answer that copied its prompt must not make the next verify long chains). What was learned of a
    draft model's probabilities is kept."""
    a = Acceptance()
    for _ in range(5):
        a.record("lookup", 3, 1, True)
        a.record("lookup", 3, 2, True)
        a.record("draft", 0.55, 1, False)
    assert a.estimate("lookup", 3, 1) > 0.9 and a.estimate("lookup", 3, 2) > 0.9
    model = a.estimate("draft", 0.55, 1)
    a.new_text()
    assert a.estimate("lookup", 3, 1) == pytest.approx((2 * Acceptance.LOOKUP_PRIOR + 5) / 7)
    assert a.estimate("lookup", 3, 2) == Acceptance.LOOKUP_LATER_PRIOR
    assert a.estimate("draft", 0.55, 1) == model < 0.5
    for _ in range(3):  # answers whose 2-gram chains never start right
        for _ in range(4):
            a.record("lookup", 2, 1, False)
        a.new_text()
    assert a.estimate("lookup", 2, 1) < 0.1 < a.estimate("lookup", 3, 1)


def test_lookup_siblings_together_are_worth_one_token_at_most():
    """Branches from several earlier occurrences of an n-gram are different tokens: at most one is
    accepted. An older occurrence's token is an alternative (less likely than the most recent one's),
    and a node's siblings never add up to more than one token: at a resident model's pass price the
    most recent branch alone is verified."""
    a = Acceptance()
    tree = DraftTree.root(0)
    tree.add(0, 1, "lookup", 2.0)
    for token in (2, 3):
        tree.add(0, token, "lookup", Acceptance.LOOKUP_ALTERNATIVE)
    c = Controller(16, costs(lambda w: PLAIN * (1 + PRIOR_SLOPE * (w - 1))), a)
    assert a.estimate("lookup", Acceptance.LOOKUP_ALTERNATIVE, 1) < a.estimate("lookup", 2.0, 1)
    assert c.select(tree).nodes == [0, 1]
    for _ in range(10):
        a.record("lookup", 2, 1, True)
        a.record("lookup", Acceptance.LOOKUP_ALTERNATIVE, 1, True)
    memo: dict[int, float] = {}
    assert sum(c.reach(tree, i, memo) for i in (1, 2, 3)) == pytest.approx(1.0)


def test_a_lookup_guess_beside_a_sure_draft_token_takes_only_what_the_draft_leaves():
    """Where sibling estimates add up to more than 1, the likelier node keeps its estimate and the
    others share the rest: a lookup guess next to a draft model's sure token does not cut the reach
    of the draft's subtree, so the draft model drafts as deep as it would alone."""
    a = Acceptance()
    for _ in range(20):
        a.record("draft", 0.9, 1, True)
    tree = DraftTree.root(0)
    sure = tree.add(0, 1, "draft", 0.9)
    guess = tree.add(0, 2, "lookup", 3.0)
    below = tree.add(sure, 3, "draft", 0.9)
    q_sure, q_guess = a.estimate("draft", 0.9, 1), a.estimate("lookup", 3.0, 1)
    assert q_sure + q_guess > 1.0 and q_sure > q_guess
    c = Controller(16, costs(lambda w: PLAIN), a)
    memo: dict[int, float] = {}
    assert c.reach(tree, sure, memo) == pytest.approx(q_sure)
    assert c.reach(tree, guess, memo) == pytest.approx(1.0 - q_sure)
    assert c.reach(tree, below, memo) == pytest.approx(q_sure * a.estimate("draft", 0.9, 2))


def test_a_token_two_drafters_propose_keeps_the_more_trusted_label():
    """A lookup's n-gram length and a draft model's probability are not on one scale: where both
    propose a token, the node takes the label whose expected acceptance is higher."""
    a = Acceptance()
    tree = DraftTree.root(0)
    looked_up = tree.add(0, 7, "lookup", 2.0)
    assert tree.add(0, 7, "draft", 0.2, a.estimate) == looked_up  # 0.2 < lookup's 0.5
    assert (tree.origins[looked_up], tree.scores[looked_up]) == ("lookup", 2.0)
    tree.add(0, 7, "draft", 0.95, a.estimate)  # 0.95 > 0.5
    assert (tree.origins[looked_up], tree.scores[looked_up]) == ("draft", 0.95)
    tree.add(0, 7, "lookup", 4.0)  # without the controller's estimates the label stays
    assert tree.origins[looked_up] == "draft"


def test_lookup_at_its_prior_is_verified_unmeasured():
    """With no pass measured yet, a lookup node at its prior acceptance is worth a pass at the prior
    price: otherwise lookup alone would never verify, and so never measure what a pass costs."""
    c = CostModel()
    c.record_plain(PLAIN)
    assert Controller(16, c, Acceptance()).select(lookup_chain([1])) is not None


def test_text_that_copies_grows_its_lookup_chains_where_passes_cost_much():
    """Where each node of a pass costs as much as the prior says (a CPU bound by arithmetic), an
    answer whose lookup first tokens are all accepted verifies their later tokens too: a chain's
    second token is worth its place before any was tested, and longer chains follow once the later
    tokens are accepted (never testing them kept a copying answer at one token a pass)."""
    c = Controller(16, costs(lambda w: PLAIN * (1 + PRIOR_SLOPE * (w - 1))), Acceptance())
    for _ in range(5):
        c.acceptance.record("lookup", 3, 1, True)
    chain = lookup_chain(range(1, 9))
    chain.scores[1] = 3  # the first token followed a 3-gram
    first = c.select(chain)
    assert first is not None and len(first.nodes) >= 3
    for _ in range(4):
        c.record_pass(chain, list(range(chain.size)), PLAIN)
    assert len(c.select(chain).nodes) > len(first.nodes)


def test_a_pass_width_measured_dear_once_is_tried_again_after_whole_passes():
    """A 3-node pass measured in a busy moment prices every longer lookup chain out of an answer that
    copies its prompt; the passes of 2 nodes it leaves are accepted whole, and after EXPLORE_AFTER of
    them a pass verifies one node more, which measures the width again and tests the later tokens."""
    def quiet(w):
        return PLAIN * (1 + 0.18 * (w - 1))

    def passes(select) -> list[int]:
        cm = CostModel()
        cm.record_plain(PLAIN)
        cm.verify.update({2: quiet(2), 3: 1.5 * quiet(2)})
        c = Controller(16, cm, Acceptance())
        sizes = []
        for _ in range(16):
            chain = lookup_chain(range(1, 9))
            chain.scores[1:] = [3] * (chain.size - 1)  # every token followed a 3-gram
            t = chain.keep(select(c, chain).nodes)
            c.record_pass(t, list(range(t.size)), quiet(t.size))  # all accepted
            sizes.append(t.size)
        return sizes

    trapped = passes(lambda c, chain: c.select(chain))
    assert set(trapped) == {2}  # what select() alone does: one lookup token a pass
    explored = passes(lambda c, chain: c.select_pass(chain))
    assert explored[:EXPLORE_AFTER] == trapped[:EXPLORE_AFTER] and explored[EXPLORE_AFTER] == 3
    assert explored[-1] >= 8


def test_passes_that_fail_verify_no_more_than_the_best_subtree():
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    for _ in range(3 * EXPLORE_AFTER):
        chain = lookup_chain(range(1, 9))
        s = c.select_pass(chain)
        assert s.nodes == c.select(chain).nodes and len(s.nodes) > 2  # so [0, 1] is not the whole pass
        c.record_pass(chain.keep(s.nodes), [0, 1], PLAIN)  # the second token is always rejected


def test_a_draft_models_recent_rate_starts_each_answer_from_its_long_run_rate():
    """A hard answer lowers a draft model's recent rate. The next answer starts it from the model's
    long-run rate: left low, it would keep the model from joining any later answer, and nothing
    would test it again (it drifts back toward the long-run rate too, not toward a fixed prior)."""
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), Acceptance())
    c.costs.record_draft("draft", 0.2 * PLAIN)
    c.costs.record_catch_up("draft", 0.01 * PLAIN)
    a = c.acceptance
    for accepted in [True] * 160 + [False] * 40:  # answers the model drafted well, then a hard one
        a.record("draft", 0.85, 1, accepted)
    assert a.recent("draft") < 0.05 and a.long_run("draft") > 0.7
    c.steps += 2 * CATCH_UP_HORIZON
    assert not c.draft_more("draft", 1.0, 1, first=True, behind=60)
    for _ in range(20):
        a.drift(False, set())
    assert 0.05 < a.recent("draft") < a.long_run("draft")
    a.new_text()
    assert a.recent("draft") == a.long_run("draft")
    assert c.draft_more("draft", 1.0, 1, first=True, behind=60)


def logits_sure_of(p: float, vocab: int = 8):
    """Logits whose most likely token has probability p."""
    import numpy as np

    return np.log(np.array([p] + [(1 - p) / (vocab - 1)] * (vocab - 1), dtype=np.float32)) + 3.0


def test_top_probability_is_the_softmax_of_the_best_logit():
    assert top_probability(logits_sure_of(0.8)) == pytest.approx(0.8, rel=1e-5)
    assert top_probability(logits_sure_of(1 / 8)) == pytest.approx(1 / 8, rel=1e-5)


def joining_controller(usual: float, this_answer: list[float]) -> Controller:
    """A draft model with a long-run rate of about 0.7 whose catch-up on a 196-token prompt pays at that
    rate, 32 steps into an answer; earlier answers' plain steps put the target's usual confidence at
    `usual`, this answer's so far are `this_answer`."""
    a = Acceptance()
    for accepted in [True] * 150 + [False] * 50:
        a.record("draft", 0.85, 1, accepted)
    for p in [usual] * 8:
        a.record_confidence(p)
    a.new_text()
    c = Controller(16, costs(lambda w: PLAIN * (1 + 0.1 * (w - 1))), a)
    c.costs.record_draft("draft", 0.2 * PLAIN)
    c.costs.record_catch_up("draft", 0.01 * PLAIN)
    c.steps += 2 * CATCH_UP_HORIZON
    for p in this_answer:
        c.record_confidence(logits_sure_of(p))
    return c


def test_a_draft_model_joins_answers_by_how_sure_the_target_is_of_them():
    """How sure the target is of its tokens predicts how often a draft model agrees with it. A
    draft model joins an answer the target is as sure of as usual (its rate there starts from its
    recent one), not one it is half as sure of (a passage continued: the catch-up on the prompt
    would cost more than drafting at half the rate gains), and judges by its recent rate alone
    before the answer has shown enough plain steps. Where the target is surer than usual the rate
    rises too (the answers it was learned on were harder), up to MAX_JOINING."""
    usual = joining_controller(0.8, [0.8] * 8)
    assert usual.acceptance.joining("draft") == pytest.approx(usual.acceptance.long_run("draft"))
    assert usual.draft_more("draft", 1.0, 1, first=True, behind=196)
    assert usual.acceptance.recent("draft") == pytest.approx(usual.acceptance.long_run("draft"))

    unsure = joining_controller(0.8, [0.4] * 8)
    assert unsure.acceptance.joining("draft") == pytest.approx(unsure.acceptance.long_run("draft") / 2)
    assert not unsure.draft_more("draft", 1.0, 1, first=True, behind=196)

    too_few = joining_controller(0.8, [0.4] * (Acceptance.CONFIDENCE_STEPS - 1))
    assert too_few.draft_more("draft", 1.0, 1, first=True, behind=196)

    surer = joining_controller(0.8, [0.88] * 8)
    long_run = surer.acceptance.long_run("draft")
    assert long_run * 1.1 < Acceptance.MAX_JOINING
    assert surer.acceptance.joining("draft") == pytest.approx(long_run * 1.1)
    assert joining_controller(0.3, [0.95] * 8).acceptance.joining("draft") == Acceptance.MAX_JOINING


def test_a_sure_short_answer_is_kept_from_a_long_catch_up_by_its_charge():
    """The rate a sure answer earns does not draw a draft model into taking in a long prompt at the
    answer's first steps: the catch-up is charged to the steps taken so far, so it joins once the
    answer has shown it is long enough to repay it."""
    c = joining_controller(0.6, [0.97] * Acceptance.CONFIDENCE_STEPS)
    c.steps = Acceptance.CONFIDENCE_STEPS + 1
    c.costs.catch_up_share["draft"] = 0.03  # a 196-token catch-up: 6 plain steps (as measured)
    assert c.acceptance.joining("draft") == Acceptance.MAX_JOINING
    assert not c.draft_more("draft", 1.0, 1, first=True, behind=196)
    c.steps = 11  # nor at the 11th step, where a rate of 0.95 joined a 13-token answer
    assert not c.draft_more("draft", 1.0, 1, first=True, behind=196)
    c.steps = CATCH_UP_HORIZON
    assert c.draft_more("draft", 1.0, 1, first=True, behind=196)


def test_the_targets_confidence_is_counted_only_before_a_draft_model_drafts():
    """Once a draft model drafts, the plain steps left are the ones no tree paid for, the target's
    least sure: counting them would make every answer look harder than the usual one."""
    c = joining_controller(0.8, [0.9] * 4)
    assert c.draft_more("draft", 1.0, 1, first=True, behind=196)
    c.record_confidence(logits_sure_of(0.1))
    assert c.acceptance.confidence == [pytest.approx(3.6), 4]
    c.acceptance.new_text()
    assert c.acceptance.usual_confidence == pytest.approx(0.75 * 0.8 + 0.25 * 0.9)


def test_a_catch_up_is_left_out_of_what_the_guards_judge(monkeypatch):
    """A pass may carry the draft model's catch-up on a new context, which the controller charged to
    the steps it serves. The guards judge a few steps, so they leave it out: passes that yield 3
    tokens in a plain step's time each bench nothing, though each also took a catch-up of 10 plain
    steps (counted in, they would have looked 4x slower than plain decoding)."""
    import numpy as np
    from edgeflash.runtime.sampler import Sampler, SamplingParams
    from edgeflash.runtime.speculative import decoder

    clock = [0.0]
    monkeypatch.setattr(decoder, "now", lambda: clock[0])

    class Engine:  # the target: every pass costs one plain step and accepts the drafted chain
        max_batch = 16

        def forward(self, tokens):
            clock[0] += 1.0
            return np.zeros((len(tokens), 8), dtype=np.float32)

        def forward_tree(self, tokens, depths, mask, argmax_only=False):
            clock[0] += 1.0
            return np.array(list(tokens[1:]) + [7])

        def commit_tree(self, path):
            pass

    class Drafters:  # a draft model that catches up on a new context before every draft
        def __init__(self):
            self.learned = (costs(lambda w: 1.0), Acceptance(), {})
            self.learned[0].plain = 1.0

        def state(self, greedy):
            return self.learned

        def extend(self, tree, history, controller, max_depth):
            clock[0] += 10.0
            tree.add_chain(0, [5, 6], 16, "draft", [0.99, 0.99])
            return "draft"

        def catch_up_seconds(self):
            return 10.0

    spec = decoder.SpeculativeDecoder(Engine(), Drafters(), Sampler(SamplingParams()))
    for _ in range(2 * GUARD_MIN):
        assert spec.step([1, 2, 3]) == [5, 6, 7]
    assert spec.stats.passes == 2 * GUARD_MIN
    assert not any(g.pause for g in spec.controller.guards.values())


def test_only_a_new_contexts_catch_up_prices_the_next_one(monkeypatch):
    """A forward costs a fixed part plus a part per token. A few tokens taken in after a pause cost
    several times a new prompt's per token; priced from them, the next prompt's catch-up looked so
    dear that the draft model stopped joining answers. Only catch-ups of a new context's length
    set the price; every catch-up is still left out of what the guards judge."""
    import numpy as np
    from edgeflash.runtime.speculative import drafters
    from edgeflash.runtime.speculative.drafters import ModelDrafter

    clock = [0.0]
    monkeypatch.setattr(drafters, "now", lambda: clock[0])

    class Engine:
        context_length = 512
        _engine = None

        def __init__(self):
            self.tokens: list[int] = []

        def truncate(self, n):
            del self.tokens[n:]

        def forward(self, tokens):
            clock[0] += 1.0 + 0.1 * len(tokens)
            self.tokens += list(tokens)
            return np.zeros((len(tokens), 4), dtype=np.float32)

    class Head:
        def has_room(self, tokens):
            return True

        def add(self, tokens):
            return False

    c = Controller(16, costs(lambda w: 1.0), Acceptance())
    drafter = ModelDrafter(Engine(), Head(), "draft")
    prompt = list(range(100, 160))
    drafter._catch_up(prompt, c)
    assert c.costs.catch_up("draft") == pytest.approx(7.0 / 60)
    assert drafter.catch_up_s == pytest.approx(7.0)
    drafter._catch_up(prompt + [1, 2, 3, 4, 5], c)  # after a pause: 1.5 s for 5 tokens
    assert c.costs.catch_up("draft") == pytest.approx(7.0 / 60)
    assert drafter.catch_up_s == pytest.approx(1.5)
