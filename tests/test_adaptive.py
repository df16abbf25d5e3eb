"""Adaptive K (num_speculative_tokens="auto"): the prediction (width_choice.py), the
measurements (adaptive.py), and the policy on recorded timings, in a simulated decode."""

from __future__ import annotations

import itertools
import math
import random
import statistics

import pytest

import minispec.policies.width_choice
from minispec.params import AdaptiveConfig
from minispec.policies.adaptive import (
    AdaptivePolicy,
    DepthAcceptance,
    FamilyMeasurements,
    RoundTimes,
    RowSpread,
)
from minispec.policies.width_choice import (
    choose_width,
    expected_largest_normal,
    round_tokens,
    time_to_finish,
)
from minispec.state import RowResult, Snapshot

WIDTHS = (0, 2, 4, 8)
# The chance a draft passes at each depth once the drafts before it passed, falling with depth
# as the shipped pair's does, at T = 1 and (higher) at T = 0.
ACCEPTANCE = (0.75, 0.72, 0.6, 0.6, 0.55, 0.55, 0.5, 0.5)
ACCEPTANCE_T0 = (0.85, 0.8, 0.7, 0.6, 0.5, 0.45, 0.4, 0.4)
# Round times per width in units of a K = 0 round at the prompt's end, close to those measured
# (this CPU, draft model): at B = 1 a verify of K + 1 tokens costs little more than one, and
# K = 4 is best at T = 0; at B = 16 and 64 it costs about K + 1 times one, and every K > 0
# loses to K = 0, at B = 64 narrowly (K = 2: 0.92x), where rows' acceptance also differs.
TIMES_B1 = {0: 1.0, 2: 1.22, 4: 1.5, 8: 1.81}
TIMES_B16 = {0: 1.0, 2: 2.2, 4: 3.4, 8: 5.9}
TIMES_B64 = {0: 1.0, 2: 1.88, 4: 2.9, 8: 5.3}
# Compiled ahead of time, B = 1 rounds cost about the same at K = 0, 2 and 4 (launch-bound)
TIMES_B1_FLAT = {0: 1.0, 2: 1.0, 4: 1.1, 8: 1.6}
SCENARIOS = {  # round times, rows, per-depth acceptance, tau (rows' spread of acceptance)
    "B = 1, T = 0": (TIMES_B1, 1, ACCEPTANCE_T0, 0.0),
    "B = 1, T = 0, flat": (TIMES_B1_FLAT, 1, ACCEPTANCE_T0, 0.0),
    "B = 16, T = 1": (TIMES_B16, 16, ACCEPTANCE, 0.0),
    "B = 64, T = 1": (TIMES_B64, 64, ACCEPTANCE, 0.08),
}
PROMPT = 300  # tokens in each row's prompt
GROWTH = 0.0017  # a round's time grows by this share per token of context (22 % over 128)
DRIFT = 0.05  # the machine's speed drifts this much either way over 300 rounds
JUMP = 0.15  # and each call runs at its own pace, up to this much either way
STALLS = 0.03  # the share of rounds 20-60 % slow


def test_round_tokens_is_eq_1_when_every_depth_accepts_alike() -> None:
    for alpha, k in itertools.product((0.0, 0.3, 0.75, 0.99), (0, 1, 4, 8)):
        mean, _ = round_tokens([alpha] * k, k)
        assert mean == pytest.approx((1 - alpha ** (k + 1)) / (1 - alpha))


def test_round_tokens_mean_and_variance_by_enumeration() -> None:
    """Every accept/reject outcome of 4 drafts, weighted by its probability."""
    acceptance, k = ACCEPTANCE[:4], 4
    law = {}
    for passes in itertools.product((True, False), repeat=k):
        n = next((i for i, ok in enumerate(passes) if not ok), k)
        weight = math.prod(acceptance[:n]) * (1 - acceptance[n] if n < k else 1)
        law[n + 1] = weight  # every outcome with the same first rejection: the same weight
    mean = sum(t * w for t, w in law.items())
    variance = sum(t * t * w for t, w in law.items()) - mean**2
    assert sum(law.values()) == pytest.approx(1)
    assert round_tokens(acceptance, k) == pytest.approx((mean, variance))
    assert round_tokens(acceptance, 0) == (1.0, 0.0)


def test_expected_largest_normal_known_values() -> None:
    assert expected_largest_normal(1) == pytest.approx(0, abs=1e-9)
    assert expected_largest_normal(2) == pytest.approx(1 / math.sqrt(math.pi), abs=1e-6)
    assert expected_largest_normal(16) == pytest.approx(1.7660, abs=1e-3)  # tables: 1.76599


def test_one_row_is_rounds_times_round_time_and_k_0_pays_no_spread() -> None:
    mean, _ = round_tokens(ACCEPTANCE, 4)
    assert time_to_finish(ACCEPTANCE, 4, 2.0, 100, 1) == pytest.approx(2.0 * 100 / mean)
    assert time_to_finish(ACCEPTANCE, 0, 1.0, 100, 64) == pytest.approx(100)
    # The slowest of 16 rows needs more rounds than one row does.
    assert time_to_finish(ACCEPTANCE, 4, 1.0, 100, 16) > time_to_finish(ACCEPTANCE, 4, 1.0, 100, 1)


def test_a_row_near_its_end_drafts_no_more_than_it_can_keep() -> None:
    """With 3 tokens to go a round can keep at most 2 drafts: K = 8 is priced as K = 2."""
    assert time_to_finish(ACCEPTANCE, 8, 1.0, 3, 1) == time_to_finish(ACCEPTANCE, 2, 1.0, 3, 1)
    assert time_to_finish(ACCEPTANCE, 8, 1.0, 1, 1) == time_to_finish(ACCEPTANCE, 0, 1.0, 1, 1)


def test_margin_keeps_the_current_width_near_a_tie() -> None:
    assert choose_width([10.0, 9.9, 12.0], margin=0.02) == 1  # no current width: the least
    assert choose_width([10.0, 9.9, 12.0], margin=0.02, current=0) == 0
    assert choose_width([10.0, 9.5, 12.0], margin=0.02, current=0) == 1
    assert choose_width([10.0, 9.9, 12.0], margin=0.0, current=0) == 1


def row(accepted: int, drafts: int, tokens: int = 1, done: bool = False) -> RowResult:
    return RowResult([0] * tokens, accepted, drafts, done)


def test_depth_acceptance_counts_the_depths_each_row_reached() -> None:
    counts = DepthAcceptance(4)
    # n = 2 of 4: depths 1-3 reached, 1-2 passed; n = 4 of 4: all reached and passed; a row
    # done before the round (no tokens) counts nothing, and a round without drafts only decays.
    counts.observe(Snapshot([row(2, 4), row(4, 4), row(1, 4, tokens=0)]), decay=0.5)
    assert counts.reached == [2, 2, 2, 1] and counts.passed == [2, 2, 1, 1]
    counts.observe(Snapshot([row(0, 0)]), decay=0.5)
    assert counts.reached == [1, 1, 1, 0.5] and counts.passed == [1, 1, 0.5, 0.5]
    counts.observe(Snapshot([row(0, 4)]), decay=0.5)  # older counts decay
    assert counts.reached == [1.5, 0.5, 0.5, 0.25] and counts.passed == [0.5, 0.5, 0.25, 0.25]


def test_a_call_that_a_few_rejections_sent_to_k_0_drafts_again(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Round times where drafting costs (a K = 2 round at 1.6 K = 0 rounds) and a bad start:
    none of the first 6 drafts passed, depth 1 sits at 0.4 and K = 0 wins. K = 0 rounds test no
    drafts, but they fade those counts towards the prior, and auto drafts again after 28
    rounds. Power: with counts that a round without drafts leaves alone (the rule before), it
    runs K = 0 for good."""

    def first_drafting_round() -> int | None:
        family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(max(WIDTHS)))
        for k, seconds in {0: 1.0, 2: 1.6, 4: 2.2, 8: 3.4}.items():
            family.times.observe(k, seconds)
        for _ in range(3):
            family.acceptance.observe(Snapshot([row(0, 2), row(0, 2)]), decay=0.99)
        policy = AdaptivePolicy(AdaptiveConfig(widths=WIDTHS), family, [256])
        for r in range(200):
            if policy.plan():
                return r
            policy.observe(Snapshot([row(0, 0)]), None)  # a K = 0 round, untimed
        return None

    first = first_drafting_round()
    assert first is not None and 0 < first <= 40, first
    observe = DepthAcceptance.observe

    def counts_untouched_without_drafts(self, snapshot, decay):
        if any(r.num_drafts for r in snapshot.rows):
            observe(self, snapshot, decay)

    monkeypatch.setattr(DepthAcceptance, "observe", counts_untouched_without_drafts)
    assert first_drafting_round() is None


def test_an_unreached_depth_borrows_the_rate_above_it() -> None:
    counts = DepthAcceptance(3)
    assert counts.rates(0.7, 2.0) == pytest.approx([0.7, 0.7, 0.7])
    for _ in range(50):
        counts.observe(Snapshot([row(0, 1)]), decay=1.0)  # K = 1: depth 1 always rejected
    rates = counts.rates(0.7, 2.0)
    assert rates[0] < 0.05 and rates[2] == pytest.approx(rates[1]) and rates[1] < 0.1


def test_a_width_is_timed_beside_another_so_the_machines_pace_cancels() -> None:
    """K = 0 runs a call at one pace; the next call runs 30 % slower, K = 0 for a few rounds,
    then K = 2. K = 2 is read off the K = 0 rounds just before it: 1.88 K = 0 rounds, as it is.
    Each width's mean over its own rounds (`level`) puts it at 2.33: a width timed in a slow
    spell looks dear against one timed in a fast spell, which ran K = 2 at B = 64."""
    times = RoundTimes(c=0.1)
    assert times.of(4) == pytest.approx(1.4)  # none timed: the cost model, in K = 0 rounds
    for _ in range(20):
        times.observe(0, TIMES_B64[0])
    times.new_call()
    for k in (0, 2):
        for _ in range(4):
            times.observe(k, 1.3 * TIMES_B64[k])
    ratio = TIMES_B64[2] / TIMES_B64[0]
    assert times.of(2) / times.of(0) == pytest.approx(ratio, rel=0.01)
    assert times.level(2)[1] / times.level(0)[1] > 1.2 * ratio
    # A width never paired lies on the line through the two that were.
    assert times.of(4) == pytest.approx(2 * times.of(2) - times.of(0))


def snapshot_of(
    policy: AdaptivePolicy, k: int, acceptance, offsets: list[float], rng: random.Random
) -> Snapshot:
    """A round at width k for each row still going, its accepted drafts drawn from
    `acceptance` moved by the row's offset."""
    rows = []
    for remaining, offset in zip(policy.remaining, offsets):
        if remaining <= 0:
            rows.append(RowResult([], 0, k, True))
            continue
        n = 0
        while n < k and rng.random() < acceptance[n] + offset:
            n += 1
        kept = min(n + 1, remaining)
        rows.append(RowResult([0] * kept, n, k, kept == remaining))
    return Snapshot(rows)


def simulate(
    scenario: str, fixed: int | None, calls: int = 12, max_new: int = 128, seed: int = 0
) -> float:
    """Tokens per unit time over `calls` calls of a scenario's rows, each round timed as its
    times say, give or take 5 %, longer as the context grows (GROWTH), 30 % slower on the first
    round after a change of width (the bias a timing must not take for the width's), the
    machine's speed drifting by 5 % either way over 300 rounds, each call at a pace of its own,
    up to 15 % either way (a shared VM: up to 20 % from call to call), and 3 % of rounds
    20-60 % slow. Each row's acceptance is moved by an offset drawn per call (tau: rows differ
    beyond chance). fixed: a fixed K, else auto."""
    times, rows, acceptance, tau = SCENARIOS[scenario]
    rng, paces, stalls = random.Random(seed), random.Random(seed + 1), random.Random(seed + 2)
    config = AdaptiveConfig(widths=WIDTHS)
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(max(WIDTHS)))
    total_time = total_tokens = 0.0
    previous, rounds = None, 0
    for _ in range(calls):
        pace = paces.uniform(1 - JUMP, 1 + JUMP)  # this call's, the same for every K
        policy = AdaptivePolicy(config, family, [max_new] * rows, prompt_lengths=[PROMPT] * rows)
        offsets = [rng.gauss(0, tau) for _ in range(rows)]
        done = False
        while not done:
            k = policy.plan() if fixed is None else fixed
            context = max(policy.lengths) - PROMPT
            snapshot = snapshot_of(policy, k, acceptance, offsets, rng)
            seconds = times[k] * rng.uniform(0.95, 1.05) * (1.3 if k != previous else 1.0)
            seconds *= (1 + GROWTH * context) * (1 + DRIFT * math.sin(2 * math.pi * rounds / 300))
            seconds *= pace
            if stalls.random() < STALLS:  # a slow round, as another process takes the core
                seconds *= stalls.uniform(1.2, 1.6)
            previous, rounds = k, rounds + 1
            total_time += seconds
            total_tokens += sum(len(r.token_ids) for r in snapshot.rows)
            done = policy.observe(snapshot, seconds)  # for a fixed K, only its bookkeeping
    return total_tokens / total_time


@pytest.mark.parametrize(
    "scenario,best",
    [("B = 1, T = 0", 4), ("B = 1, T = 0, flat", 4), ("B = 16, T = 1", 0), ("B = 64, T = 1", 0)],
)
def test_auto_keeps_up_with_the_best_fixed_k_on_recorded_timings(scenario: str, best: int) -> None:
    """The issue's bound, 0.98x the best fixed K (K = 0 included), with the exploration of the
    family's first call counted, as the mean over seeds 0-7: one seed's ratio moves by 0.01-0.03
    with what its first calls happened to time, eight seeds' mean by about 0.005. It sits at
    0.986 (B = 1), 0.992 (B = 1, flat), 0.996 (B = 16) and 0.992 (B = 64). With each width timed
    by its own rounds' mean rather than beside another's (the rule before pair timing) it sits
    at 0.949, 0.989, 0.970 and 0.962: the calls' paces set the choice, and the bound fails."""
    ratios = []
    for seed in range(8):
        fixed = {k: simulate(scenario, k, seed=seed) for k in WIDTHS}
        assert max(fixed, key=fixed.get) == best
        ratios.append(simulate(scenario, None, seed=seed) / fixed[best])
    assert statistics.fmean(ratios) >= 0.98, ratios


def measured_policy(scenario: str) -> AdaptivePolicy:
    """A call's policy in a family that measured the scenario's truth well: each width's time,
    and 1,000 rows' worth of acceptance at every depth."""
    times, rows, acceptance, tau = SCENARIOS[scenario]
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(max(WIDTHS)))
    for k, seconds in times.items():
        family.times.observe(k, seconds)
    reach = 1000.0
    for d, a in enumerate(acceptance):
        family.acceptance.reached[d], family.acceptance.passed[d] = reach, reach * a
        reach *= a
    family.observe_spread(tau)
    return AdaptivePolicy(AdaptiveConfig(widths=WIDTHS), family, [128] * rows)


def test_power_one_alpha_for_every_depth_runs_too_deep(monkeypatch: pytest.MonkeyPatch) -> None:
    """Each depth's own rate keeps auto at K = 4 at B = 1: with depth 1's rate at every depth
    (eq. 1 with one alpha) it would run K = 8, which the simulation measures 12 % slower."""
    assert measured_policy("B = 1, T = 0").plan() == 4
    rates = DepthAcceptance.rates
    one_alpha = lambda self, *args: [rates(self, *args)[0]] * self.depths  # noqa: E731
    monkeypatch.setattr(DepthAcceptance, "rates", one_alpha)
    assert measured_policy("B = 1, T = 0").plan() == 8
    assert simulate("B = 1, T = 0", 8) < 0.9 * simulate("B = 1, T = 0", 4)


def test_power_without_the_slowest_row_auto_speculates_at_b_16(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """The slowest row's spread keeps auto at K = 0 at B = 16: predicting the mean row instead
    it would run K = 2, which the simulation measures 5 % slower."""
    assert measured_policy("B = 16, T = 1").plan() == 0
    monkeypatch.setattr(minispec.policies.width_choice, "expected_largest_normal", lambda b: 0.0)
    assert measured_policy("B = 16, T = 1").plan() == 2
    assert simulate("B = 16, T = 1", 2) < 0.96 * simulate("B = 16, T = 1", 0)


def test_a_change_of_width_is_priced_by_what_changes_measured() -> None:
    """Near a call's end K = 2 keeps as much as K = 4: worth a change only when changes are
    cheap. The first round after each change took 1.5x its width's time here."""
    policy = measured_policy("B = 1, T = 0")
    policy.k, policy.remaining = 4, [3]
    assert policy.choose() == 2
    for _ in range(3):
        policy.family.times.observe_change(2, 1.5 * TIMES_B1[2])
    assert policy.family.times.change_cost() == pytest.approx(0.5)
    assert policy.choose() == 4


def test_a_width_not_run_for_a_while_is_timed_again_if_it_may_win() -> None:
    config = AdaptiveConfig(widths=WIDTHS, retime_after=10)
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(8))
    for k, seconds in TIMES_B1.items():
        family.times.observe(k, seconds)
    policy = AdaptivePolicy(config, family, [1000])
    assert policy.due(policy.predicted_times()) is None  # all timed just now
    for _ in range(10):
        family.times.observe(4, TIMES_B1[4])
    times = policy.predicted_times()
    # K = 2 and 8 are within probe_within of K = 4; K = 0 (over 2x dearer) is not probed.
    assert times[0] > config.probe_within * min(times)
    assert policy.widths[policy.due(times)] in (2, 8)


def test_a_width_probed_without_a_reading_is_not_due_again_at_once() -> None:
    """K = 4 is read off K = 8, runs past retime_after, and K = 8 is probed from it. The probe
    reads K = 8 nothing new (off K = 4, read off K = 8, it would echo itself), but K = 8 ran:
    it is not due again, or every other round would probe it."""
    config = AdaptiveConfig(widths=(4, 8), retime_after=10)
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(8))
    times = family.times
    for k in (8, 8, 4):  # K = 8 sets the unit, K = 4 is read off it
        times.observe(k, TIMES_B1[k])
    for _ in range(10):
        times.observe(4, TIMES_B1[4])
    times.observe(8, TIMES_B1[8])  # the probe's timed round
    assert len(times.relative[8]) == 1
    policy = AdaptivePolicy(config, family, [1000])
    times_now = policy.predicted_times()
    assert times_now[1] <= config.probe_within * min(times_now)  # K = 8 is worth a probe
    assert policy.due(times_now) is None


def test_a_call_keeps_the_familys_last_width_only_if_it_may_run_it() -> None:
    """The first round keeps the width the family ran last, within the margin; a call whose
    widths leave it out starts from none."""
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(8))
    family.width = 2
    assert AdaptivePolicy(AdaptiveConfig(widths=(0, 4)), family, [128]).plan() in (0, 4)


def test_a_round_that_compiled_and_the_round_after_a_change_are_not_timed() -> None:
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(8))
    policy = AdaptivePolicy(AdaptiveConfig(widths=(2,)), family, [100])
    for seconds in (None, 5.0, 0.01, 0.01):  # compiled, then the first round after it, then two
        policy.observe(Snapshot([row(1, 2, tokens=2)]), seconds)
    assert [s for _, s in family.times.seconds[2]] == [0.01, 0.01]


def test_warm_up_runs_each_width_once_then_stops() -> None:
    family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(8))
    policy = AdaptivePolicy(AdaptiveConfig(widths=WIDTHS), family, [100], warm_up=True)
    ran = [policy.plan()]
    while not policy.observe(Snapshot([row(0, ran[-1])]), None):
        ran.append(policy.plan())
    assert ran == list(WIDTHS)


def test_bad_config_is_one_line_errors() -> None:
    for kwargs in (
        {"widths": ()},
        {"widths": (2, 0)},
        {"widths": (0, 0)},
        {"prior_alpha": 1.5},
        {"prior_weight": 0},
        {"decay": 1.0},
        {"margin": -0.1},
        {"retime_after": 0},
        {"probe_within": 0.9},
    ):
        with pytest.raises(ValueError) as error:
            AdaptiveConfig(**kwargs)
        assert "\n" not in str(error.value)


def test_rows_that_differ_slow_a_batch_but_not_one_row_or_k_0() -> None:
    spread = lambda k, rows: time_to_finish(ACCEPTANCE, k, 1.0, 128, rows, 0.08)  # noqa: E731
    plain = lambda k, rows: time_to_finish(ACCEPTANCE, k, 1.0, 128, rows)  # noqa: E731
    assert spread(4, 64) > 1.1 * plain(4, 64)
    assert spread(4, 1) == plain(4, 1) and spread(0, 64) == plain(0, 64) == 128


def test_row_spread_measures_how_far_rows_differ_beyond_chance() -> None:
    """64 rows, 200 drafts each at depth 1, per-row rates 0.7 + N(0, tau): tau comes back within
    0.02 at tau = 0.08, and under 0.03 when the rows are alike (chance alone: the Bernoulli
    spread of 200 drafts, 0.032, is taken out)."""
    rng = random.Random(0)
    for tau, low, high in ((0.08, 0.06, 0.10), (0.0, 0.0, 0.03)):
        rates = [0.7 + rng.gauss(0, tau) for _ in range(64)]
        spread = RowSpread.of_rows(64)
        for _ in range(200):
            accepted = [int(rng.random() < r) for r in rates]
            spread.observe(Snapshot([row(n, 1, tokens=n + 1) for n in accepted]), [0.7])
        assert low <= spread.spread() <= high


def test_row_spread_is_read_off_the_slowest_row() -> None:
    """63 rows alike and one 0.2 under them, as a hard text among easy ones: the slowest row
    takes r (1 / mu(a - 0.2) - 1 / mu(a)) rounds more, and tau is read where it sits (0.2 / z_64,
    0.083, within 0.02). The rows' variance less chance under-reads it: about 0.02."""
    rng = random.Random(0)
    rates = [0.72] * 63 + [0.52]
    spread = RowSpread.of_rows(64)
    for _ in range(400):
        accepted = [int(rng.random() < r) for r in rates]
        spread.observe(Snapshot([row(n, 1, tokens=n + 1) for n in accepted]), [0.7])
    assert spread.spread() == pytest.approx(0.2 / expected_largest_normal(64), abs=0.02)
    deviations = [e / n for e, n in zip(spread.excess, spread.tested)]
    chance = statistics.fmean(c / n**2 for c, n in zip(spread.chance, spread.tested))
    assert max(statistics.variance(deviations) - chance, 0) ** 0.5 < 0.04


def test_power_without_the_rows_spread_auto_speculates_at_b_64() -> None:
    """At B = 64 the rows' spread (tau 0.08) keeps auto at K = 0: without it the rule predicts
    K = 2's slowest row 11 % sooner and runs K = 2, which the simulation measures 8 % slower."""
    assert measured_policy("B = 64, T = 1").plan() == 0
    policy = measured_policy("B = 64, T = 1")
    policy.family.spreads.clear()
    policy.k = None
    assert policy.choose() == 2
    assert simulate("B = 64, T = 1", 2) < 0.95 * simulate("B = 64, T = 1", 0)


def test_widths_timed_at_different_contexts_compare_at_one() -> None:
    """One call at B = 64: K = 2 over its first 100 tokens, then K = 0 to its end, both growing
    by GROWTH per token of context. Read off the rounds beside each other, K = 0 over K = 2 comes
    back within 1 % at the call's start, and K = 0's own time there within 4 %. Each width's mean
    over its own rounds, each at the contexts it ran at, makes K = 0 10 % dearer: the bias that
    priced K = 0 out at B = 64."""
    times = RoundTimes(c=0.05)
    for context in range(300, 400, 2):
        times.observe(2, TIMES_B64[2] * (1 + GROWTH * (context - 300)), context)
    for context in range(400, 429):
        times.observe(0, TIMES_B64[0] * (1 + GROWTH * (context - 300)), context)
    ratio = TIMES_B64[0] / TIMES_B64[2]
    assert times.of(0, 300) / times.of(2, 300) == pytest.approx(ratio, rel=0.01)
    assert times.of(0, 300) == pytest.approx(TIMES_B64[0], rel=0.04)
    assert times.level(0)[1] / times.level(2)[1] > 1.08 * ratio


def test_growth_is_at_most_one_over_the_context() -> None:
    """Two rounds a token apart, 8 % apart in time: the line through them grows 8 % a token,
    and would read a width timed 5 tokens later 40 % dear. A round's time grows at most in
    proportion to its context, so the rate is at most 1 / context."""
    times = RoundTimes(c=0.05)
    times.observe(0, 1.00, 300)
    times.observe(0, 1.08, 301)
    assert 0 < times.growth() <= 1 / 300


def test_an_untimed_width_is_priced_on_the_line_of_two_timed_ones() -> None:
    times = RoundTimes(c=0.05)
    times.observe(0, 1.0)
    times.observe(2, 1.9)
    assert times.of(4) == pytest.approx(2.8) and times.of(8) == pytest.approx(4.6)
    assert times.of(1) == pytest.approx(1.45)


def test_a_width_never_timed_is_probed_only_if_it_may_win() -> None:
    """With K = 0 and 2 timed, K = 4 and 8 are probed at B = 1 (their line promises the best
    time) and never at B = 64, where two rounds of K = 8 cost ten K = 0 rounds."""
    for times, rows, probed in ((TIMES_B1, 1, 4), (TIMES_B64, 64, None)):
        family = FamilyMeasurements(RoundTimes(c=0.05), DepthAcceptance(8))
        for k in (0, 2):
            family.times.observe(k, times[k])
        policy = AdaptivePolicy(AdaptiveConfig(widths=WIDTHS), family, [128] * rows)
        due = policy.due(policy.predicted_times())
        assert (None if due is None else WIDTHS[due]) == probed
