"""From the harness's raw runs to its rows: one pooled baseline, speedups and their intervals.

A run's raw record (bench.json) holds, per temperature, method and rotation, one DecodeStats'
counts per prompt category. Every figure a table prints is computed here from those records,
so that a table can be remade from the file (the README's headline is checked that way).

One baseline, K = 0's tokens over its decode seconds pooled over every rotation and category
read: a baseline timed apart for each row drifts on a shared machine. A row's speedup is the
median over rotations of its tok/s over it; its 95 % interval a percentile bootstrap over
rotations, each resample taking the row's runs and K = 0's from the same rotations (the
minutes in which they ran side by side, shuffled within each category). τ, α and per-position
acceptance come from the counts summed over every rotation and category read.
"""

from __future__ import annotations

import random
import statistics
from collections import Counter
from dataclasses import fields
from itertools import zip_longest

from benchmarks.methods import BASELINE, SEQUENTIAL, draft_cost, parse
from minispec.stats import DecodeStats, expected_tokens_per_round

RESAMPLES = 2000
LEVEL = 0.95
ABOVE = 1.10  # a row faster than Theorem 3.8 by more than this factor is marked


def summed(parts: list[DecodeStats], num_speculative_tokens: int | str) -> DecodeStats:
    """Several generate() calls' stats as one: counts and times add, per-position counts add
    position by position, the K histograms merge."""
    total = DecodeStats(num_speculative_tokens)
    for s in parts:
        for f in fields(DecodeStats):
            mine, theirs = getattr(total, f.name), getattr(s, f.name)
            if f.name == "position_accepted":
                pairs = zip_longest(mine, theirs, fillvalue=0)
                total.position_accepted = [a + b for a, b in pairs]
            elif isinstance(mine, Counter):
                mine.update(theirs)
            elif isinstance(mine, (int, float)) and f.name != "num_speculative_tokens":
                setattr(total, f.name, mine + theirs)
    return total


def record(stats: DecodeStats) -> dict:
    """What bench.json keeps of `stats`: every field, from which DecodeStats is rebuilt."""
    return {f.name: getattr(stats, f.name) for f in fields(DecodeStats)}


def rotation_stats(rotations: list[dict], categories: list[str]) -> list[DecodeStats]:
    """Per rotation, the stats of the categories read, summed."""
    k = rotations[0][categories[0]]["num_speculative_tokens"]
    return [summed([DecodeStats(**r[c]) for c in categories], k) for r in rotations]


def rate(stats: list[DecodeStats]) -> float:
    """Tokens over decode seconds, pooled."""
    return sum(s.emitted for s in stats) / sum(s.decode_time for s in stats)


def speedup(row: list[DecodeStats], base: list[DecodeStats], seed: int = 0) -> dict:
    """{"median", "low", "high", "by_rotation"}: the row's speedup over the pooled baseline."""
    pooled = rate(base)
    by_rotation = [s.tokens_per_second / pooled for s in row]
    rng, medians = random.Random(seed), []
    for _ in range(RESAMPLES):
        drawn = [rng.randrange(len(row)) for _ in row]
        pooled = rate([base[i] for i in drawn])
        medians.append(statistics.median(row[i].tokens_per_second / pooled for i in drawn))
    medians.sort()
    tail = (1 - LEVEL) / 2
    return {
        "median": statistics.median(by_rotation),
        "low": medians[int(tail * RESAMPLES)],
        "high": medians[int((1 - tail) * RESAMPLES) - 1],
        "by_rotation": by_rotation,
    }


def predicted(alpha: float, k: int, cost: float) -> float:
    """Theorem 3.8 with the round's drafting cost: (1 - α^(K+1)) / ((1 - α)(cost + 1)), where
    cost is K c for a chain (the theorem as written) and one pass for the parallel drafter."""
    return expected_tokens_per_round(alpha, k) / (cost + 1)


def row(report: dict, temperature: str, label: str, categories: list[str]) -> dict:
    """One method's row at one temperature over `categories`."""
    runs = report["temperatures"][temperature]["runs"]
    stats = rotation_stats(runs[label], categories)
    base = rotation_stats(runs[BASELINE.label], categories)
    total = summed(stats, stats[0].num_speculative_tokens)
    out = {
        "label": label,
        "tokens_per_s": rate(stats),
        "speedup": speedup(stats, base),
        "tau": total.tokens_per_target_forward,
        "alpha": total.alpha,
        "per_position": total.per_position_acceptance,
        "k_histogram": dict(total.k_histogram),
        "c": None,
        "predicted": None,
    }
    method = parse(label) if label != BASELINE.label else BASELINE
    cost = draft_cost(method, report["steps"]["c"])
    if cost is not None and total.alpha is not None:
        # c: one draft forward's cost; a chain takes K of them, the parallel drafter one
        out["c"] = cost / method.k if method.proposer in SEQUENTIAL else cost
        out["predicted"] = predicted(total.alpha, method.k, cost)
        out["above"] = out["speedup"]["median"] > ABOVE * out["predicted"]
    return out


def rows(report: dict, temperature: str, categories: list[str] | None = None) -> list[dict]:
    """Every method's row at `temperature`, over `categories` (default: every one run)."""
    runs = report["temperatures"][temperature]["runs"]
    categories = categories or list(runs[BASELINE.label][0])
    return [row(report, temperature, label, categories) for label in runs]
