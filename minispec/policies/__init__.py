"""Policies: what chooses each round's K. The loop (minispec/decode.py) asks its policy twice a
round, through two hooks:

    plan()                      before a round: its K (and what the round needs to choose the next)
    observe(snapshot, seconds)  after it: what the round emitted and how long it took; returns
                                whether the call is over

Why any policy keeps the output exact: a policy sees only rounds that are finished (their
snapshots and times) and the call's requests, never the randomness of the round it plans, which
the round draws itself from (seed, position). So each round is Algorithm 1 at a K fixed before
its noise, every token is drawn from the target's law given the tokens before it, and the whole
sequence keeps the target's law, whatever K each round used.

- FixedK (fixed.py): the same K every round.
- AdaptivePolicy (adaptive.py): num_speculative_tokens="auto", K from Theorem 3.8 each round,
  chosen inside the round (width_choice.py) from per-row estimates the round carries beside the
  batch's state (AdaptiveState).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch

from minispec.policies.width_choice import AdaptiveConfig, AdaptiveState
from minispec.state import LoopState, Snapshot

if TYPE_CHECKING:
    from minispec.stats import DecodeStats


class Plan(NamedTuple):
    num_speculative_tokens: int
    # For a round that chooses the next K itself (adaptive): each width's time, [W].
    relative_times: torch.Tensor | None = None


class Policy(Protocol):
    # Bound into every round of the call: with a config, the round chooses the next K.
    adaptive: AdaptiveConfig | None

    def prepare(self, state: LoopState) -> AdaptiveState | tuple[()]:
        """Before the first round (`state`: the batch's): what the policy carries through the
        call's rounds beside the batch's state (round.RoundState), () for nothing."""

    def plan(self) -> Plan: ...

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        """seconds: the round's time, None when it compiled (its time is not a round's)."""

    def finish(self, stats: DecodeStats) -> None:
        """After the call's last round, with its totals."""
