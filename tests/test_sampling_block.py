"""Block verification (method="block") and rows with fewer than K drafts, for both rules.

1. Exact arithmetic (sampling.exact_law, fractions): on random prefix-dependent tables with
   V = 3, K = 2 and 3, the round followed by the target has exactly the target's law; block
   accepts at least as many drafts as token-wise (as many for one-hot drafts) and no more than
   the optimum; draft-dependent early stops stay exact; the two wrong variants are not exact.
2. The compiled sampler equals the plain reference bit for bit on the same noise.
3. Through the compiled sampler: frequencies per cell on the hard (p, q) cases, the toy
   example and early stops, with the accepted-length law from (1); the mutants' laws fail the
   same check. False-alarm rate <= 1e-6 per test (tests/_stats.py).
"""

import dataclasses
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
import torch

from sampling import PLACEHOLDER_TOKEN_ID, exact_law
from tests._stats import SMALL, FrequencyCheck, all_implementations
from tests.test_sampling_compiled import _random_batch
from tests.test_sampling_exactness import CASES, STOPS, Case, Tally, _run

K, V = SMALL["drafts"], SMALL["vocab"]
TOY_MB, TOY_MS = [Fraction(1, 3), Fraction(2, 3)], [Fraction(2, 3), Fraction(1, 3)]


def _constant(distribution):
    return lambda prefix: distribution


def _random_tables(rng: np.random.Generator, vocab: int, num_drafts: int, one_hot: bool = False):
    """Mb for every prefix of length <= K and Ms for every prefix of length < K, with random
    small-integer weights (zeros included) as exact fractions."""

    def table(length, one_hot):
        rows = {}
        for n in range(length + 1):
            for prefix in product(range(vocab), repeat=n):
                weights = rng.integers(0, 4, vocab)
                weights[rng.integers(vocab)] += 1  # some mass in every row
                if one_hot:
                    weights = np.eye(vocab, dtype=int)[rng.integers(vocab)]
                rows[prefix] = [Fraction(int(w), int(weights.sum())) for w in weights]
        return rows

    target, draft = table(num_drafts, False), table(num_drafts - 1, one_hot)
    return target.__getitem__, draft.__getitem__


INSTANCES = [
    (k, *_random_tables(np.random.default_rng(seed), 3, k)) for k in (2, 3) for seed in range(8)
]


def _exact(target, draft, num_drafts, vocab, rule, stop=None) -> bool:
    law = exact_law.round_law(target, draft, num_drafts, vocab, rule, stop)
    return exact_law.completed_law(law, target, num_drafts + 1) == exact_law.target_law(
        target, num_drafts + 1
    )


# --- 1. exact arithmetic ------------------------------------------------------------------------


def test_toy_example():
    """V = {a, b}, Mb = (1/3, 2/3), Ms = (2/3, 1/3), gamma = 2: 10/9 accepted drafts token-wise,
    11/9 with block verification, 12/9 at the optimum. So K = 2 is not a degenerate case."""
    target, draft = _constant(TOY_MB), _constant(TOY_MS)
    accepted = {
        name: exact_law.expected_accepted(exact_law.round_law(target, draft, 2, 2, rule))
        for name, rule in exact_law.RULES.items()
    }
    assert accepted == {"standard": Fraction(10, 9), "block": Fraction(11, 9)}
    assert exact_law.optimum_accepted(target, draft, 2, 2) == Fraction(12, 9)
    assert all(_exact(target, draft, 2, 2, rule) for rule in exact_law.RULES.values())


@pytest.mark.parametrize("method", exact_law.RULES)
def test_random_tables_have_exactly_the_target_law(method):
    for num_drafts, target, draft in INSTANCES:
        assert _exact(target, draft, num_drafts, 3, exact_law.RULES[method])


def test_block_dominates_token_wise_and_is_bounded_by_the_optimum():
    gains = []
    for num_drafts, target, draft in INSTANCES:
        block, token_wise = (
            exact_law.expected_accepted(exact_law.round_law(target, draft, num_drafts, 3, rule))
            for rule in (exact_law.block, exact_law.token_wise)
        )
        assert token_wise <= block <= exact_law.optimum_accepted(target, draft, num_drafts, 3)
        gains.append(block - token_wise)
    assert sum(g > 0 for g in gains) >= len(gains) // 2  # a strict gain on most instances


def test_one_hot_drafts_gain_nothing():
    """A deterministic drafter: block's p_i is the product of per-token acceptances, so both
    rules accept equally often (this is why the sampler runs the token-wise rule then)."""
    for seed, num_drafts in product(range(6), (2, 3)):
        target, draft = _random_tables(
            np.random.default_rng(100 + seed), 3, num_drafts, one_hot=True
        )
        laws = [
            exact_law.round_law(target, draft, num_drafts, 3, rule)
            for rule in (exact_law.block, exact_law.token_wise)
        ]
        assert exact_law.expected_accepted(laws[0]) == exact_law.expected_accepted(laws[1])
        assert all(_exact(target, draft, num_drafts, 3, rule) for rule in exact_law.RULES.values())


@pytest.mark.parametrize("method", exact_law.RULES)
def test_early_stops_are_exact(method):
    """Fewer drafts than K, decided from the drafts (after a given token, a confidence stop, a
    fixed short length, none at all): the stop-token view keeps both rules exact."""
    confident = lambda draft: lambda prefix: max(draft(prefix)) < Fraction(1, 2)  # noqa: E731
    for num_drafts, target, draft in INSTANCES:
        for stop in [STOPS[name][0] for name in STOPS] + [confident(draft)]:
            assert _exact(target, draft, num_drafts, 3, exact_law.RULES[method], stop)


def _standard_residual(target, draft, drafts):
    """Mutant: block's tau with the token-wise residual max(Mb - Ms, 0) (not p_tau Mb - Ms)."""
    return [
        (
            keep,
            exact_law.residual(1, target(drafts[:t]), draft(drafts[:t]))
            if t < len(drafts)
            else weights,
        )
        for t, (keep, weights) in enumerate(exact_law.block(target, draft, drafts))
    ]


def _first_failure(target, draft, drafts):
    """Mutant: block's thresholds and residual, but stopping at the FIRST failing position."""
    weights = exact_law.block_weights(target, draft, drafts)
    thresholds = exact_law.block_thresholds(target, draft, drafts, weights)
    outcomes, reach = [], 1
    for t, (keep, y) in enumerate(exact_law.block(target, draft, drafts)):
        passes = thresholds[t + 1] if t < len(drafts) else 0
        outcomes.append((reach * (1 - passes), y))
        reach *= passes
    return outcomes


MUTANTS = {"standard residual": _standard_residual, "stops at the first failure": _first_failure}


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutants_are_not_exact(mutant):
    """Both mutants are wrong on random tables at K = 2 and K = 3. The residual mutant is right
    where both residuals keep a single token (on the toy example, b; on about half the V = 3
    instances), so only the first-failure mutant is wrong on the toy example too."""
    rule = MUTANTS[mutant]
    toy_exact = _exact(_constant(TOY_MB), _constant(TOY_MS), 2, 2, rule)
    assert toy_exact == (mutant == "standard residual")
    for num_drafts in (2, 3):
        assert any(
            not _exact(target, draft, k, 3, rule)
            for k, target, draft in INSTANCES
            if k == num_drafts
        )


# --- 2. compiled == reference ---------------------------------------------------------------------


def _short(batch: dict, gen: torch.Generator) -> dict:
    """The batch with random num_draft_tokens in [0, K] and the placeholder past them."""
    num_drafts = torch.randint(0, K + 1, (len(batch["draft_token_ids"]),), generator=gen)
    ids = batch["draft_token_ids"].masked_fill(
        torch.arange(K) >= num_drafts[:, None], PLACEHOLDER_TOKEN_ID
    )
    return dict(batch, draft_token_ids=ids, num_draft_tokens=num_drafts)


def _close_batch(gen: torch.Generator, batch_size: int) -> dict:
    """Drafts from a q near p, so that blocks run long and every tau occurs."""
    batch = _random_batch(gen, batch_size, K, V, filters=False)
    p = batch["target_logits"][:, :K].softmax(-1)
    q = 0.8 * p + 0.2 * torch.softmax(torch.randn(p.shape, generator=gen), -1)
    drafts = torch.multinomial(q.view(-1, V), 1, generator=gen).view(batch_size, K)
    return dict(batch, draft_probs=q, draft_token_ids=drafts)


@pytest.mark.parametrize("short", [False, True], ids=["K drafts", "short proposals"])
def test_block_compiled_equals_plain(short):
    gen = torch.Generator().manual_seed(21 + short)
    for batch in (_random_batch(gen, 300, K, V, filters=False), _close_batch(gen, 300)):
        out = all_implementations(**(_short(batch, gen) if short else batch), method="block")
        assert (out.num_accepted < K).any()
    assert set(out.num_accepted.tolist()) == set(range(K + 1))  # every tau occurs


def test_block_compiled_equals_plain_with_filters():
    gen = torch.Generator().manual_seed(23)
    all_implementations(**_random_batch(gen, 300, K, V, filters=True), method="block")


def test_short_proposals_compiled_equals_plain_for_the_standard_rule():
    gen = torch.Generator().manual_seed(24)
    batch = _short(_close_batch(gen, 300), gen)
    out = all_implementations(**batch)
    assert (out.num_accepted <= batch["num_draft_tokens"]).all()


@pytest.mark.parametrize("method", ["standard", "block"])
def test_a_row_without_drafts_emits_one_token_from_p(method):
    """num_draft_tokens = 0: nothing accepted, one token at position 0 drawn from p (here a
    one-hot p, whatever the placeholder ids and the draft's q say)."""
    logits = torch.full((1, K + 1, 4), float("-inf"))
    logits[0, :, 2] = 0.0
    q = torch.full((1, K, 4), 0.25)
    out = all_implementations(
        logits,
        torch.full((1, K), PLACEHOLDER_TOKEN_ID),
        q,
        uniforms=torch.zeros(1, K, dtype=torch.float64),
        exponentials=torch.ones(1, 4),
        method=method,
        num_draft_tokens=torch.tensor([0]),
    )
    assert out.token_ids.tolist() == [[2, -1, -1, -1]] and out.num_accepted.tolist() == [0]


# --- 3. through the compiled sampler -------------------------------------------------------------


def _laws(case: Case, rule) -> tuple[np.ndarray, dict]:
    """The accepted-length law of ``case`` under ``rule`` (float64 enumeration) and its law of
    emitted tuples."""
    target = lambda prefix: case.target[len(prefix)]  # noqa: E731
    draft = lambda prefix: case.q[len(prefix)]  # noqa: E731
    law = exact_law.round_law(target, draft, K, V, rule, STOPS[case.stop][0] if case.stop else None)
    lengths = np.zeros(K + 1)
    for emitted, prob in law.items():
        lengths[len(emitted) - 1] += prob
    return lengths, law


def _check(cases: list[Case], tally: Tally, rule=exact_law.block) -> FrequencyCheck:
    """Tokens emitted at position j follow p_j (the cases' tables depend on the position only,
    so the round followed by the target is i.i.d. p_j per position, and the rows that reach j
    see p_j); the number accepted follows the rule's length law."""
    check = FrequencyCheck()
    for i, case in enumerate(cases):
        for j in range(K + 1):
            if tally.counts[i, j].sum():
                check.add(f"{case.name}, position {j}", tally.counts[i, j], case.target[j])
        check.add(f"{case.name}, accepted-length law", tally.accepted[i], _laws(case, rule)[0])
    return check


TOY = Case("toy example", [[1 / 3, 2 / 3]] * (K + 1), [[2 / 3, 1 / 3]] * K, stop="two drafts")
SHORT_CASES = [
    TOY,
    Case("stop after a 0", CASES[1].p, CASES[1].q, stop="after a 0"),
    Case("no drafts", CASES[1].p, CASES[1].q, draws=50_000, stop="no drafts"),
]


def test_block_output_follows_target_and_length_law():
    """The 15 hard cases of test_sampling_exactness, probabilistic drafts, through the compiled
    block sampler (the unfiltered and the filtered batch), 200k draws each."""
    check = FrequencyCheck()
    cases = [dataclasses.replace(c, draws=min(c.draws, 200_000)) for c in CASES]
    for cases in ([c for c in cases if not c.filtered], [c for c in cases if c.filtered]):
        check.groups += _check(cases, _run(cases, one_hot=False, method="block")).groups
    assert len(check.groups) > 60
    assert check.failures() == []


@pytest.fixture(scope="module")
def short_tallies() -> dict:
    return {
        method: _run(SHORT_CASES, one_hot=False, method=method) for method in ("standard", "block")
    }


@pytest.mark.parametrize("method", ["standard", "block"])
def test_short_proposals_follow_target_and_length_law(short_tallies, method):
    rule = exact_law.RULES[method]
    assert _check(SHORT_CASES, short_tallies[method], rule).failures() == []
    toy = short_tallies[method].accepted[0]
    expected = {"standard": 10 / 9, "block": 11 / 9}[method]
    lengths = _laws(TOY, rule)[0]
    sigma = np.sqrt((lengths * (np.arange(K + 1) - expected) ** 2).sum() / toy.sum())
    assert abs(toy @ np.arange(K + 1) / toy.sum() - expected) < 6 * sigma


@pytest.mark.parametrize("mutant", MUTANTS)
def test_mutant_laws_fail_the_same_check(mutant):
    """Power: counts drawn from a mutant's exact law (what a sampler implementing it would
    produce, in distribution) at the sizes used above fail the check that block passes."""
    rng = np.random.default_rng(5)
    cases = [TOY, CASES[1]]
    counts = np.zeros((len(cases), K + 1, V), dtype=np.int64)
    accepted = np.zeros((len(cases), K + 1), dtype=np.int64)
    for i, case in enumerate(cases):
        law = _laws(case, MUTANTS[mutant])[1]
        emitted = list(law)
        probs = np.array([law[e] for e in emitted])
        for e, n in zip(emitted, rng.multinomial(case.draws, probs / probs.sum())):
            accepted[i, len(e) - 1] += n
            for j, token in enumerate(e):
                counts[i, j, token] += n
    assert _check(cases, Tally(counts, accepted)).failures() != []
