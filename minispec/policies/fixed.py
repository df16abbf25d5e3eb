"""A fixed K: the same number of drafts every round (K = 0: the target alone, the baseline)."""

from __future__ import annotations

from minispec.policies import Plan
from minispec.state import LoopState, Snapshot
from minispec.stats import DecodeStats


class FixedK:
    """`warm_up`: one round, then stop (it compiles the one graph the call uses)."""

    adaptive = None

    def __init__(self, num_speculative_tokens: int, warm_up: bool = False) -> None:
        self.k, self.warm_up = num_speculative_tokens, warm_up

    def prepare(self, state: LoopState) -> tuple[()]:
        return ()  # the rounds carry nothing for a fixed K

    def plan(self) -> Plan:
        return Plan(self.k)

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        return self.warm_up or snapshot.done

    def finish(self, stats: DecodeStats) -> None:
        pass
