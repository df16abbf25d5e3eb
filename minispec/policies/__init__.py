"""Policies: what chooses each round's K. The loop (minispec/decode.py) asks its policy twice a
round, through two hooks:

    plan()                      before a round: its K
    observe(snapshot, seconds)  after it: what the round emitted and how long it took; returns
                                whether the call is over

Why any policy keeps the output exact: a policy sees only rounds that are finished (their
snapshots and times) and the call's requests, never the randomness of the round it plans, which
the round draws itself from (seed, position). So each round is Algorithm 1 at a K fixed before
its noise, every token is drawn from the target's law given the tokens before it, and the whole
sequence keeps the target's law, whatever K each round used. What a policy measures it keeps
itself, on the host: the round never sees it.

- FixedK (here): the same K every round (K = 0: the target alone, the baseline).
- AdaptivePolicy (adaptive.py): num_speculative_tokens="auto", the K predicted to finish the
  call soonest (width_choice.py) from measured per-depth acceptance and round times.
"""

from __future__ import annotations

from typing import Protocol

from minispec.state import Snapshot


class Policy(Protocol):
    def plan(self) -> int: ...

    # seconds: the round's time, None when it compiled (its time is not a round's)
    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool: ...


class FixedK:
    """The same K every round. `warm_up`: one round, then stop (it compiles the one graph the
    call uses)."""

    def __init__(self, num_speculative_tokens: int, warm_up: bool = False) -> None:
        self.k, self.warm_up = num_speculative_tokens, warm_up

    def plan(self) -> int:
        return self.k

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        return self.warm_up or snapshot.done
