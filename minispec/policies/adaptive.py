"""Adaptive K as a policy: num_speculative_tokens="auto" (the running alpha and the chooser, which
run inside the round, are width_choice.py).

The round chooses the next K from its rows' running alpha and the widths' relative times
(choose_width, Theorem 3.8), and its choice rides in the snapshot (NEXT_WIDTH). This policy
follows it, times each round per width into the graph family's RoundTimes, runs a width that is
due (never timed, or not lately) once first, and after the call folds its measured alpha into
the family's prior. What it keeps across calls is one FamilyMeasurements per graph family
(proposer, batch size, sample methods) and kind of batch (all greedy or not), in a dict the
decoder holds and hands to every call (`families`).
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from minispec.params import SamplingParams, SpeculativeConfig
from minispec.policies import Plan
from minispec.policies.width_choice import (
    AdaptiveConfig,
    AdaptiveState,
    AlphaEstimate,
    choose_width,
    current_alpha,
    initial_estimate,
    update_estimate,
)
from minispec.proposers import PROPOSERS
from minispec.state import LoopState, Snapshot
from minispec.stats import DecodeStats

# How strongly RoundTimes.relative holds a width to the cost model, against one measured pair
MODEL_WEIGHT = 1e-3


@dataclass(slots=True)
class RoundTimes:
    """Host-side round times per width at the current batch size, for choose_width, in units of
    a K = 0 round.

    Before a width is measured its time comes from Theorem 3.8's cost model, 1 + K c
    (c: the draft step over the target step). Keep one per compiled graph family (batch size,
    sample methods), and never pass it a round that compiled: one such time (seconds to
    minutes) would price its width out for good.

    Widths are compared only through rounds run one after the other: the machine's speed
    drifts, and two adjacent rounds share it, so the log of their time ratio measures the two
    widths' ratio alone. Each pair of widths keeps the median of its last `window` such steps
    (a stall makes one round slow and so two steps wrong; the median leaves them out), and
    `relative` fits one log time per width to all of them (least squares, with the model as a
    faint prior, which fills in widths not yet compared). Only the widths that run are timed,
    so a width not run for `retime_after` rounds of this family is due to run once more
    (AdaptivePolicy): else a width whose one step came out slow would never run again."""

    c: float
    window: int = 9
    retime_after: int = 128
    rounds: int = 0  # measured rounds of this family
    last_timed: dict[int, int] = field(default_factory=dict)  # `rounds` when each was timed
    # (a, b) with a < b: log(time at b / time at a) of adjacent rounds, the latest
    steps: dict[tuple[int, int], deque[float]] = field(default_factory=dict)

    def observe(self, k: int, seconds: float, previous: tuple[int, float] | None = None) -> None:
        """A round at width k took `seconds`; previous: the (width, seconds) of the round just
        before it in the same call, if that one was timed."""
        self.rounds += 1
        self.last_timed[k] = self.rounds
        if previous is None or previous[0] == k:
            return
        (a, time_a), (b, time_b) = sorted([previous, (k, seconds)])
        self.steps.setdefault((a, b), deque(maxlen=self.window)).append(math.log(time_b / time_a))

    def due(self, widths: tuple[int, ...]) -> int | None:
        """The width to time next, if any: one never timed, else the longest untimed of those
        not run for retime_after rounds."""
        never = [k for k in widths if k not in self.last_timed]
        if never:
            return never[0]
        stale = [k for k in widths if self.rounds - self.last_timed[k] >= self.retime_after]
        return min(stale, key=self.last_timed.__getitem__, default=None)

    def relative(self, widths: tuple[int, ...]) -> torch.Tensor:
        """[W] times in units of widths[0]'s round (K = 0's): the log times that best fit the
        median step of every pair compared, each pulled towards the model's by MODEL_WEIGHT
        against one pair's weight of 1. The pull decides only what no pair reaches: a width
        never compared, and the common scale, which the ratios choose_width takes ignore."""
        index = {k: i for i, k in enumerate(widths)}
        pairs = [
            (a, b, statistics.median(steps))
            for (a, b), steps in self.steps.items()
            if a in index and b in index
        ]
        rows = torch.zeros(len(pairs) + len(widths), len(widths), dtype=torch.float64)
        target = torch.zeros(len(pairs) + len(widths), dtype=torch.float64)
        for row, (a, b, step) in enumerate(pairs):
            rows[row, index[b]], rows[row, index[a]], target[row] = 1.0, -1.0, step
        for i, k in enumerate(widths):
            rows[len(pairs) + i, i] = MODEL_WEIGHT
            target[len(pairs) + i] = MODEL_WEIGHT * math.log(1 + k * self.c)
        log_times = torch.linalg.lstsq(rows, target[:, None]).solution[:, 0]
        return torch.exp(log_times - log_times[0])


@dataclass(slots=True)
class FamilyPrior:
    """Host-side: the alpha a new call's rows start from, and drift back to, for one graph
    family (as RoundTimes): the alpha the family's past calls measured, each call's beta pooled
    over its verified positions, older calls decayed by call_decay, shrunk towards prior_alpha
    as a row's estimate is (prior_alpha before any call). A pair's alpha can be far from a
    generic prior (higher at T = 0 than at T = 1), and starting there would spend a call's
    first rounds at a K too far off. Exact: it reads finished calls only."""

    estimate: AlphaEstimate = field(default_factory=lambda: initial_estimate(1))

    def observe_call(self, alpha_sum: float, alpha_count: int, config: AdaptiveConfig) -> None:
        """One finished call's totals (DecodeStats.alpha_sum, alpha_count)."""
        self.estimate = update_estimate(
            self.estimate,
            torch.tensor([alpha_sum]),
            torch.tensor([alpha_count]),
            config.call_decay,
            config.call_decay,
        )

    def alpha(self, config: AdaptiveConfig) -> float:
        return float(current_alpha(self.estimate, config.prior_alpha, config.prior_weight))


@dataclass(slots=True)
class FamilyMeasurements:
    """What adaptive K keeps across calls for one graph family (proposer, batch size, sample
    methods): its round times per width, and the alpha its calls measured."""

    times: RoundTimes
    prior: FamilyPrior = field(default_factory=FamilyPrior)


class AdaptivePolicy:
    """Which K each round of one call uses: the first round's from the prior (first_width),
    then the width each round chose for the next; but a width that is due (RoundTimes.due) runs
    once first. The cost model 1 + K c that prices an untimed width can be far off (at large
    batches a verify of K + 1 tokens costs much more than one), and a width that looks too dear
    is never run, so never timed: one round each settles it. warm_up: each width once, in
    order, then stop."""

    def __init__(
        self,
        adaptive: AdaptiveConfig,
        family: FamilyMeasurements,
        warm_up: bool = False,
        device: torch.device | str = "cpu",
    ) -> None:
        self.adaptive, self.family, self.warm_up, self.device = adaptive, family, warm_up, device
        self.widths, self.times = adaptive.widths, family.times
        self.k, *self.pending = self.widths
        self.relative_times = self.times.relative(self.widths)  # what the round weighs K by
        self.previous: tuple[int, float] | None = None  # the last round's (K, seconds), if timed
        self.prior_alpha = family.prior.alpha(adaptive)

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
        device: torch.device | str = "cpu",
    ) -> AdaptivePolicy:
        """The policy of one generate() call, with its graph family's measurements (created on
        first use in `families`, which the caller keeps across calls). target, draft and head:
        the models, whose sizes price a width before it was timed (cost_ratio)."""
        # A batch of greedy rows accepts far more often than a sampled one: its own prior,
        # though both run the same graphs.
        greedy = all(p.temperature == 0 for p in params)
        key = (spec.proposer, len(params), spec.draft_method, spec.rejection_sample_method, greedy)
        if key not in families:
            drafter = {"draft": draft, "head": head}.get(PROPOSERS[spec.proposer].needs)
            c = cost_ratio(target, drafter) if drafter is not None else 0.0
            families[key] = FamilyMeasurements(RoundTimes(c))
        policy = cls(spec.adaptive, families[key], warm_up, device)
        if not warm_up:
            policy.k = policy.first_width([p.max_new_tokens for p in params])
        return policy

    def first_width(self, max_new_tokens: list[int]) -> int:
        """The first round's K, every row at the prior alpha with all its max_new_tokens to go
        (later rounds choose inside the round). Host tensors: no device read."""
        index = choose_width(
            torch.full((len(max_new_tokens),), self.prior_alpha, dtype=torch.float64),
            torch.tensor(max_new_tokens),
            self.widths,
            self.relative_times,
            self.adaptive.margin,
        )
        return self.widths[int(index)]

    def prepare(self, state: LoopState) -> AdaptiveState:
        """Every row's running alpha starts from, and drifts back to, the family's prior."""
        return AdaptiveState.start(state.tokens.shape[0], self.prior_alpha, state.tokens.device)

    def plan(self) -> Plan:
        return Plan(self.k, self.relative_times.to(self.device))

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        return self.follow(seconds, snapshot.next_width, snapshot.done)

    def follow(self, seconds: float | None, next_width: int, done: bool) -> bool:
        """After a round at width self.k that took `seconds` (None: it compiled) and chose
        widths[next_width] for the next: time it, follow its choice (or run a width that is
        due), and say whether the call is over (`done`: every row is)."""
        if seconds is not None:
            self.times.observe(self.k, seconds, self.previous)
            if self.previous is not None and self.previous[0] != self.k:  # a new step
                self.relative_times = self.times.relative(self.widths)
        # A round that compiled breaks the chain: the rounds around it are not adjacent.
        self.previous = None if seconds is None else (self.k, seconds)
        if self.warm_up:  # one round per width, whatever the rounds chose
            if not self.pending:
                return True
            self.k = self.pending.pop(0)
            return False
        due = self.times.due(self.widths)
        self.k = self.widths[next_width] if due is None else due
        return done

    def finish(self, stats: DecodeStats) -> None:
        self.family.prior.observe_call(stats.alpha_sum, stats.alpha_count, self.adaptive)


def cost_ratio(target: torch.nn.Module, draft: torch.nn.Module) -> float:
    """c before any round was timed: a draft step costs about its share of the parameters
    (steps are memory-bound); a proposer without a draft model costs next to nothing (0)."""
    size = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    return size(draft) / size(target)
