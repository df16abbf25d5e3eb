"""A fixed K: the same number of drafts every round (K = 0: the target alone, the baseline)."""

from __future__ import annotations

from minispec.state import Snapshot


class FixedK:
    """`warm_up`: one round, then stop (it compiles the one graph the call uses)."""

    def __init__(self, num_speculative_tokens: int, warm_up: bool = False) -> None:
        self.k, self.warm_up = num_speculative_tokens, warm_up

    def plan(self) -> int:
        return self.k

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        return self.warm_up or snapshot.done
