"""How much to speculate each step: the tree size and draft depth with the best expected tokens
per second, or a plain single-token step when no tree pays.

Two things are measured apart, because they change at different speeds:
- cost: seconds per verification pass for each size of tree, and per plain step. A property of
  the machine and the budget: when weights stream from flash a 16-node pass costs about what a
  plain step costs; in memory a pass costs more the more nodes it has.
- reach: for each depth d, how often a pass accepts at least d drafted tokens. A property of the
  text, which can turn in one token (an answer starts repeating a passage, or leaves it).

One averaged rate per tree size would mix the two, so one bad stretch would leave every size's
estimate stale and speculation off long after the text began to repeat. Here one good pass
raises the reach of every size at once, and while speculation does not pay the controller
drafts again (a probe, whatever the estimates say: only a pass can raise them) after a pause that
doubles from one step up to MAX_PAUSE and resets as soon as a pass pays.
"""

from __future__ import annotations

TREE_SIZES = (4, 8, 16)  # nodes per verification, root included
SHALLOW_DEPTH = 8  # deepest draft while the whole of one this deep is not usually accepted
MAX_PAUSE = 8  # longest run of plain steps between probes while speculation does not pay
REMEASURE_PLAIN = 32  # a plain step now and then keeps the plain cost current
PRIOR_REACH = 0.5  # before any pass, half of the drafted tokens are expected to be accepted
SMOOTHING = 0.3  # weight of the newest measurement in the running averages


def _average(old: float | None, new: float) -> float:
    return new if old is None else (1 - SMOOTHING) * old + SMOOTHING * new


class Controller:
    def __init__(self, max_nodes: int):
        self.sizes = [s for s in TREE_SIZES if s <= max_nodes] or [max(2, max_nodes)]
        self.cost: dict[int, float] = {}  # tree size bucket -> seconds per pass, drafting included
        self.plain_cost: float | None = None
        self.reach = [1.0] + [PRIOR_REACH] * (self.sizes[-1] - 1)  # reach[d]: P(accepted >= d)
        self.steps = 0
        self.pause = 0
        self.backoff = 1
        self.probe_due = False  # after a pause: draft once more whatever the estimates say

    def choose(self) -> tuple[int, int] | None:
        """(nodes, depth) for the drafter, or None for a plain step."""
        self.steps += 1
        if self.plain_cost is None or self.steps % REMEASURE_PLAIN == 0:
            return None
        if self.pause > 0:
            self.pause -= 1
            self.probe_due = self.pause == 0
            return None
        best = max(self.sizes, key=self.rate)
        if not self.probe_due and best in self.cost and self.rate(best) < 1.0 / self.plain_cost:
            self.pause = self.backoff
            self.backoff = min(2 * self.backoff, MAX_PAUSE)
            return None
        return best, self.depth(best)

    def depth(self, size: int) -> int:
        """Shallow drafts leave nodes for other branches; go deeper only while whole shallow
        drafts are being accepted (text that repeats itself)."""
        shallow = min(size - 1, SHALLOW_DEPTH)
        return size - 1 if self.reach[shallow] > 0.5 else shallow  # not on the prior alone

    def expected_tokens(self, size: int) -> float:
        """Tokens a pass is expected to yield: the bonus token plus every depth the draft reaches."""
        total, bound = 1.0, 1.0
        for d in range(1, self.depth(size) + 1):
            bound = min(bound, self.reach[d])  # accepting d tokens needs accepting d - 1 first
            total += bound
        return total

    def rate(self, size: int) -> float:
        """Expected tokens per second for trees of `size`; a size not yet measured is costed like
        the largest measured one below it, so it gets tried."""
        cost = self.cost.get(size)
        if cost is None:
            below = [self.cost[s] for s in self.sizes if s < size and s in self.cost]
            cost = max(below) if below else (self.plain_cost or 1.0)
        return self.expected_tokens(size) / max(cost, 1e-9)

    def bucket(self, nodes: int) -> int:
        return next((s for s in self.sizes if nodes <= s), self.sizes[-1])

    def record(self, nodes: int, depth: int, tokens: int, seconds: float) -> None:
        """One verified pass: a tree of `nodes` nodes, `depth` deep, yielded `tokens` tokens."""
        self.probe_due = False
        size = self.bucket(nodes)
        self.cost[size] = _average(self.cost.get(size), seconds)
        for d in range(1, min(depth, len(self.reach) - 1) + 1):
            self.reach[d] = _average(self.reach[d], 1.0 if tokens - 1 >= d else 0.0)
        if self.plain_cost is not None and tokens / max(seconds, 1e-9) >= 1.0 / self.plain_cost:
            self.backoff = 1

    def record_plain(self, seconds: float) -> None:
        self.plain_cost = _average(self.plain_cost, seconds)
