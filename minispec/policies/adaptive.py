"""Adaptive K as a policy: num_speculative_tokens="auto".

Before each round the policy runs the width (AdaptiveConfig.widths, one compiled graph each)
that width_choice.py predicts finishes the call soonest, from three measurements it owns:

- DepthAcceptance: how often a draft at each depth passes once those before it did, counted
  from the rounds' snapshots (n accepted of L drafts);
- RowSpread: how far rows' acceptance differs beyond chance, which sets a batch's slowest row;
- RoundTimes: each width's round time relative to the others', read off rounds of two widths
  run one after the other, and the machine's pace now.

It keeps them across calls, one FamilyMeasurements per graph family (proposer, batch size,
sample methods, all-greedy or not), in a dict the decoder holds (`families`). Exact, like any
policy: it reads finished rounds only.
"""

from __future__ import annotations

import math
import statistics
from collections import deque
from dataclasses import dataclass, field

import torch

from minispec.params import AdaptiveConfig, SamplingParams, SpeculativeConfig
from minispec.policies.width_choice import choose_width, expected_largest_normal, time_to_finish
from minispec.proposers import PROPOSERS
from minispec.state import Snapshot


@dataclass(slots=True)
class DepthAcceptance:
    """Decayed counts, per depth d = 1..D, of drafts that reached d (every draft before them
    passed, and the sampler tested them) and of those that passed.

    rates() shrinks each depth's rate towards the depth above it by `prior_weight` pseudo-
    counts (depth 1 towards prior_alpha), so a depth seldom reached borrows its parent's rate
    rather than guessing: a chain that never ran K = 8 prices depth 8 as its deepest measured
    depth."""

    depths: int
    reached: list[float] = field(init=False)
    passed: list[float] = field(init=False)

    def __post_init__(self) -> None:
        self.reached, self.passed = [0.0] * self.depths, [0.0] * self.depths

    def observe(self, snapshot: Snapshot, decay: float) -> None:
        """One round's rows: a row with L drafts and n accepted reached depths 1..min(n + 1, L)
        and passed 1..n. A round without drafts decays the counts too, so that rates measured
        on a few drafts drift back to the prior while K = 0 runs: a call that a few early
        rejections sent to K = 0 would otherwise never draft again, since K = 0 tests none."""
        self.reached = [decay * c for c in self.reached]
        self.passed = [decay * c for c in self.passed]
        for row in (row for row in snapshot.rows if row.token_ids and row.num_drafts):
            for d in range(min(row.num_accepted + 1, row.num_drafts, self.depths)):
                self.reached[d] += 1
                self.passed[d] += d < row.num_accepted

    def rates(self, prior_alpha: float, prior_weight: float) -> list[float]:
        rates, parent = [], prior_alpha
        for reached, passed in zip(self.reached, self.passed):
            parent = (passed + prior_weight * parent) / (reached + prior_weight)
            rates.append(parent)
        return rates


@dataclass(slots=True)
class RowSpread:
    """tau: how far rows' acceptance differs beyond chance within one call (their prompts
    differ). Per row, the drafts that passed less those the family's per-depth rates expect,
    over the drafts tested; tau^2 is those deviations' spread, read off the lowest row
    (`spread`), less the part chance explains (each draft a Bernoulli trial at its depth's
    rate)."""

    tested: list[float]
    excess: list[float]
    chance: list[float]  # the summed Bernoulli variances of a row's tested drafts

    @classmethod
    def of_rows(cls, rows: int) -> RowSpread:
        return cls([0.0] * rows, [0.0] * rows, [0.0] * rows)

    def observe(self, snapshot: Snapshot, rates: list[float]) -> None:
        for i, row in enumerate(snapshot.rows):
            if not row.token_ids:
                continue
            for d in range(min(row.num_accepted + 1, row.num_drafts, len(rates))):
                self.tested[i] += 1
                self.excess[i] += (d < row.num_accepted) - rates[d]
                self.chance[i] += rates[d] * (1 - rates[d])

    def spread(self, min_tested: int = 16) -> float | None:
        """tau, or None until two rows have each tested `min_tested` drafts. Read off the
        lowest row, which sets a call's end: the mean deviation less the least is z_n times
        tau and chance combined. Rows' acceptance has a heavier tail than a normal's, so their
        variance under-reads the slowest (docs/extensions.md)."""
        rows = [i for i, n in enumerate(self.tested) if n >= min_tested]
        if len(rows) < 2:
            return None
        deviations = [self.excess[i] / self.tested[i] for i in rows]
        chance = statistics.fmean(self.chance[i] / self.tested[i] ** 2 for i in rows)
        gap = (statistics.fmean(deviations) - min(deviations)) / expected_largest_normal(len(rows))
        return max(gap**2 - chance, 0.0) ** 0.5


@dataclass(slots=True)
class RoundTimes:
    """Each width's round time, as a time relative to the other widths' and the machine's pace
    now. The machine's pace moves by up to 20 % from one call to the next on a shared VM, so
    times a width took in one spell and another width took in another do not compare. A width's
    relative time is read off pairs: its first steady rounds after a change (up to RUN) against
    the last rounds of the width before it, in the same call, where what the pace and the
    context do in between cancels; a width's last PAIRS such readings are averaged (`relative`).
    The pace, seconds per unit of relative time, follows the latest rounds; it scales every
    width alike, so it moves no choice, only the predicted seconds. Those also grow with the
    context, by one rate for every width (`growth`), fit on each width's last `window` steady
    rounds (`seconds`, `level`). The first round after a change of width (a different graph,
    cold caches) and a round that compiled are not a width's time. A width never paired is
    priced from those that were (`of`)."""

    c: float
    window: int = 64
    rounds: int = 0  # the family's timed rounds
    seconds: dict[int, deque[tuple[float, float]]] = field(default_factory=dict)  # (context, s)
    last_timed: dict[int, int] = field(default_factory=dict)  # `rounds` when each last ran
    # Per width, its last PAIRS readings of log(relative time)
    relative: dict[int, deque[float]] = field(default_factory=dict)
    # The latest steady rounds, (width, seconds, context)
    recent: deque[tuple[int, float, float]] = field(default_factory=lambda: deque(maxlen=RUN))
    before: tuple[int, float, float] | None = None  # the run before this: width, mean s, context
    run: list[tuple[float, float]] = field(default_factory=list)  # this run's first (s, context)
    source: dict[int, int] = field(default_factory=dict)  # the width each was last read off
    pace: float | None = None  # seconds per unit of relative time, at `context`
    context: float = 0.0  # the latest timed round's
    # The first round after a change of width over that width's time, the latest few
    changes: deque[float] = field(default_factory=lambda: deque(maxlen=9))
    slope: tuple[int, float] | None = None  # (rounds, growth()) when growth was last fit

    def new_call(self) -> None:
        """A call starts: no pair spans two calls (the pace may jump between them)."""
        self.recent.clear()
        self.before, self.run = None, []

    def observe(self, k: int, seconds: float, context: float = 0.0) -> None:
        """A steady round: width k, after a round of the same width, took `seconds`."""
        self.rounds += 1
        self.last_timed[k] = self.rounds
        samples = self.seconds.setdefault(k, deque(maxlen=self.window))
        samples.append((context, seconds))
        if self.recent and self.recent[-1][0] != k:  # this run's first steady round
            j = self.recent[-1][0]
            before = [(s, c) for w, s, c in self.recent if w == j]
            self.before = (j, *map(statistics.fmean, zip(*before)))
            self.recent.clear()
            self.run = []
        self.recent.append((k, seconds, context))
        if not self.relative:  # the first width timed sets the unit
            self.relative[k] = deque([math.log(seconds)], maxlen=PAIRS)
        elif self.pairs_with(k) and len(self.run) < RUN:
            self.run.append((seconds, context))
            j, seconds_before, context_before = self.before
            mean, at = map(statistics.fmean, zip(*self.run))
            # The few tokens between the two runs grew the later one's rounds: taken out
            grown = max(1 + self.growth() * (at - context_before), 0.5)
            reading = self.log_relative(j) + math.log(mean / seconds_before / grown)
            readings = self.relative.setdefault(k, deque(maxlen=PAIRS))
            if len(self.run) > 1:  # the same pair, read on more of this run
                readings[-1] = reading
            else:
                readings.append(reading)
            self.source[k] = j
        if k in self.relative:
            now = seconds / math.exp(self.log_relative(k))
            self.pace = (
                now
                if self.pace is None
                else PACE * min(now, STALL * self.pace) + (1 - PACE) * self.pace
            )
            self.context = context

    def pairs_with(self, k: int) -> bool:
        """This run of width k reads its relative time off the run before it if that width's is
        known and was not read off k (back from a probe of k, it would only echo k's)."""
        j = None if self.before is None else self.before[0]
        return j in self.relative and self.source.get(j) != k

    def log_relative(self, k: int) -> float:
        return statistics.fmean(self.relative[k])

    def observe_change(self, k: int, seconds: float, context: float = 0.0) -> None:
        """A round at width k that followed a round of another width took `seconds`."""
        if k in self.relative:
            self.changes.append(seconds / self.of(k, context))

    def change_cost(self) -> float:
        """What a change of width costs on top of the new width's round, in its rounds."""
        return max(statistics.median(self.changes) - 1, 0.0) if self.changes else 0.0

    def level(self, k: int) -> tuple[float, float]:
        """The growth's reference for width k: (the mean context, the mean of its kept rounds,
        each clipped at STALL times their median so that one stall cannot move it)."""
        samples = self.seconds[k]
        ceiling = STALL * statistics.median(s for _, s in samples)
        return (
            statistics.fmean(c for c, _ in samples),
            statistics.fmean(min(s, ceiling) for _, s in samples),
        )

    def growth(self) -> float:
        """A round's relative growth per token of context, one for every width: the least-
        squares slope of each timed round's time over its width's level (less 1, within
        +-0.5, so a stall cannot swing it) against its context less its width's mean, pooled
        over widths (the within-width estimator: a width timed at one context adds nothing).
        Fit again every REFIT timed rounds: a pass over every kept round is 0.1 ms, 2 % of a
        round at B = 1, and the rate moves slowly."""
        if self.slope is None or self.rounds - self.slope[0] >= REFIT:
            products = squares = 0.0
            levels = {k: self.level(k) for k in self.seconds}
            for k, samples in self.seconds.items():
                center, level = levels[k]
                for context, seconds in samples:
                    deviation = min(max(seconds / level - 1, -0.5), 0.5)
                    products += (context - center) * deviation
                    squares += (context - center) ** 2
            # A round's time grows at most in proportion to its context (no fixed part), so
            # the rate is at most 1 / context: two rounds a token apart can fit any slope
            most = 1 / max(min(center for center, _ in levels.values()), 1.0)
            slope = products / squares if squares else 0.0
            self.slope = (self.rounds, min(max(slope, 0.0), most))
        return self.slope[1]

    def of(self, k: int, context: float = 0.0) -> float:
        """Width k's time at `context`: its relative time at the pace now, grown from the
        latest round's context. A width never paired: on the line through the two nearest
        paired widths (a verify's cost grows about linearly in K), not under the cheaper; with
        one paired, scaled from it by the cost model; with none, the cost model in units of a
        K = 0 round."""
        if k in self.relative:
            # A line fit to one half of a call and read at the other can fall steeply: not
            # below half
            grown = max(1 + self.growth() * (context - self.context), 0.5)
            return math.exp(self.log_relative(k)) * self.pace * grown
        near = sorted(self.relative, key=lambda w: (abs(w - k), w))[:2]
        model = lambda width: 1 + width * self.c  # noqa: E731
        if not near:
            return model(k)
        if len(near) == 1:
            return self.of(near[0], context) * model(k) / model(near[0])
        (a, t_a), (b, t_b) = ((w, self.of(w, context)) for w in near)
        return max(t_a + (k - a) * (t_b - t_a) / (b - a), min(t_a, t_b))


RUN = 4  # steady rounds on each side of a change that pair two widths
PAIRS = 8  # readings of a width's relative time averaged
PACE = 0.25  # the weight of the latest round in the pace
REFIT = 32  # timed rounds between two fits of RoundTimes.growth
STALL = 1.5  # a round over this many times its width's median counts as this many


@dataclass(slots=True)
class FamilyMeasurements:
    """What adaptive K keeps across calls for one graph family. row_spread: tau
    (width_choice.time_to_finish), from the last few calls' ends: within a call, a row's first
    16-20 drafts give a tau anywhere from 0 to 0.16 at B = 16, and one high reading turned a
    call to K = 0 for good (K = 0 rounds test no drafts that could correct it)."""

    times: RoundTimes
    acceptance: DepthAcceptance
    spreads: deque[float] = field(default_factory=lambda: deque(maxlen=8))  # calls' tau^2
    width: int | None = None  # the width its last round ran

    def observe_spread(self, spread: float) -> None:
        self.spreads.append(spread**2)

    @property
    def row_spread(self) -> float:
        return statistics.fmean(self.spreads) ** 0.5 if self.spreads else 0.0


class AdaptivePolicy:
    """Which K each round of one call uses: the width of least predicted time, except that a
    width worth knowing runs three rounds in a row to be timed (`due`). warm_up: each width once, in
    order, then stop."""

    def __init__(
        self,
        config: AdaptiveConfig,
        family: FamilyMeasurements,
        max_new_tokens: list[int],
        warm_up: bool = False,
        prompt_lengths: list[int] | None = None,
    ) -> None:
        self.config, self.family, self.warm_up = config, family, warm_up
        family.times.new_call()
        self.widths = config.widths
        self.remaining = list(max_new_tokens)  # per row; 0 once it is done
        self.lengths = list(prompt_lengths or [0] * len(max_new_tokens))  # per row, as it grows
        self.rows = RowSpread.of_rows(len(max_new_tokens))
        self.previous: int | None = None  # the last round's K, if its time was a round's
        self.probe: list[int] = []  # the widths to run next, whatever the prediction says
        # The family's last width, which the margin keeps too (if this call may run it)
        self.k: int | None = family.width if family.width in config.widths else None
        self.k = self.widths[0] if warm_up else self.choose()
        self.pending = list(self.widths[1:]) if warm_up else []

    @classmethod
    def for_call(
        cls,
        families: dict[tuple, FamilyMeasurements],
        spec: SpeculativeConfig,
        params: list[SamplingParams],
        warm_up: bool,
        prompt_lengths: list[int] | None = None,
        *,
        target: torch.nn.Module,
        draft: torch.nn.Module | None,
        head: torch.nn.Module | None = None,
    ) -> AdaptivePolicy:
        """The policy of one generate() call, with its graph family's measurements (created on
        first use in `families`, which the caller keeps across calls). The models' sizes price
        a width before it was timed (cost_ratio)."""
        # A batch of greedy rows accepts far more often than a sampled one: its own counts,
        # though both run the same graphs.
        greedy = all(p.temperature == 0 for p in params)
        key = (spec.proposer, len(params), spec.draft_method, spec.rejection_sample_method, greedy)
        if key not in families:
            drafter = {"draft": draft, "head": head}.get(PROPOSERS[spec.proposer].needs)
            c = cost_ratio(target, drafter) if drafter is not None else 0.0
            depths = max(spec.adaptive.widths)
            families[key] = FamilyMeasurements(RoundTimes(c), DepthAcceptance(depths))
        max_new = [p.max_new_tokens for p in params]
        return cls(spec.adaptive, families[key], max_new, warm_up, prompt_lengths)

    def predicted_times(self) -> list[float]:
        """Per width: the time the call has left at that width (width_choice.time_to_finish)."""
        acceptance = self.family.acceptance.rates(self.config.prior_alpha, self.config.prior_weight)
        remaining = max(self.remaining)
        rows = max(sum(r > 0 for r in self.remaining), 1)
        change = self.family.times.change_cost()
        context = max(self.lengths) + remaining / 2  # the rounds left read this much on average
        spread = self.family.row_spread
        predicted = []
        for k in self.widths:
            round_time = self.family.times.of(k, context)
            switch = change * round_time if k != self.k else 0.0
            left = time_to_finish(acceptance, k, round_time, remaining, rows, spread)
            predicted.append(left + switch)
        return predicted

    def choose(self) -> int:
        """The next round's K: a width due for timing, else the prediction's choice."""
        if self.probe:
            return self.probe.pop(0)
        times = self.predicted_times()
        current = None if self.k is None else self.widths.index(self.k)
        best = choose_width(times, self.config.margin, current)
        due = self.due(times)
        if due is not None and due != best:
            # Three rounds: the first after a change is not timed, the other two make a reading
            self.probe = [self.widths[due]] * 2
            return self.widths[due]
        return self.widths[best]

    def due(self, times: list[float]) -> int | None:
        """A width to time now: one never timed in this family, else one not timed for
        retime_after rounds whose predicted time is within `probe_within` of the best (a width
        whose last times came out slow would otherwise never run again; one priced out by
        more would lose). The two narrowest widths are timed first, whatever they promise: the
        price of a width never timed is read off their line (RoundTimes.of), which at B = 64
        puts K = 8 far out of reach, where probing it cost two rounds of five K = 0 rounds'
        time each."""
        measured, config = self.family.times, self.config
        promising = [i for i, t in enumerate(times) if t <= min(times) * config.probe_within]
        never = [i for i, k in enumerate(self.widths) if k not in measured.last_timed]
        if never and len(measured.last_timed) < 2:
            return never[0]
        if (worth := next((i for i in never if i in promising), None)) is not None:
            return worth
        stale = [
            i
            for i in promising
            if self.widths[i] in measured.last_timed
            and measured.rounds - measured.last_timed[self.widths[i]] >= config.retime_after
        ]
        return min(stale, key=lambda i: measured.last_timed[self.widths[i]], default=None)

    def plan(self) -> int:
        return self.k

    def observe(self, snapshot: Snapshot, seconds: float | None) -> bool:
        """After a round at self.k that took `seconds` (None: it compiled): time it if the round
        before ran the same width, count its acceptance, and choose the next K."""
        timed, context = seconds is not None, max(self.lengths)
        if timed and self.previous == self.k:
            self.family.times.observe(self.k, seconds, context)
        elif timed and self.previous is not None:
            self.family.times.observe_change(self.k, seconds, context)
        self.previous = None if seconds is None else self.k
        self.family.width = self.k
        config = self.config
        self.rows.observe(
            snapshot, self.family.acceptance.rates(config.prior_alpha, config.prior_weight)
        )
        if snapshot.done and (spread := self.rows.spread()) is not None:
            self.family.observe_spread(spread)
        self.family.acceptance.observe(snapshot, config.decay)
        for i, row in enumerate(snapshot.rows):
            self.remaining[i] = 0 if row.done else self.remaining[i] - len(row.token_ids)
            self.lengths[i] += len(row.token_ids)
        if self.warm_up:  # one round per width, whatever the prediction says
            if not self.pending:
                return True
            self.k = self.pending.pop(0)
            return False
        if snapshot.done:
            return True
        self.k = self.choose()
        return False


def cost_ratio(target: torch.nn.Module, draft: torch.nn.Module) -> float:
    """c before any round was timed: a draft step costs about its share of the parameters
    (steps are memory-bound); a proposer without a draft model costs next to nothing (0)."""
    size = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
    return size(draft) / size(target)
