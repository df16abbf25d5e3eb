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
    Without the cap eq. (1) counts drafts past a row's end, 4-6 % of K = 8's tokens at 128 new
    tokens a row, and overvalues wide rounds near the end of every row."""
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

    Widths are compared only through rounds run one after the other. The machine's speed drifts:
    between calls K = 0 alone ran at 634 to 859 tok/s (B = 64), and a width's latest rounds may
    come from a slow spell or a fast one. When each width's time was the median of its own last
    5 rounds, at B = 16, T = 1 the chooser priced K = 2 at 1.32 K = 0 rounds and K = 4 at 1.96,
    where they took 1.91 and 2.77. It then ran K = 4 in a third of the rounds, the best fixed K
    being K = 2 by 19 %. Two adjacent rounds share the machine's speed, so the log of their time
    ratio measures the two widths' ratio alone. Each pair of widths keeps the median of its last
    `window` such steps, and `relative` fits one log time per width to all of them (least
    squares, with the model as a faint prior, which fills in widths not yet compared).

    Two guards against a busy machine:
    - A stall makes one round slow, and so two steps wrong, in opposite directions. The median
      of the steps leaves it out. With a running mean of round times, one 20 ms round among
      14 ms ones priced K = 8 below K = 2, and the batch stayed at K = 2 for 50 rounds at two
      thirds of the speed.
    - A width that was not run for `retime_after` rounds of this family is due to run once
      more (WidthSchedule). Only the widths that run are timed, so without this a width whose
      one step came out slow would never run again; each such run adds two steps."""

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
    over its verified positions (the hybrid's lookup rounds among them), older calls decayed by
    call_decay, shrunk towards prior_alpha as a row's estimate is (prior_alpha before any call).

    With prior_alpha alone every call began as if alpha were 0.7. The shipped pair's is 0.89
    at T = 0, and in a traced run at B = 64 a call spent its first 8 of about 36 rounds at
    K = 2, where K = 4 yields more tokens per second. Exact: it reads finished calls only."""

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


@dataclass(slots=True)
class LookupGate:
    """Host-side: whether the hybrid takes a lookup round (no draft model, the widest K) when
    every row's lookup matched the threshold. A long match is no promise on its own: the shipped
    target often leaves a 16-token match of the corpus or of its own text, and a lookup round
    that keeps 2 tokens is slower than a draft round that keeps 5. So the gate compares the two
    kinds of round by tokens per second, each a running mean of what it measured.

    A draft round taken while every lookup was trusted also tells what the lookup would have
    kept: its drafts' agreement with the tokens the round emitted. At T = 0 that is exact up to
    the emitted count (a lower bound there); at T > 0 a guess. It keeps the lookup's estimate
    alive while the gate is shut, so a shut gate opens again when lookups start to agree. The
    lookups themselves cost 4-6 % of a round on the host, so while the gate is shut they run in
    one round of `probe_every` only. Before either side is measured, the gate is open: one
    lookup round measures it. Exact whatever it decides: it reads past rounds only."""

    smoothing: float = 0.3  # weight of the newest measurement
    probe_every: int = 8
    rounds_shut: int = 0  # rounds since the lookups last ran while shut
    lookup_seconds: float | None = None  # per lookup round
    lookup_tokens: float | None = None  # emitted per lookup round (the batch's)
    draft_rate: float | None = None  # tokens per second of the hybrid's own rounds

    def mean(self, old: float | None, new: float) -> float:
        return new if old is None else (1 - self.smoothing) * old + self.smoothing * new

    def open(self) -> bool:
        if None in (self.lookup_seconds, self.lookup_tokens, self.draft_rate):
            return True
        return self.lookup_tokens / self.lookup_seconds >= self.draft_rate

    def should_look(self) -> bool:
        """Whether this round runs the lookups: always while open, one round in probe_every
        while shut."""
        if self.open():
            self.rounds_shut = 0
            return True
        self.rounds_shut = (self.rounds_shut + 1) % self.probe_every
        return self.rounds_shut == 0

    def observe_lookup_round(self, seconds: float, tokens: int) -> None:
        self.lookup_seconds = self.mean(self.lookup_seconds, seconds)
        self.lookup_tokens = self.mean(self.lookup_tokens, tokens)

    def observe_draft_round(self, seconds: float, tokens: int, lookup_tokens: int | None) -> None:
        """lookup_tokens: what a lookup round would have emitted (None: some row's lookup was
        not trusted, so no lookup round was on offer)."""
        self.draft_rate = self.mean(self.draft_rate, tokens / seconds)
        if lookup_tokens is not None:
            self.lookup_tokens = self.mean(self.lookup_tokens, lookup_tokens)


def would_keep(drafts: list[int], emitted: list[int]) -> int:
    """Tokens a round with these drafts would have emitted, judged by the tokens a round did
    emit: 1 + the drafts that agree with them, up to the first that does not."""
    agree = 0
    while agree < min(len(drafts), len(emitted)) and drafts[agree] == emitted[agree]:
        agree += 1
    return 1 + agree


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
