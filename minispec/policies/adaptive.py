"""Adaptive K as a policy: num_speculative_tokens="auto" (the estimator and the chooser, which run
inside the round, are minispec/adaptive.py).

The round chooses the next K from its rows' running alpha and the widths' relative times
(choose_width, Theorem 3.8), and its choice rides in the snapshot (NEXT_WIDTH). This policy
follows it, times each round per width into the graph family's RoundTimes, runs a width that is
due (never timed, or not lately) once first, and after the call folds its measured alpha into
the family's prior. What it keeps across calls is one FamilyMeasurements per graph family
(proposer, batch size, sample methods) and kind of batch (all greedy or not) in the decoder's
`families`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

from minispec.adaptive import AdaptiveConfig, FamilyMeasurements, RoundTimes, choose_width
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.policies import Plan
from minispec.proposers import PROPOSERS
from minispec.state import LoopState, Snapshot
from minispec.stats import DecodeStats

if TYPE_CHECKING:
    from minispec.decode import SpeculativeDecoder


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
        decoder: SpeculativeDecoder,
        spec: SpeculativeConfig,
        params: list[SamplingParams],
        warm_up: bool,
    ) -> AdaptivePolicy:
        """The policy of one generate() call, with its graph family's measurements (created on
        first use in decoder.families)."""
        # A batch of greedy rows accepts far more often than a sampled one: its own prior,
        # though both run the same graphs.
        greedy = all(p.temperature == 0 for p in params)
        key = (spec.proposer, len(params), spec.draft_method, spec.rejection_sample_method, greedy)
        if key not in decoder.families:
            drafts = PROPOSERS[spec.proposer].needs == "draft"
            c = cost_ratio(decoder.target, decoder.draft) if drafts else 0.0
            decoder.families[key] = FamilyMeasurements(RoundTimes(c))
        policy = cls(spec.adaptive, decoder.families[key], warm_up, decoder.device)
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

    def prepare(self, state: LoopState) -> LoopState:
        """Every row's running alpha starts from, and drifts back to, the family's prior."""
        return state._replace(estimate_prior=torch.full_like(state.alpha_sum, self.prior_alpha))

    def plan(self) -> Plan:
        return Plan(self.k, self.relative_times.to(self.device))

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        return self.advance(seconds, snapshot.next_width, snapshot.done)

    def advance(self, seconds: float | None, next_width: int, done: bool) -> bool:
        """After a round at width self.k that took `seconds` (None: it compiled) and chose
        widths[next_width] for the next: set the next round's K, and say whether the call is
        over (`done`: every row is)."""
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
