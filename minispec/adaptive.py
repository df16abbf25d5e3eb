"""Adaptive K: choose each round's number of drafts from a few compiled widths, by Theorem 3.8.

Leviathan et al.'s Theorem 3.8 says one round of K drafts yields (1 - a^(K+1)) / (1 - a) tokens
in expectation (eq. 1) at a cost of Kc + 1 target steps. A batch shares one K (one compiled
graph per width), so the round's value is the sum of its rows' expected tokens (each capped at
the tokens the row may still keep), divided by the round's measured time at this batch size:
K = 0 wins where drafting cannot pay (a low, or c high, or a verify of K + 1 tokens that costs
much more than one: large batches), and K grows with a.

Exactness: K may depend on anything already emitted, never on this round's randomness. Here it
depends on the running estimate of alpha (past rounds' acceptance) and on past timings only.

alpha per row is an exponentially weighted mean of observed acceptance, shrunk towards a prior:
    alpha = (S + prior * w0) / (W + w0),  S <- decay * S + observed sum,  W <- decay * W + count.
S and W also decay (more slowly) in rounds without drafts, so a row that stopped drafting drifts
back to the prior and is probed again: a bad spell never switches speculation off for good.
The prior is what past calls of the same graph family measured (FamilyPrior), prior_alpha
before the first.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field
from typing import NamedTuple

import torch

from minispec.state import LoopState, Observation, remaining_tokens

DEFAULT_WIDTHS = (0, 2, 4, 8)
# How strongly RoundTimes.relative holds a width to the cost model, against one measured pair
MODEL_WEIGHT = 1e-3


class AlphaEstimate(NamedTuple):
    """Per-row state for LoopState: decayed sums of observed acceptance and of observations."""

    weighted_sum: torch.Tensor  # [B] float64
    weight: torch.Tensor  # [B] float64


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    widths: tuple[int, ...] = DEFAULT_WIDTHS  # each is one compiled round shape
    prior_alpha: float = 0.7  # the prior before any call of a graph family was measured
    prior_weight: float = 2.0  # the prior counts as this many observations
    decay: float = 0.9  # per round with drafts: about the last 10 such rounds matter
    idle_decay: float = 0.99  # per round without: a poor row at K = 0 is probed every ~100 rounds
    call_decay: float = 0.5  # per call, in FamilyPrior: about the last two calls make the prior
    margin: float = 0.02  # a larger K must promise this much more throughput than a smaller one

    def __post_init__(self) -> None:
        w = self.widths
        if not (w and all(isinstance(k, int) and k >= 0 for k in w) and list(w) == sorted(set(w))):
            raise ValueError(f"widths must be distinct ints >= 0 in increasing order, got {w!r}")
        if not 0 <= self.prior_alpha <= 1:
            raise ValueError(f"prior_alpha must be in [0, 1], got {self.prior_alpha}")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")
        for name in ("decay", "idle_decay", "call_decay"):
            if not 0 <= getattr(self, name) < 1:
                raise ValueError(f"{name} must be in [0, 1), got {getattr(self, name)}")
        if not self.margin >= 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")


def initial_estimate(batch_size: int, device: torch.device | str = "cpu") -> AlphaEstimate:
    zeros = torch.zeros(batch_size, dtype=torch.float64, device=device)
    return AlphaEstimate(zeros, zeros.clone())


def update_estimate(
    estimate: AlphaEstimate,
    observed_sum: torch.Tensor,
    observed_count: torch.Tensor,
    decay: float,
    idle_decay: float,
) -> AlphaEstimate:
    """One round's observations per row: e.g. the sum of beta_i = sum_v min(p_i, q_i) over the
    positions it verified and their number; or (noisier) n accepted out of n + 1 tested when a
    rejection ended the round, n out of n when all passed. Rows without drafts pass 0 and 0 and
    forget at the slower idle_decay, so that they drift back to the prior and probe again, but
    seldom: each probe of a poor row costs a round of drafting for little."""
    factor = torch.where(observed_count > 0, decay, idle_decay).double()
    return AlphaEstimate(
        factor * estimate.weighted_sum + observed_sum.double(),
        factor * estimate.weight + observed_count.double(),
    )


def current_alpha(
    estimate: AlphaEstimate, prior_alpha: float | torch.Tensor, prior_weight: float
) -> torch.Tensor:
    """prior_alpha: one for all rows, or each row's [B]."""
    return (estimate.weighted_sum + prior_alpha * prior_weight) / (estimate.weight + prior_weight)


def expected_tokens(
    alpha: torch.Tensor, widths: tuple[int, ...], remaining: torch.Tensor | None = None
) -> torch.Tensor:
    """Eq. (1) for every row and width, [B, W]: sum_{i=0..K} a^i, which is (1 - a^(K+1)) / (1 - a)
    without the 0/0 at a = 1 (there it is K + 1). widths are Python ints: static under compile.

    remaining [B]: the tokens each row may still keep (its max_new_tokens left, 0 once done). A
    round keeps at most that many, so the sum stops at i = remaining - 1: E[min(n + 1, remaining)].
    Without the cap eq. (1) counts drafts past a row's end and overvalues wide rounds near the
    end of every row."""
    i = torch.arange(max(widths) + 1, device=alpha.device)
    upto = i <= torch.tensor(widths, device=alpha.device)[:, None]  # [W, Kmax+1]
    terms = alpha[:, None] ** i  # [B, Kmax+1]
    if remaining is not None:
        terms = terms * (i < remaining[:, None])
    return (terms[:, None, :] * upto).sum(-1)


def choose_width(
    alpha: torch.Tensor,
    remaining: torch.Tensor,
    widths: tuple[int, ...],
    round_time: torch.Tensor,
    margin: float = 0.0,
) -> torch.Tensor:
    """Index into widths (0-d long) maximising the batch's expected tokens per unit time:
    the sum over rows of eq. (1), each capped at the row's remaining tokens (0 for a done row:
    it does not vote), over round_time[w] (any unit, e.g. K = 0 rounds).

    The smallest width within a factor (1 + margin) of the best wins: alpha is an estimate, and
    near break-even its noise would otherwise buy rounds of speculation that lose time.
    Tensor ops only, so it can run inside the compiled round and its result ride in the round's
    one host read."""
    tokens = expected_tokens(alpha.double(), widths, remaining).sum(0)  # [W]
    rate = tokens / round_time.double()
    good_enough = rate * (1 + margin) >= rate.max()
    return good_enough.int().argmax()  # the first True: widths ascend


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
    as a row's estimate is (prior_alpha before any call). A pair's alpha is far from a generic
    prior (the shipped pair's is near 0.9 at T = 0), and starting there would spend a call's
    first rounds at a K too small. Exact: it reads finished calls only."""

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


def next_width(
    state: LoopState, observed: Observation, config: AdaptiveConfig, relative_times: torch.Tensor
) -> tuple[LoopState, torch.Tensor]:
    """Inside the round, after it advanced: fold this round's observations into each row's
    running alpha and choose the next round's width (an index into config.widths, 0-d), which
    rides in the round's snapshot. relative_times [W]: RoundTimes.relative, as of the host's
    last measurement. Only what this round already emitted enters: never the next round's noise."""
    estimate = update_estimate(
        AlphaEstimate(state.estimate_sum, state.estimate_weight),
        observed.beta_sum,
        observed.tested,
        config.decay,
        config.idle_decay,
    )
    alpha = current_alpha(estimate, state.estimate_prior, config.prior_weight)
    remaining = remaining_tokens(state)
    choice = choose_width(alpha, remaining, config.widths, relative_times, config.margin)
    return state._replace(
        estimate_sum=estimate.weighted_sum, estimate_weight=estimate.weight
    ), choice
