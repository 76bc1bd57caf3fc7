"""How much to speculate each step: which drafted nodes to verify, whether a draft model should
draft one more token, or a plain single-token step when no tree pays.

Two kinds of facts are measured apart, because they change at different speeds:
- cost (CostModel): seconds per plain step, per verification pass of w nodes and per draft-model
  forward. A property of the machine, the model and the budget: in memory a pass costs more the
  more nodes it has (each node is a row of every matrix product); when weights stream from flash a
  16-node pass costs about what a plain step costs. Kept across generations.
- acceptance (Acceptance): how likely the target accepts a drafted node, by drafter and by what the
  drafter knew of it (a draft model's probability of the token; a lookup's depth in its chain).
  Draft-model probabilities are calibrated by counting; lookup rates follow the text within a few
  passes, since an answer can start or stop copying its prompt in one token.

From these, a node's chance of being on the accepted path is the product of its ancestors'
acceptance, and the expected tokens of a tree are 1 + the sum of its nodes' chances. The
controller verifies the subtree (the most likely nodes, parents first) with the best expected
tokens per second, or takes a plain step when none beats one token per plain step; a draft model
drafts one more token while that token's expected worth exceeds its forward and its node's share
of the pass. Guards compare what speculation actually yields (tokens per second, drafting
included) with plain decoding, continuously, one per drafter: a step is judged by the guard of
the draft model if one drafted in it (lookup, which costs nothing, rides along), else by lookup's.
A losing guard benches its drafter (the other goes on). A pause doubles up to MAX_PAUSE steps while
the probe after it still loses and halves when the drafter wins again; guards, like costs and
acceptance, are kept across generations, so a misestimate is never run for long and a losing draft
model is not relearned on every prompt. Lookup's pause alone ends with its answer, as its rates do.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field

import numpy as np

SMOOTHING = 0.25  # weight of the newest measurement in the running averages of costs
# Before any pass is measured, each node adds this share of a plain step: on the high side of what
# a resident model's pass costs on a CPU, whose matrix products of a few rows are bound by
# arithmetic (Qwen2.5-Coder-1.5B on 2 cores, default q8x2 activations,
# benchmarks/speculative/verify_cost.py: 1.1-1.3x a plain step at 2 nodes, 1.4-1.7x at 4, 2.3-2.7x
# at 8). A flash-bound pass measures far less after its first pass; guessing low costs losing passes
# until then. A lookup node at its prior must still be worth a pass at this price, or nothing would
# ever be verified and measured (test_lookup_at_its_prior_is_verified_unmeasured).
PRIOR_SLOPE = 0.35
REMEASURE_PLAIN = 32  # a plain step now and then keeps the plain cost current
GUARD_PASSES = 8  # speculative steps whose realized tokens per second are compared with plain decoding
GUARD_MIN = 3  # steps a guard needs before it judges (a probe that loses costs this many steps)
MAX_PAUSE = 64  # longest run of steps without the guarded path between probes while it does not pay
PROBE_EVERY = 16  # a draft model that has not drafted for this many steps drafts once (costs change)
# A draft model's catch-up on the context (a new prompt) serves the steps the answer has yet to take,
# which only its length so far tells: it is charged its share of this many steps, or of the steps
# taken so far when fewer (a 13-token answer to a 201-token question paid a catch-up on the whole
# question, 0.75x plain decoding).
CATCH_UP_HORIZON = 16
FIRST_CATCH_UP = 8  # a draft model that never caught up does so this many steps into an answer
MARGIN = 1.02  # a tree must promise this much more than a plain step, against measurement noise
WIN_MARGIN = 1.1  # a guard shortens its pause only for a path this much faster than plain decoding
RUNNER_UP = "+runner-up"  # suffix of the origin of a draft model's second choice (calibrated apart)
# What one more node costs a draft model's forward of a tree level, in draft forwards: the 0.5B
# draft model forwards 2 nodes in 1.07x and 4 in 1.18x the time of one without a budget, 1.2x and
# 1.2x at 25% of Qwen2.5-Coder-1.5B (a batch reads the weights once).
LEVEL_NODE_SHARE = 0.2
# After this many lookup passes in a row that the target accepted whole, the next pass verifies
# one node more than the best subtree: a whole pass says the tree was cut short by a price, and a
# price that is never paid is never measured again. A 3-node pass measured dear once (1.3-1.7x a
# 2-node pass, 1.18x when quiet) kept answers that copied their passage at one lookup token a pass
# for 26-30 passes, every one accepted (Qwen2.5-Coder-0.5B, grounded prompts, no budget).
EXPLORE_AFTER = 4


def prior_pass_cost(plain: float, width: int) -> float:
    """What a pass of `width` nodes is taken to cost before one is measured (PRIOR_SLOPE)."""
    return plain * (1 + PRIOR_SLOPE * (width - 1))


def _average(old: float | None, new: float, weight: float = SMOOTHING) -> float:
    return new if old is None else (1 - weight) * old + weight * new


class CostModel:
    """Seconds per plain step, per verification pass of each width, and per draft forward.

    A draft model's costs are kept in plain steps (its seconds over the plain step of the moment):
    they are measured only while it drafts, and a draft model that measured dear in a busy moment of
    a shared machine, in seconds, stayed dearer than the plain steps measured after it, drafted no
    more and so was never measured again (no pass in the 10 answers after a slow first one)."""

    def __init__(self) -> None:
        self.plain: float | None = None
        self.verify: dict[int, float] = {}
        self.draft_share: dict[str, float] = {}  # drafter -> a draft forward, in plain steps
        self.catch_up_share: dict[str, float] = {}  # drafter -> a token of a multi-token catch-up, in plain steps
        self._measured: tuple[tuple, dict[int, float]] = ((), {})  # measured(), for the verify it was made from

    def record_plain(self, seconds: float) -> None:
        self.plain = _average(self.plain, seconds)

    def record_verify(self, width: int, seconds: float) -> None:
        self.verify[width] = _average(self.verify.get(width), seconds)

    def record_draft(self, drafter: str, seconds: float) -> None:
        self.draft_share[drafter] = _average(self.draft_share.get(drafter), seconds / (self.plain or 1.0))

    def record_catch_up(self, drafter: str, seconds_per_token: float) -> None:
        self.catch_up_share[drafter] = _average(self.catch_up_share.get(drafter),
                                                seconds_per_token / (self.plain or 1.0))

    def draft(self, drafter: str) -> float:
        """Seconds per draft forward of `drafter` (0 before any is measured)."""
        return self.draft_share.get(drafter, 0.0) * (self.plain or 1.0)

    def catch_up(self, drafter: str) -> float | None:
        """Seconds per token of `drafter`'s catch-up on a context (None before one is measured)."""
        share = self.catch_up_share.get(drafter)
        return None if share is None else share * (self.plain or 1.0)

    def measured(self) -> dict[int, float]:
        """The measured pass costs, each at most what any wider measured pass costs: fewer nodes
        never cost more (the same weights, fewer rows), and a width measured dear in a slow moment
        is not verified, so not measured, again. Kept as measured, a 4-node pass at 1.16 s beside
        0.91 s for 7 nodes (25% budget) stopped every draft at 2 tokens, over later runs too."""
        key = tuple(self.verify.items())  # pass_cost runs tens of times a step: made once per change
        if key != self._measured[0]:
            out, cheapest = {}, float("inf")
            for w in sorted(self.verify, reverse=True):
                cheapest = min(cheapest, self.verify[w])
                out[w] = cheapest
            self._measured = (key, out)
        return self._measured[1]

    def pass_cost(self, width: int) -> float:
        """Seconds for a pass of `width` nodes: measured (measured()), interpolated between measured
        widths, or extrapolated along the least-squares slope of what is measured (before that, a
        prior), never steeper than the prior's: a width priced above the prior is never verified, so
        never measured (a 2-node pass measured in a slow moment would price every longer chain out
        of an answer that copies its prompt)."""
        plain = self.plain or 1.0
        if width <= 1:
            return plain
        verify = self.measured()
        if width in verify:
            return verify[width]
        ws = [1] + sorted(verify)
        vs = [plain] + [verify[w] for w in ws[1:]]
        if len(ws) == 1:
            return prior_pass_cost(plain, width)
        if width < ws[-1]:
            return float(np.interp(width, ws, vs))
        x, y = np.asarray(ws, dtype=float), np.asarray(vs, dtype=float)
        slope = max(0.0, float(np.polyfit(x, y, 1)[0])) if len(ws) > 2 else max(0.0, (vs[-1] - vs[0]) / (ws[-1] - 1))
        return vs[-1] + min(slope, PRIOR_SLOPE * plain) * (width - ws[-1])


class Acceptance:
    """P(the target accepts a drafted node | its parent was accepted), by drafter and evidence."""

    BINS = 10  # draft-model probability bins
    COUNT_CAP = 200.0  # a model bin's counts are halved beyond this, so it keeps adapting
    LOOKUP_PRIOR = 0.5
    # A chain's later tokens, once its first was accepted: text that copies goes on copying. A later
    # token is tested only if a pass verifies it, and at 0.5 none was where passes cost what they do
    # on an AVX2 CPU (`auto` on a grounded answer that copied its passage: 30 single-token passes, all
    # accepted, 1.76x, where lookup alone verified chains of 4, 2.11x). It matters only while first
    # tokens are accepted, and one miss brings it below 0.5.
    LOOKUP_LATER_PRIOR = 0.7
    LOOKUP_SLOTS = 6
    # A chain's first token where an earlier occurrence of the same n-gram went on otherwise (the
    # text contradicts itself there): an alternative, less likely than the most recent occurrence's
    # token. At LOOKUP_PRIOR, three such siblings looked worth 2.5 tokens to a pass that took none,
    # on every pass (a 13-token answer at 0.86x plain decoding, no budget).
    LOOKUP_ALTERNATIVE = 1.0  # the score (slot) of such a first token; n-gram lengths start at 2
    LOOKUP_ALTERNATIVE_PRIOR = 0.2
    LOOKUP_WEIGHT = 0.3  # lookup rates follow the text: the newest outcome weighs this much
    LOOKUP_COUNT_CAP = 50.0  # first-token counts over answers are halved beyond this (they keep adapting)
    # per step without a test, lookup rates drift back toward where an answer starts them and a draft
    # model's recent rate toward its long-run one (so they get tested)
    DRIFT = 0.01
    # How sure the target is of its own tokens tells how often a draft model will agree with it: on
    # Qwen2.5-Coder-1.5B's answers (8 MT-Bench, 3 grounded) the 0.5B's top-1 agreement followed the
    # 1.5B's mean top-1 probability within 0.05 on 9 of 11 answers (0.42-0.98 agreement). Before a
    # draft model joins an answer, its plain steps measure that probability; an answer's mean counts
    # after this many of them.
    CONFIDENCE_STEPS = 4
    USUAL_WEIGHT = 0.25  # the newest answer's weight in the usual confidence
    # A rate scaled up by an answer's confidence goes no higher than a draft model agrees on a usual
    # chat answer (the 0.5B with Qwen2.5-Coder-1.5B: 76%): near certainty, a short answer the target
    # is sure of would take in a long question before the answer shows it is long enough to repay it.
    MAX_JOINING = 0.8

    def __init__(self) -> None:
        self.model: dict[str, np.ndarray] = {}  # drafter -> [BINS, 2] (accepted, tested) with a prior
        # lookup rates: a chain's first token by the length of the n-gram it followed (2-4) or as
        # an alternative (1), then any later token (5): text that repeats itself makes the later
        # ones likely as soon as the first is, so one good pass raises the reach of every depth.
        # lookup_first: where each answer's first-token rates start, their (accepted, tested) counts
        # over earlier answers from the prior lightly. Later tokens always start from the prior: one
        # answer that copied its prompt would otherwise make the next verify long chains that fail.
        priors = self._lookup_priors()[:-1]
        self.lookup_first = np.stack([2 * priors, np.full(priors.size, 2.0)], axis=1)
        self.lookup = self._lookup_start()
        self.model_recent: dict[str, float] = {}  # drafter -> recent acceptance of its nodes
        # the target's top-1 probability at this answer's plain steps before a draft model joined:
        # (sum, count); and the usual mean of that over earlier answers (None before any)
        self.confidence = [0.0, 0]
        self.usual_confidence: float | None = None

    def new_text(self) -> None:
        """A new answer: lookup rates start afresh, since they follow the text (a short answer after
        one that copied its prompt verified wide lookup trees that all failed, 0.73x plain decoding):
        a first token from how often first tokens were accepted in earlier answers, a later token
        from the prior. A draft model's calibration is a property of the model and stays; its recent
        rate starts from its long-run one, so that one hard answer does not keep it from the next."""
        self.lookup[:] = self._lookup_start()
        for origin in self.model_recent:
            self.model_recent[origin] = self.long_run(origin)
        self.usual_confidence = self.usual_after_this_answer()
        self.confidence = [0.0, 0]

    def record_confidence(self, probability: float) -> None:
        """The target's top-1 probability at a plain step before a draft model joined the answer."""
        self.confidence[0] += probability
        self.confidence[1] += 1

    def _answer_confidence(self) -> float | None:
        total, count = self.confidence
        return total / count if count >= self.CONFIDENCE_STEPS else None

    def usual_after_this_answer(self) -> float | None:
        """The usual confidence with this answer's counted in (if it has enough steps)."""
        mine = self._answer_confidence()
        return self.usual_confidence if mine is None else _average(self.usual_confidence, mine, self.USUAL_WEIGHT)

    def joining(self, origin: str) -> float:
        """The rate a draft model that has not drafted in this answer should expect: its recent rate,
        scaled by how sure of itself the target has been in this answer against how sure it usually
        is. Down: the text of a grounded prompt, continued, gave 0.46-0.52 against 0.75-0.80 on chat
        answers; the 0.5B then agreed on 42-58% of tokens, not its long-run 76%, and taking in the
        250-token prompt cost more than drafting gained (0.91-0.94x plain decoding). Up as well: when
        the answers a draft model learned its rate on were hard ones, an easy answer is not left
        plain for that (the rate of a first hard answer, 0.56, would keep the 0.5B out of answers it
        agrees with on up to 98% of tokens), though not above MAX_JOINING:
        what the catch-up is charged (the steps the answer has taken so far, Controller.draft_more)
        then keeps a short answer the target is sure of from a catch-up it cannot repay."""
        mine = self._answer_confidence()
        if mine is None or not self.usual_confidence:
            return self.recent(origin)
        return min(self.MAX_JOINING, self.recent(origin) * mine / self.usual_confidence)

    def _lookup_start(self) -> np.ndarray:
        start = self._lookup_priors()
        start[:-1] = self.lookup_first[:, 0] / self.lookup_first[:, 1]
        return start

    def _lookup_priors(self) -> np.ndarray:
        priors = np.full(self.LOOKUP_SLOTS, self.LOOKUP_PRIOR)
        priors[int(self.LOOKUP_ALTERNATIVE)] = self.LOOKUP_ALTERNATIVE_PRIOR
        priors[-1] = self.LOOKUP_LATER_PRIOR
        return priors

    def _table(self, origin: str) -> np.ndarray:
        if origin not in self.model:
            centers = (np.arange(self.BINS) + 0.5) / self.BINS
            self.model[origin] = np.stack([2 * centers, np.full(self.BINS, 2.0)], axis=1)  # the identity, lightly
        return self.model[origin]

    def estimate(self, origin: str, score: float, depth: int) -> float:
        if origin == "lookup":
            return float(self.lookup[self._lookup_slot(score, depth)])
        table = self._table(origin)
        b = min(self.BINS - 1, int(score * self.BINS))
        return float(table[b, 0] / table[b, 1])

    def _lookup_slot(self, score: float, depth: int) -> int:
        return self.LOOKUP_SLOTS - 1 if depth > 1 else min(self.LOOKUP_SLOTS - 2, max(0, int(score)))

    def recent(self, origin: str) -> float:
        """How often this drafter's nodes were accepted lately (before any: its long-run rate)."""
        return self.model_recent.get(origin, self.long_run(origin))

    def long_run(self, origin: str) -> float:
        """How often this drafter's nodes were accepted over all its calibration counts (0.5 before
        any: the prior's)."""
        table = self._table(origin)
        return float(table[:, 0].sum() / table[:, 1].sum())

    def record(self, origin: str, score: float, depth: int, accepted: bool) -> None:
        if origin == "lookup":
            d = self._lookup_slot(score, depth)
            self.lookup[d] = _average(self.lookup[d], float(accepted), self.LOOKUP_WEIGHT)
            if d < self.LOOKUP_SLOTS - 1:
                self.lookup_first[d] += (float(accepted), 1.0)
                if self.lookup_first[d, 1] > self.LOOKUP_COUNT_CAP:
                    self.lookup_first[d] *= 0.5
            return
        table = self._table(origin)
        b = min(self.BINS - 1, int(score * self.BINS))
        table[b] += (float(accepted), 1.0)
        if table[b, 1] > self.COUNT_CAP:
            table[b] *= 0.5
        if not origin.endswith(RUNNER_UP):
            self.model_recent[origin] = _average(self.model_recent.get(origin), float(accepted), 0.1)

    def drift(self, lookup_tested: bool, drafters_tested: set[str]) -> None:
        if not lookup_tested:
            self.lookup += self.DRIFT * (self._lookup_start() - self.lookup)
        for origin, value in self.model_recent.items():
            if origin not in drafters_tested:
                self.model_recent[origin] = value + self.DRIFT * (self.long_run(origin) - value)


@dataclass
class Selection:
    nodes: list[int]  # tree node indices to verify, root first, parents before children
    expected_tokens: float
    seconds: float  # the estimated cost of the pass


@dataclass
class Guard:
    """Realized tokens and seconds of the last speculative steps, against plain decoding. When they
    lose, the guarded path pauses for `backoff` steps, which doubles while probes keep losing and
    halves while the path wins."""

    passes: list[tuple[int, float]] = field(default_factory=list)
    pause: int = 0
    backoff: int = 1

    def record(self, tokens: int, seconds: float, plain: float | None) -> None:
        self.passes = (self.passes + [(tokens, seconds)])[-GUARD_PASSES:]
        if plain is None or len(self.passes) < GUARD_MIN:
            return
        tokens_total = sum(t for t, _ in self.passes)
        seconds_total = sum(s for _, s in self.passes)
        if tokens_total / seconds_total < 1.0 / plain:  # the guarded path lost to plain decoding lately
            self.pause, self.passes = self.backoff, []
            self.backoff = min(2 * self.backoff, MAX_PAUSE)
        elif tokens_total / seconds_total > WIN_MARGIN / plain and len(self.passes) == GUARD_PASSES:
            self.backoff = max(1, self.backoff // 2)

    def resume(self) -> None:
        """End the current pause; the backoff stays, so a probe that loses again pauses as long."""
        self.pause = 0

    def paused(self) -> bool:
        """Whether the guarded path sits out this step (counts the pause down)."""
        if self.pause > 0:
            self.pause -= 1
            return True
        return False


LOOKUP = "lookup"  # the guard of steps only lookup drafted in; a draft model's guard is under its name


class Controller:
    def __init__(self, max_nodes: int, costs: CostModel, acceptance: Acceptance,
                 guards: dict[str, Guard] | None = None):
        """`guards`: what earlier generations learned of what pays (a new dict if none)."""
        self.max_nodes = max(2, max_nodes)
        self.costs, self.acceptance = costs, acceptance
        self.guards = {} if guards is None else guards
        self.guard = self.guards.setdefault(LOOKUP, Guard())
        # Lookup rates start afresh with each answer (Acceptance.new_text), so does lookup's pause: a
        # pause earned by chat answers covered the next answer, which copied its passage, whole (no
        # pass where lookup alone gave 1.45x).
        self.guard.resume()
        self.steps = 0
        self.last_draft: dict[str, int] = {}  # drafter -> step it last drafted
        self.drafted: set[str] = set()  # draft models that drafted in this answer
        self.whole_passes = 0  # lookup passes in a row the target accepted whole (EXPLORE_AFTER)

    # -- before drafting -------------------------------------------------------------------------

    def plain_now(self) -> bool:
        """Whether this step is a plain one whatever is drafted: no plain cost yet, or time to
        measure it again."""
        self.steps += 1
        return self.costs.plain is None or self.steps % REMEASURE_PLAIN == 0

    def lookup_benched(self) -> bool:
        """Whether lookup sits out this step, after its steps lost (counts its pause down)."""
        return self.guard.paused()

    def draft_more(self, origin: str, reach: float, width: int, first: bool = False, behind: int = 0) -> bool:
        """Whether a draft model should run one more forward for a token under a node reached with
        probability `reach`, the tree already holding `width` nodes worth verifying. `first`: the
        draft's first token this step (a drafter idle for PROBE_EVERY steps drafts it anyway, if
        catching up costs no more than that idle stretch), `behind` context tokens its cache must
        take in first: a long catch-up (a new prompt) is charged its share of the steps it can serve."""
        if width >= self.max_nodes:
            return False
        if first and self.guards.setdefault(origin, Guard()).paused():  # it lost lately: benched
            return False
        if first and behind <= PROBE_EVERY + 2 and \
                self.steps - self.last_draft.get(origin, self.steps) >= PROBE_EVERY:
            return self._drafts(origin)
        draft = self.costs.draft(origin)
        joins = first and origin not in self.drafted
        rate = self.acceptance.joining(origin) if joins else self.acceptance.recent(origin)
        if first and behind > 2:
            catch_up = self.costs.catch_up(origin)
            if catch_up is None:  # what a catch-up costs is measured once, not guessed
                return self.steps >= FIRST_CATCH_UP and self._drafts(origin)
            draft += behind * catch_up / min(CATCH_UP_HORIZON, max(1, self.steps))
        if self._gain(reach, rate, width) > draft:
            if joins:  # its rate in this answer starts from what the target's confidence said
                self.acceptance.model_recent[origin] = rate
            return self._drafts(origin)
        self.last_draft.setdefault(origin, self.steps)
        return False

    def widen(self, origin: str, reach: float, width: int) -> bool:
        """Whether a node reached with probability `reach` joins a draft model's forward of a tree
        level that drafts for a likelier node anyway, the tree holding `width` nodes worth verifying:
        it costs a share of a forward (LEVEL_NODE_SHARE) and its children's place in the pass."""
        if width >= self.max_nodes:
            return False
        return self._gain(reach, self.acceptance.recent(origin), width) > LEVEL_NODE_SHARE * self.costs.draft(origin)

    def _gain(self, reach: float, rate: float, width: int) -> float:
        """Seconds a drafted child of a node reached with probability `reach` saves, the draft model
        being right at `rate`, less what one more node adds to a pass of `width` nodes."""
        extra = self.costs.pass_cost(width + 1) - self.costs.pass_cost(width)
        return reach * rate * (self.costs.plain or 1.0) - extra

    def _drafts(self, origin: str) -> bool:
        """`origin` drafts this step (what the idle-probe rule counts from)."""
        self.last_draft[origin] = self.steps
        self.drafted.add(origin)
        return True

    def record_confidence(self, logits: np.ndarray) -> None:
        """The target's logits at a plain step: its top-1 probability counts while no draft model has
        drafted in this answer (Acceptance.joining); after that it is not computed."""
        if not self.drafted:
            self.acceptance.record_confidence(top_probability(logits))

    # -- choosing the tree -----------------------------------------------------------------------

    def reach(self, tree, node: int, memo: dict[int, float]) -> float:
        """P(node is on the accepted path), from the acceptance estimates of it and its ancestors."""
        if node == 0:
            return 1.0
        if node not in memo:
            memo[node] = self.reach(tree, tree.parents[node], memo) * self._accepted_under_parent(tree, node)
        return memo[node]

    def _accepted_under_parent(self, tree, node: int) -> float:
        """P(the target accepts `node` | its parent was accepted). Siblings are different tokens, so
        at most one of them is accepted: where their estimates add up to more than 1 (each drafter
        judged its own), the likelier ones keep theirs and the others share what is left. (Scaled
        down together, a lookup guess beside a sure draft-model token took a share of the draft's
        whole subtree and the draft model stopped early: at 25% of Qwen2.5-Coder-1.5B `auto` gave 2.35x
        on MT-Bench where the draft model alone gave 2.69x.)"""
        estimates = {i: self.acceptance.estimate(tree.origins[i], tree.scores[i], tree.depth[i])
                     for i in tree.children(tree.parents[node])}
        left = 1.0
        for sibling in sorted(estimates, key=lambda i: (-estimates[i], i)):
            share = min(estimates[sibling], left)
            if sibling == node:
                return share
            left -= share
        return 0.0

    def worth_verifying(self, tree, memo: dict[int, float] | None = None) -> int:
        """How many nodes (the root included) of `tree` the best subtree would have."""
        selection = self.select(tree, memo)
        return len(selection.nodes) if selection else 1

    def select(self, tree, memo: dict[int, float] | None = None, limit: int | None = None,
               beyond: int = 0) -> Selection | None:
        """The subtree with the best expected tokens per second, or None when a plain step is better;
        with `beyond`, that many of the next likeliest nodes as well (select_pass)."""
        memo = {} if memo is None else memo
        limit = min(self.max_nodes, limit or self.max_nodes)
        ranked = sorted(range(1, tree.size), key=lambda i: (-self.reach(tree, i, memo), i))[:limit - 1]
        best_k, best_rate, total = 0, MARGIN / (self.costs.plain or 1.0), 1.0
        for k, node in enumerate(ranked, start=1):
            total += memo[node]
            rate = total / self.costs.pass_cost(k + 1)
            if rate > best_rate:
                best_k, best_rate = k, rate
        if best_k == 0:
            return None
        best_k = min(len(ranked), best_k + beyond)
        nodes = [0] + sorted(ranked[:best_k])
        return Selection(nodes, 1.0 + sum(memo[i] for i in nodes[1:]), self.costs.pass_cost(best_k + 1))

    def select_pass(self, tree, limit: int | None = None) -> Selection | None:
        """The nodes this step verifies: select()'s, and one more after EXPLORE_AFTER lookup passes
        in a row were accepted whole (ranked by reach, the extra node's parent is among them)."""
        explore = self.whole_passes >= EXPLORE_AFTER
        selection = self.select(tree, limit=limit, beyond=int(explore))
        if selection is not None and explore:
            self.whole_passes = 0
        return selection

    # -- after a pass ----------------------------------------------------------------------------

    def record_step(self, model: str | None, tokens: int, seconds: float) -> None:
        """What a step with drafts yielded, drafting included, for the guard of what drafted it:
        draft model `model`'s if it drafted (a step it lost must not bench lookup: a first grounded
        answer the 0.5B draft model lost at 0.76x paused the next two answers whole), else lookup's."""
        guard = self.guard if model is None else self.guards.setdefault(model, Guard())
        guard.record(tokens, seconds, self.costs.plain)

    def record_plain(self, seconds: float) -> None:
        self.costs.record_plain(seconds)
        self.acceptance.drift(False, set())  # nothing was tested this step

    def record_pass(self, tree, path: list[int], verify_s: float) -> None:
        """A verified tree (`path`: the accepted nodes, root first): costs, and every node the
        target tested (a child of an accepted node) as accepted or not."""
        self.costs.record_verify(tree.size, verify_s)
        # Only lookup's passes count: a draft model's price is re-measured by its probes, and its
        # rates are counted in every pass it drafts in.
        lookup_only = all(origin == "lookup" for origin in tree.origins[1:])
        self.whole_passes = self.whole_passes + 1 if lookup_only and len(path) == tree.size else 0
        on_path = set(path)
        tested_lookup, tested_models = False, set()
        for node in range(1, tree.size):
            if tree.parents[node] in on_path:
                origin = tree.origins[node]
                self.acceptance.record(origin, tree.scores[node], tree.depth[node], node in on_path)
                if origin == "lookup":
                    tested_lookup = True
                else:
                    tested_models.add(origin)
        self.acceptance.drift(tested_lookup, tested_models)


def top_probability(logits: np.ndarray) -> float:
    """The probability of the most likely token under softmax(logits)."""
    return float(1.0 / np.exp(logits - logits.max()).sum())


def now() -> float:
    return time.perf_counter()
