"""Decoding statistics and the paper's predictions: one name, one meaning.

alpha is the mean over verified positions of sum_v min(p(v), q(v)) (Leviathan Cor. 3.6); the
draft acceptance rate is accepted / drafted (vLLM's "acceptance rate", smaller than alpha); the
mean acceptance length is 1 + accepted / rounds, which eq. (1) predicts.
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import torch


def expected_tokens_per_round(alpha, k):
    """Leviathan eq. (1): E[tokens per round] = (1 - alpha^(K+1)) / (1 - alpha), the sum of
    alpha^i for i = 0..K (K + 1 at alpha = 1; K = -1 gives 0). alpha and K are numbers (a float
    comes back) or tensors that broadcast."""
    a = torch.as_tensor(alpha, dtype=torch.float64)
    tokens = torch.where(a >= 1, k + 1, (1 - a ** (k + 1)) / (1 - a))
    return tokens if isinstance(alpha, torch.Tensor) else float(tokens)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan Theorem 3.8: expected walltime improvement (1 - a^(K+1)) / ((1 - a)(Kc + 1))."""
    return expected_tokens_per_round(alpha, k) / (k * c + 1)


@dataclass(slots=True)
class DecodeStats:
    """Totals over one generate() call, summed over rows (row-rounds count as target forwards).
    With num_speculative_tokens = "auto", per-position acceptance counts every round, whatever
    its K, and k_histogram says how many batch rounds ran at each K."""

    num_speculative_tokens: int | str
    rounds: int = 0  # row-rounds: one target forward of one active row
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    alpha_sum: float = 0.0  # sum over verified positions of sum_v min(p(v), q(v))
    alpha_count: int = 0
    position_accepted: list[int] = field(default_factory=list)  # i -> rounds, first i+1 accepted
    batch_rounds: int = 0  # loop iterations (one batched target forward each)
    k_histogram: Counter = field(default_factory=Counter)  # K -> batch rounds that used it
    compiled_calls: int = 0  # calls into compiled code inside rounds: one guard check each
    host_syncs: int = 0  # device->host reads inside rounds, counted where they happen
    time_prefill: float = 0.0
    time_round: float = 0.0  # the rounds themselves, each up to and including its host read
    time_emit: float = 0.0  # handing tokens to the caller, streaming callback included
    time_lookup: float = 0.0  # a host proposer's lookups (suffix), part of time_round

    def count_round(self, seconds: float, host_reads: int, compiled_calls: int, k: int) -> None:
        self.batch_rounds += 1
        self.k_histogram[k] += 1
        self.time_round += seconds
        self.host_syncs += host_reads
        self.compiled_calls += compiled_calls

    @property
    def alpha(self) -> float | None:
        return self.alpha_sum / self.alpha_count if self.alpha_count else None

    @property
    def draft_acceptance_rate(self) -> float | None:
        return self.accepted / self.drafted if self.drafted else None

    @property
    def mean_acceptance_length(self) -> float:
        return 1 + self.accepted / max(self.rounds, 1)

    @property
    def per_position_acceptance(self) -> list[float]:
        return [a / max(self.rounds, 1) for a in self.position_accepted]

    @property
    def tokens_per_target_forward(self) -> float:
        return self.emitted / max(self.rounds, 1)

    @property
    def decode_time(self) -> float:
        return self.time_round + self.time_emit

    @property
    def tokens_per_second(self) -> float:
        return self.emitted / self.decode_time if self.decode_time else 0.0

    @property
    def round_time(self) -> float:
        return self.per_round(self.time_round)

    def per_round(self, total: float) -> float:
        return total / max(self.batch_rounds, 1)

    def speedup_over(self, baseline: "DecodeStats") -> float | None:
        """The measured speedup: tokens per second against a K = 0 baseline's (None when the
        baseline's rate could not be measured)."""
        base = baseline.tokens_per_second
        return self.tokens_per_second / base if base else None

    def to_dict(self) -> dict:
        return {
            "num_speculative_tokens": self.num_speculative_tokens,
            "alpha": self.alpha,
            "draft_acceptance_rate": self.draft_acceptance_rate,
            "mean_acceptance_length": self.mean_acceptance_length,
            "per_position_acceptance": self.per_position_acceptance,
            "tokens_per_target_forward": self.tokens_per_target_forward,
            "tokens_per_second": self.tokens_per_second,
            "emitted": self.emitted,
            "rounds": self.rounds,
            "host_syncs_per_round": self.per_round(self.host_syncs),
            "compiled_calls_per_round": self.per_round(self.compiled_calls),
            "k_histogram": dict(sorted(self.k_histogram.items())),
            "time_s": {
                "prefill": self.time_prefill,
                "rounds": self.time_round,
                "emit": self.time_emit,
                "lookup": self.time_lookup,
            },
        }

    def summary(self, baseline: "DecodeStats | None" = None) -> str:
        """Human-readable lines; with a K = 0 baseline, the measured speedup."""
        k = self.num_speculative_tokens
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        lines = [
            f"K = {k}: {self.emitted} tokens in {self.decode_time:.3f} s "
            f"({self.tokens_per_second:.1f} tok/s)"
        ]
        if k:
            lines += [
                f"  alpha (mean sum min(p, q))   {fmt(self.alpha)}",
                f"  draft acceptance rate        {fmt(self.draft_acceptance_rate)}",
                f"  mean acceptance length       {self.mean_acceptance_length:.3f}",
                "  per-position acceptance      "
                + " ".join(f"{a:.2f}" for a in self.per_position_acceptance),
            ]
        if k == "auto":
            lines.append(
                "  K chosen (K: rounds)         "
                + " ".join(f"{w}: {n}" for w, n in sorted(self.k_histogram.items()))
            )
        lines += [
            f"  tokens per target forward    {self.tokens_per_target_forward:.3f}",
            f"  host syncs per round         {self.per_round(self.host_syncs):.2f}",
            f"  guard checks per round       {self.per_round(self.compiled_calls):.2f}",
            f"  time per round               {1e3 * self.round_time:.2f} ms "
            f"(+ {1e3 * self.per_round(self.time_emit):.2f} ms handing tokens out)",
        ]
        if k and baseline:
            speedup = self.speedup_over(baseline)
            measured = "n/a" if speedup is None else f"{speedup:.2f}x"
            lines.append(f"  speedup vs K = 0             {measured} measured")
        return "\n".join(lines)
