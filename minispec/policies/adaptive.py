"""Adaptive K as a policy: num_speculative_tokens="auto".

Before each round the policy runs the width (AdaptiveConfig.widths, one compiled graph each)
that width_choice.py predicts finishes the call soonest, from two measurements it owns:

- DepthAcceptance: how often a draft at each depth passes once those before it did, counted
  from the rounds' snapshots (n accepted of L drafts);
- RoundTimes: each width's round time, from rounds that follow a round of the same width.

It keeps them across calls, one FamilyMeasurements per graph family (proposer, batch size,
sample methods, all-greedy or not), in a dict the decoder holds (`families`). Exact, like any
policy: it reads finished rounds only.
"""

from __future__ import annotations

import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from minispec.params import AdaptiveConfig, SamplingParams, SpeculativeConfig
from minispec.policies.width_choice import choose_width, time_to_finish
from minispec.proposers import PROPOSERS
from minispec.state import Snapshot


@dataclass(slots=True)
class DepthAcceptance:
    """Decayed counts, per depth d = 1..D, of drafts that reached d (every draft before them
    passed, and the sampler tested them) and of those that passed.

    rates() shrinks each depth's rate towards the depth above it by `prior_weight` pseudo-
    counts (depth 1 towards prior_alpha), so a depth seldom reached borrows its parent's rate
    rather than guessing: a chain that never ran K = 8 prices depth 8 as its deepest measured
    depth."""

    depths: int
    reached: list[float] = field(init=False)
    passed: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.reached, self.passed = [0.0] * self.depths, [0.0] * self.depths

    def observe(self, snapshot: Snapshot, decay: float) -> None:
        """One round's rows: a row with L drafts and n accepted reached depths 1..min(n + 1, L)
        and passed 1..n. A round without drafts leaves the counts as they are."""
        rows = [row for row in snapshot.rows if row.token_ids and row.num_drafts]
        if not rows:
            return
        self.reached = [decay * c for c in self.reached]
        self.passed = [decay * c for c in self.passed]
        for row in rows:
            for d in range(min(row.num_accepted + 1, row.num_drafts, self.depths)):
                self.reached[d] += 1
                self.passed[d] += d < row.num_accepted

    def rates(self, prior_alpha: float, prior_weight: float) -> list[float]:
        rates, parent = [], prior_alpha
        for reached, passed in zip(self.reached, self.passed):
            parent = (passed + prior_weight * parent) / (reached + prior_weight)
            rates.append(parent)
        return rates


@dataclass(slots=True)
class RoundTimes:
    """Each width's round time in seconds: the median of its last `window` steady rounds, those
    that ran right after a round of the same width. The first round after a change of width (a
    different graph, cold caches) and a round that compiled are not a width's time: counted,
    they priced K = 0, run once a call next to a change, out of large batches where it wins.
    A width never timed is priced by Theorem 3.8's cost model, 1 + K c target steps (c: a
    draft step over a target step), scaled from the nearest timed width."""

    c: float
    window: int = 5
    rounds: int = 0  # the family's timed rounds
    seconds: dict[int, deque[float]] = field(default_factory=dict)
    last_timed: dict[int, int] = field(default_factory=dict)  # `rounds` when each was timed
    # The first round after a change of width over that width's time, the latest few
    changes: deque[float] = field(default_factory=lambda: deque(maxlen=9))

    def observe(self, k: int, seconds: float) -> None:
        self.rounds += 1
        self.last_timed[k] = self.rounds
        self.seconds.setdefault(k, deque(maxlen=self.window)).append(seconds)

    def observe_change(self, k: int, seconds: float) -> None:
        """A round at width k that followed a round of another width took `seconds`."""
        if k in self.seconds:
            self.changes.append(seconds / self.of(k))

    def change_cost(self) -> float:
        """What a change of width costs on top of the new width's round, in its rounds."""
        return max(statistics.median(self.changes) - 1, 0.0) if self.changes else 0.0

    def of(self, k: int) -> float:
        """Width k's time: measured, else the cost model's from the nearest measured width (in
        units of a K = 0 round when none is)."""
        if k in self.seconds:
            return statistics.median(self.seconds[k])
        model = lambda width: 1 + width * self.c  # noqa: E731
        near = min(self.seconds, key=lambda w: (abs(w - k), w), default=None)
        if near is None:
            return model(k)
        return statistics.median(self.seconds[near]) * model(k) / model(near)


@dataclass(slots=True)
class FamilyMeasurements:
    """What adaptive K keeps across calls for one graph family."""

    times: RoundTimes
    acceptance: DepthAcceptance


class AdaptivePolicy:
    """Which K each round of one call uses: the width of least predicted time, except that a
    width worth knowing runs twice in a row to be timed (`due`). warm_up: each width once, in
    order, then stop."""

    def __init__(
        self,
        config: AdaptiveConfig,
        family: FamilyMeasurements,
        max_new_tokens: list[int],
        warm_up: bool = False,
    ) -> None:
        self.config, self.family, self.warm_up = config, family, warm_up
        self.widths = config.widths
        self.remaining = list(max_new_tokens)  # per row; 0 once it is done
        self.previous: int | None = None  # the last round's K, if its time was a round's
        self.probe: list[int] = []  # the widths to run next, whatever the prediction says
        self.k = self.widths[0]
        if not warm_up:
            self.k = self.choose()
        self.pending = list(self.widths[1:]) if warm_up else []

    @classmethod
    def for_call(
        cls,
        families: dict[tuple, FamilyMeasurements],
        spec: SpeculativeConfig,
        params: list[SamplingParams],
        warm_up: bool,
        *,
        target: torch.nn.Module,
        draft: torch.nn.Module | None,
        head: torch.nn.Module | None = None,
    ) -> AdaptivePolicy:
        """The policy of one generate() call, with its graph family's measurements (created on
        first use in `families`, which the caller keeps across calls). The models' sizes price
        a width before it was timed (cost_ratio)."""
        # A batch of greedy rows accepts far more often than a sampled one: its own counts,
        # though both run the same graphs.
        greedy = all(p.temperature == 0 for p in params)
        key = (spec.proposer, len(params), spec.draft_method, spec.rejection_sample_method, greedy)
        if key not in families:
            drafter = {"draft": draft, "head": head}.get(PROPOSERS[spec.proposer].needs)
            c = cost_ratio(target, drafter) if drafter is not None else 0.0
            depths = max(spec.adaptive.widths)
            families[key] = FamilyMeasurements(RoundTimes(c), DepthAcceptance(depths))
        max_new = [p.max_new_tokens for p in params]
        return cls(spec.adaptive, families[key], max_new, warm_up)

    def predicted_times(self) -> list[float]:
        """Per width: the time the call has left at that width (width_choice.time_to_finish)."""
        acceptance = self.family.acceptance.rates(self.config.prior_alpha, self.config.prior_weight)
        remaining = max(self.remaining)
        rows = max(sum(r > 0 for r in self.remaining), 1)
        change = self.family.times.change_cost()
        predicted = []
        for k in self.widths:
            round_time = self.family.times.of(k)
            switch = change * round_time if k != self.k else 0.0
            predicted.append(time_to_finish(acceptance, k, round_time, remaining, rows) + switch)
        return predicted

    def choose(self) -> int:
        """The next round's K: a width due for timing, else the prediction's choice."""
        if self.probe:
            return self.probe.pop(0)
        times = self.predicted_times()
        best = choose_width(times, self.config.margin, self.widths.index(self.k))
        due = self.due(times)
        if due is not None and due != best:
            self.probe = [self.widths[due]]  # twice: the first round after a change is not timed
            return self.widths[due]
        return self.widths[best]

    def due(self, times: list[float]) -> int | None:
        """A width to time now: one never timed in this family, else one not timed for
        retime_after rounds whose predicted time is within `probe_within` of the best (a width
        whose last times came out slow would otherwise never run again; one priced out by
        more would lose). Every width is timed once: the cost model that prices it until then
        can be wrong either way (a verify of K + 1 tokens costs more than one, and more so in
        a large batch)."""
        measured, config = self.family.times, self.config
        never = [i for i, k in enumerate(self.widths) if k not in measured.last_timed]
        if never:
            return never[0]
        stale = [
            i
            for i, k in enumerate(self.widths)
            if measured.rounds - measured.last_timed[k] >= config.retime_after
            and times[i] <= min(times) * config.probe_within
        ]
        return min(stale, key=lambda i: measured.last_timed[self.widths[i]], default=None)

    def plan(self) -> int:
        return self.k

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        """After a round at self.k that took `seconds` (None: it compiled): time it if the round
        before ran the same width, count its acceptance, and choose the next K."""
        # A call's last rounds read its longest contexts, at the narrow widths its end calls
        # for: timed, they would price those widths (K = 0 above all) as if every round were
        # that long.
        timed = seconds is not None and max(self.remaining) > max(self.widths)
        if timed and self.previous == self.k:
            self.family.times.observe(self.k, seconds)
        elif timed and self.previous is not None:
            self.family.times.observe_change(self.k, seconds)
        self.previous = None if seconds is None else self.k
        self.family.acceptance.observe(snapshot, self.config.decay)
        for i, row in enumerate(snapshot.rows):
            self.remaining[i] = 0 if row.done else self.remaining[i] - len(row.token_ids)
        if self.warm_up:  # one round per width, whatever the prediction says
            if not self.pending:
                return True
            self.k = self.pending.pop(0)
            return False
        if snapshot.done:
            return True
        self.k = self.choose()
        return False


def cost_ratio(target: torch.nn.Module, draft: torch.nn.Module) -> float:
    """c before any round was timed: a draft step costs about its share of the parameters
    (steps are memory-bound); a proposer without a draft model costs next to nothing (0)."""
    size = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    return size(draft) / size(target)
