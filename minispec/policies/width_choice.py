"""Adaptive K inside the round: each row's running alpha, and the next round's width chosen from
a few compiled widths by Theorem 3.8. The policy around it is adaptive.py.

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
The prior is what past calls of the same graph family measured (adaptive.FamilyPrior),
prior_alpha before the first.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import NamedTuple

import torch

from minispec.state import AlphaStatistics, LoopState, remaining_tokens
from minispec.stats import expected_tokens_per_round

DEFAULT_WIDTHS = (0, 2, 4, 8)


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


class AlphaEstimate(NamedTuple):
    """A running alpha: decayed sums of observed acceptance and of observations, one per row
    (or one per graph family, in FamilyPrior)."""

    weighted_sum: torch.Tensor  # [B] float64
    weight: torch.Tensor  # [B] float64


class AdaptiveState(NamedTuple):
    """What adaptive K carries from round to round beside the batch's LoopState (the round's
    RoundState): each row's running alpha, and the prior it starts from and drifts back to."""

    estimate: AlphaEstimate
    prior: torch.Tensor  # [B] float64

    @classmethod
    def start(
        cls, batch_size: int, prior_alpha: float, device: torch.device | str = "cpu"
    ) -> AdaptiveState:
        """Before the first round: nothing observed, every row at prior_alpha."""
        prior = torch.full((batch_size,), prior_alpha, dtype=torch.float64, device=device)
        return cls(initial_estimate(batch_size, device), prior)


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
    """Eq. (1) for every row and width, [B, W], each capped at the tokens its row may still keep,
    remaining [B] (0 once done; docs/extensions.md). widths: Python ints, static under compile."""
    k = torch.tensor(widths, device=alpha.device)  # [W]
    if remaining is not None:
        k = torch.minimum(k, remaining[:, None] - 1)  # [B, W]
    return expected_tokens_per_round(alpha[:, None], k)


def choose_width(
    alpha: torch.Tensor,
    remaining: torch.Tensor,
    widths: tuple[int, ...],
    round_time: torch.Tensor,
    margin: float = 0.0,
) -> torch.Tensor:
    """Index into widths (0-d long) maximising the batch's expected tokens (expected_tokens,
    summed over rows) per unit of round_time[w] (any unit, e.g. K = 0 rounds); the smallest
    width within a factor (1 + margin) of the best wins. Tensor ops only (docs/extensions.md)."""
    tokens = expected_tokens(alpha.double(), widths, remaining).sum(0)  # [W]
    rate = tokens / round_time.double()
    good_enough = rate * (1 + margin) >= rate.max()
    return good_enough.int().argmax()  # the first True: widths ascend


def next_width(
    state: LoopState,
    adaptive_state: AdaptiveState,
    alpha_stats: AlphaStatistics,
    config: AdaptiveConfig,
    relative_times: torch.Tensor,
) -> tuple[AdaptiveState, torch.Tensor]:
    """Inside the round, after it advanced to `state`: fold this round's alpha statistics into
    each row's running alpha and choose the next round's width (an index into config.widths,
    0-d), which rides in the round's snapshot. relative_times [W]: the widths' times as the
    policy last measured them (adaptive.RoundTimes.relative). Only what this round already
    emitted enters: never the next round's noise."""
    estimate = update_estimate(
        adaptive_state.estimate,
        alpha_stats.beta_sum,
        alpha_stats.tested,
        config.decay,
        config.idle_decay,
    )
    alpha = current_alpha(estimate, adaptive_state.prior, config.prior_weight)
    remaining = remaining_tokens(state)
    choice = choose_width(alpha, remaining, config.widths, relative_times, config.margin)
    return adaptive_state._replace(estimate=estimate), choice
