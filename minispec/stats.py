"""Decoding statistics and the paper's predictions, one name one meaning (GUIDE.md section 3)."""
from __future__ import annotations

from dataclasses import dataclass, field


def expected_tokens_per_round(alpha: float, k: int) -> float:
    """Leviathan eq. (1): E[tokens per round] = (1 - alpha^(K+1)) / (1 - alpha)."""
    return float(k + 1) if alpha >= 1 else (1 - alpha ** (k + 1)) / (1 - alpha)


def predicted_speedup(alpha: float, k: int, c: float) -> float:
    """Leviathan Theorem 3.8: expected walltime improvement (1 - a^(K+1)) / ((1 - a)(Kc + 1))."""
    return expected_tokens_per_round(alpha, k) / (k * c + 1)


@dataclass(slots=True)
class DecodeStats:
    """Totals over one generate() call, summed over rows (row-rounds count as target forwards)."""

    num_speculative_tokens: int
    rounds: int = 0  # row-rounds: one target forward of one active row
    drafted: int = 0
    accepted: int = 0
    emitted: int = 0
    alpha_sum: float = 0.0  # sum over verified positions of sum_v min(p(v), q(v))
    alpha_count: int = 0
    position_accepted: list[int] = field(default_factory=list)  # i -> rounds with the first i+1 accepted
    batch_rounds: int = 0  # loop iterations (one batched target forward each)
    draft_calls: int = 0  # batched draft forwards
    host_syncs: int = 0  # device->host reads inside rounds, counted where they happen
    time_draft: float = 0.0
    time_verify: float = 0.0
    time_sampler: float = 0.0
    time_other: float = 0.0
    time_prefill: float = 0.0

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
        return self.time_draft + self.time_verify + self.time_sampler + self.time_other

    @property
    def tokens_per_second(self) -> float:
        return self.emitted / self.decode_time if self.decode_time else 0.0

    @property
    def target_forward_time(self) -> float:
        return self.time_verify / max(self.batch_rounds, 1)

    @property
    def draft_step_time(self) -> float | None:
        return self.time_draft / self.draft_calls if self.draft_calls else None

    def cost_ratio(self, target_step_time: float | None = None) -> float | None:
        """c (Definition 3.7): one draft step over one target step. Without a K = 0 run to supply
        the target's single-token step time, this run's (K+1)-token verify step stands in."""
        if self.draft_step_time is None:
            return None
        return self.draft_step_time / (target_step_time or self.target_forward_time)

    def to_dict(self) -> dict:
        return {"num_speculative_tokens": self.num_speculative_tokens, "alpha": self.alpha,
                "draft_acceptance_rate": self.draft_acceptance_rate,
                "mean_acceptance_length": self.mean_acceptance_length,
                "per_position_acceptance": self.per_position_acceptance,
                "tokens_per_target_forward": self.tokens_per_target_forward,
                "tokens_per_second": self.tokens_per_second, "emitted": self.emitted,
                "rounds": self.rounds, "host_syncs_per_round": self.host_syncs / max(self.batch_rounds, 1),
                "c": self.cost_ratio(),
                "time_s": {"prefill": self.time_prefill, "draft": self.time_draft, "verify": self.time_verify,
                           "sampler": self.time_sampler, "other": self.time_other}}

    def summary(self, baseline: "DecodeStats | None" = None) -> str:
        """Human-readable lines; with a K = 0 baseline, measured speedup beside Theorem 3.8."""
        k = self.num_speculative_tokens
        fmt = lambda v: "n/a" if v is None else f"{v:.3f}"  # noqa: E731
        total = self.decode_time or 1.0
        lines = [f"K = {k}: {self.emitted} tokens in {self.decode_time:.3f} s ({self.tokens_per_second:.1f} tok/s)"]
        if k:
            lines += [f"  alpha (mean sum min(p, q))   {fmt(self.alpha)}",
                      f"  draft acceptance rate        {fmt(self.draft_acceptance_rate)}",
                      f"  mean acceptance length       {self.mean_acceptance_length:.3f}",
                      "  per-position acceptance      " + " ".join(f"{a:.2f}" for a in self.per_position_acceptance)]
        lines += [f"  tokens per target forward    {self.tokens_per_target_forward:.3f}",
                  f"  host syncs per round         {self.host_syncs / max(self.batch_rounds, 1):.2f}",
                  "  time split                   " + ", ".join(
                      f"{name} {t / total:.0%}" for name, t in (("draft", self.time_draft), ("verify", self.time_verify),
                                                                ("sampler", self.time_sampler), ("other", self.time_other)))]
        if k:
            c = self.cost_ratio(baseline.target_forward_time if baseline else None)
            lines.append(f"  measured c                   {fmt(c)}" + ("" if baseline else " (vs this run's verify step)"))
            if baseline and self.alpha is not None and c is not None:
                measured = self.tokens_per_second / baseline.tokens_per_second
                predicted = predicted_speedup(self.alpha, k, c)
                lines.append(f"  speedup vs K = 0             {measured:.2f}x measured, {predicted:.2f}x predicted "
                             f"(Theorem 3.8), ratio {measured / predicted:.2f}")
        return "\n".join(lines)
