"""The decode loop samples from the target's distribution, exactly (issue 4, "Tests").

- Greedy equality: at temperature 0 the speculative output equals target-only (K = 0) output
  token for token, in float64 where that is exact, and on the shipped float32 pair.
- Whole-sequence exactness: on a tiny random pair (V = 8, 4 new tokens) the empirical law of
  whole generated sequences, over thousands of rows with their own seeds, matches the target's
  law computed by enumeration (tests/_enumerate.py), by a chi-square test. The naive rule
  (resample from p after a rejection) must fail the same test, and so must a drafter that
  breaks the q contract.

False alarms: the chi-square tests of this file share a budget of 1e-6 (Bonferroni: each runs at
1e-6 / their number). Cells are pooled to expectations >= 20, where the chi-square tail is a
good approximation of the multinomial's. The seeds are fixed, so the outcome is deterministic;
the rate says how unlucky a choice of seeds would have to be to fail an exact sampler.
"""

from __future__ import annotations

from functools import lru_cache
from pathlib import Path

import pytest
import torch
from _enumerate import (
    law_fit,
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
    random_head,
    sequence_law,
)

import minispec.proposers
import minispec.proposers.draft_model
import minispec.proposers.parallel
from minispec.commands.cli import DEFAULT_PROMPT
from minispec.decode import SpeculativeDecoder
from minispec.params import AdaptiveConfig, SamplingParams, SpeculativeConfig
from minispec.policies.adaptive import AdaptivePolicy
from minispec.proposers import Proposal, Registered, SuffixIndex
from model import tokenizer
from model.checkpoint import load_pair
from model.gpt import GPT
from model.head import FeatureHead
from sampling import SampleOutput

pytestmark = pytest.mark.usefixtures("one_thread")

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"


# ---------------------------------------------------------------------------------------------
# Greedy equality


GREEDY_PROMPTS = [[1, 2], [3, 4, 5, 6, 7], [8, 9, 10]]  # ragged
GREEDY_MAX_NEW = [14, 9, 12]


@pytest.fixture(scope="module")
def float64_pair() -> tuple[GPT, GPT]:
    target = random_gpt(16, seed=11, scale=1.5, dtype=torch.float64, max_seq_len=32, n_layer=2)
    return target, perturbed_copy(target, seed=12, mix=0.3)


def greedy_params() -> list[SamplingParams]:
    return [SamplingParams(temperature=0.0, max_new_tokens=m) for m in GREEDY_MAX_NEW]


def test_greedy_float64_speculative_equals_target_only(float64_pair: tuple[GPT, GPT]) -> None:
    decoder = SpeculativeDecoder(*float64_pair, compile=False)
    baseline = decoder.generate(GREEDY_PROMPTS, greedy_params(), SpeculativeConfig(0))
    assert [len(t) for t in baseline.token_ids] == GREEDY_MAX_NEW
    for k in (1, 3):
        for method in ("greedy", "probabilistic", "auto"):
            out = decoder.generate(GREEDY_PROMPTS, greedy_params(), SpeculativeConfig(k, method))
            assert out.token_ids == baseline.token_ids, (k, method)
            # Both branches of the round ran: some drafts accepted, some rejected.
            assert 0 < out.stats.accepted < out.stats.drafted, (k, method)


def test_greedy_float64_every_proposer_equals_target_only(
    float64_pair: tuple[GPT, GPT], monkeypatch: pytest.MonkeyPatch
) -> None:
    decoder = SpeculativeDecoder(*float64_pair, compile=False, suffix_index=lookup_index())
    baseline = decoder.generate(GREEDY_PROMPTS, greedy_params(), SpeculativeConfig(0))
    monkeypatch.setattr(minispec.proposers.parallel, "MASK_TOKEN_ID", 15)  # V = 16
    for proposer in ("ngram", "suffix", "parallel", "parallel_tree"):
        for k in (3,) if proposer == "parallel_tree" else (3, "auto"):  # a tree's depth is fixed
            out = decoder.generate(
                GREEDY_PROMPTS, greedy_params(), SpeculativeConfig(k, proposer=proposer)
            )
            assert out.token_ids == baseline.token_ids, (proposer, k)


SHIPPED_PROMPTS = [
    DEFAULT_PROMPT,
    "def add(a, b):\n    return",
    "import os\n\n\nclass ",
    "The quick brown fox",
]


@pytest.mark.skipif(
    not (CHECKPOINTS / "target.safetensors").is_file()
    or not (CHECKPOINTS / "draft.safetensors").is_file(),
    reason="the shipped pair (checkpoints/*.safetensors) is not trained yet",
)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_greedy_shipped_pair_speculative_equals_target_only(dtype: torch.dtype) -> None:
    """float32, and bfloat16 weights (the target is then the bfloat16 model, for both runs): a
    batched (K+1)-token verify may round differently from a 1-token step and so may flip a
    near-tie between two logits. A row may therefore part from the K = 0 tokens only where the
    target's two best logits lie within two units of the dtype's rounding (measured: on the
    shipped pair in bfloat16, one prompt parts at a gap of 0.0625, one bfloat16 unit at 8.9);
    before that point, and wherever no such tie comes, the tokens must be equal."""
    target, draft = load_pair(CHECKPOINTS / "target.safetensors", CHECKPOINTS / "draft.safetensors")
    target, draft = target.to(dtype), draft.to(dtype)
    decoder = SpeculativeDecoder(target, draft, compile=False)
    prompts = [tokenizer.encode(p) for p in SHIPPED_PROMPTS]
    params = lambda: [SamplingParams(temperature=0.0, max_new_tokens=40) for _ in prompts]  # noqa: E731
    baseline = decoder.generate(prompts, params(), SpeculativeConfig(0)).token_ids
    for k, method in ((4, "greedy"), (2, "probabilistic")):
        out = decoder.generate(prompts, params(), SpeculativeConfig(k, method))
        for prompt, got, expected in zip(prompts, out.token_ids, baseline):
            if got != expected:
                gap, unit = near_tie_at_first_difference(target, prompt, got, expected)
                assert gap <= 2 * unit, (k, method, gap, unit)
        assert 0 < out.stats.accepted < out.stats.drafted, (k, method)


def near_tie_at_first_difference(
    target: GPT, prompt: list[int], got: list[int], expected: list[int]
) -> tuple[float, float]:
    """At the first position where two greedy outputs part: the gap between the target's two
    best logits (a cache-free forward), and one unit of the rounding of the target's weights'
    dtype at the best logit."""
    at = next(i for i, (a, b) in enumerate(zip(got, expected + [-1])) if a != b)
    with torch.no_grad():
        logits = target(torch.tensor([prompt + expected[:at]]))[0, -1]
    top = logits.float().topk(2).values
    dtype = target.embed.weight.dtype  # the logits may come out wider than the weights
    return float(top[0] - top[1]), torch.finfo(dtype).eps * abs(float(top[0]))


# ---------------------------------------------------------------------------------------------
# Whole-sequence exactness

VOCAB, NEW_TOKENS = 8, 4
PROMPTS = ((3, 5), (1, 6, 2, 7, 0))  # two lengths in every batch: ragged rows
ROWS_PER_PROMPT = 6000

# (draft_sample_method, K, top_k, top_p): both draft methods at both K without filters, and every
# filter combination under both methods.
CASES = [
    ("greedy", 1, 0, 1.0),
    ("greedy", 3, 0, 1.0),
    ("probabilistic", 1, 0, 1.0),
    ("probabilistic", 3, 0, 1.0),
    ("greedy", 3, 3, 1.0),
    ("probabilistic", 1, 3, 1.0),
    ("greedy", 1, 0, 0.8),
    ("probabilistic", 3, 0, 0.8),
    ("greedy", 3, 4, 0.7),
    ("probabilistic", 3, 4, 0.7),
]
MIXED_TEMPERATURES = (0.0, 0.6, 1.7)
BLOCK_CASES = [(2, 0, 1.0), (3, 4, 0.7)]  # (K, top_k, top_p); K = 2 is not degenerate
# (proposer, rejection_sample_method): the lookup proposers, with their short proposals
# (the draft model is CASES' and BLOCK_CASES').
PROPOSER_CASES = [
    ("ngram", "standard"),
    ("suffix", "standard"),
    ("feature_head", "standard"),
    ("feature_head", "block"),
    ("head_tree", "standard"),
    ("parallel", "standard"),
    ("parallel_tree", "standard"),
]
AUTO_RULES = ("standard", "block")  # the rules a T = 0 and a T = 1 row are run by under "auto"
# + the mixed-temperature batch, the adaptive-K test and a newly registered proposer
NUM_CHI_SQUARE_TESTS = len(CASES) + len(BLOCK_CASES) + len(PROPOSER_CASES) + len(AUTO_RULES) + 3
FALSE_ALARM = 1e-6 / NUM_CHI_SQUARE_TESTS


@lru_cache(maxsize=1)
def exactness_pair() -> tuple[GPT, GPT]:
    """Peaky conditionals (logit std ~1.5: the most likely of the 4096 sequences has p ~ 0.3)
    and a draft close enough to accept often but far enough to be corrected often."""
    target = random_gpt(VOCAB, seed=1, scale=1.5)
    return target, perturbed_copy(target, seed=2, mix=0.15)


@lru_cache(maxsize=1)
def exactness_head() -> FeatureHead:
    """A random head for the exactness pair's target: drafts that are often right and often
    wrong (its q is nothing like p; only that q is the law each draft was drawn from matters)."""
    return random_head(exactness_pair()[0], seed=3)


@lru_cache(maxsize=None)
def law(prompt: tuple[int, ...], temperature: float, top_k: int, top_p: float) -> dict:
    return sequence_law(exactness_pair()[0], list(prompt), NEW_TOKENS, temperature, top_k, top_p)


@lru_cache(maxsize=1)
def lookup_index() -> SuffixIndex:
    """A corpus of 200 random tokens: about a third of the 512 possible 3-token contexts occur in
    it, so some rows get a suffix proposal and others none, and which changes as they grow."""
    corpus = torch.randint(0, VOCAB, (200,), generator=torch.Generator().manual_seed(5))
    return SuffixIndex.build(corpus.numpy(), min_match=3)


def sample_sequences(
    spec: SpeculativeConfig, row_params: list[SamplingParams], prompts: list[list[int]]
) -> list[tuple[int, ...]]:
    """One batched generate: every row its own seed (taken from row_params)."""
    decoder = SpeculativeDecoder(
        *exactness_pair(), compile=False, suffix_index=lookup_index(), head=exactness_head()
    )
    out = decoder.generate(prompts, row_params, spec)
    assert all(len(t) == NEW_TOKENS for t in out.token_ids)
    return [tuple(t) for t in out.token_ids]


def fit_p_value(
    spec: SpeculativeConfig,
    groups: list[tuple[tuple[int, ...], SamplingParams]],
    seed_base: int,
    rows_per_group: int = ROWS_PER_PROMPT,
) -> float:
    """Run rows_per_group rows of each group (a prompt and its sampling parameters) in one
    batch, interleaved, and return the p-value of the chi-square fit summed over groups
    (independent groups: the statistics and their degrees of freedom add)."""
    prompts, params, group_of = [], [], []
    for _ in range(rows_per_group):
        for g, (prompt, p) in enumerate(groups):
            prompts.append(list(prompt))
            params.append(
                SamplingParams(p.temperature, p.top_k, p.top_p, seed_base + len(params), NEW_TOKENS)
            )
            group_of.append(g)
    sequences = sample_sequences(spec, params, prompts)
    laws = [law(prompt, p.temperature, p.top_k, p.top_p) for prompt, p in groups]
    return law_fit(sequences, group_of, laws)[0]


@pytest.mark.parametrize("method,k,top_k,top_p", CASES)
def test_sequence_law_matches_target(method: str, k: int, top_k: int, top_p: float) -> None:
    groups = [(p, SamplingParams(1.0, top_k, top_p)) for p in PROMPTS]
    p_value = fit_p_value(
        SpeculativeConfig(k, method),
        groups,
        seed_base=1_000_000 * (1 + CASES.index((method, k, top_k, top_p))),
    )
    assert p_value > FALSE_ALARM


@pytest.mark.parametrize(
    "method,k,top_k,top_p", [("greedy", 1, 0, 1.0), ("probabilistic", 3, 4, 0.7)]
)
def test_naive_rule_fails_the_same_test(method: str, k: int, top_k: int, top_p: float) -> None:
    """Power: resampling from p after a rejection over-weights the drafted tokens (greedy
    drafts) or under-weights the tokens q likes (probabilistic ones); the test sees it."""
    groups = [(p, SamplingParams(1.0, top_k, top_p)) for p in PROMPTS]
    p_value = fit_p_value(SpeculativeConfig(k, method, "naive"), groups, seed_base=50_000_000)
    assert p_value < FALSE_ALARM


def test_a_drafter_breaking_the_q_contract_fails_the_same_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Power: a probabilistic drafter that samples under top-k but passes on the unfiltered
    softmax as draft_probs (the bug of transformers issue 47932) biases the output."""
    real_sample = minispec.proposers.draft_model.sample

    def unfiltered_q(logits: torch.Tensor, **kwargs) -> SampleOutput:
        return SampleOutput(real_sample(logits, **kwargs).token_ids, logits.float().softmax(-1))

    monkeypatch.setattr(minispec.proposers.draft_model, "sample", unfiltered_q)
    groups = [(p, SamplingParams(1.0, top_k=3)) for p in PROMPTS]
    assert (
        fit_p_value(SpeculativeConfig(1, "probabilistic"), groups, seed_base=60_000_000)
        < FALSE_ALARM
    )


def test_a_feature_head_breaking_the_q_contract_fails_the_same_test(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Power, for the feature head: drafts sampled under top-k with the unfiltered softmax
    passed on as draft_probs bias the output."""

    real_draw = minispec.proposers.draft_model.draw

    def unfiltered_q(logits: torch.Tensor, constraints, noise) -> tuple:
        token, _ = real_draw(logits, constraints, noise)
        return token, logits.float().softmax(-1)

    monkeypatch.setattr(minispec.proposers.draft_model, "draw", unfiltered_q)
    groups = [(p, SamplingParams(1.0, top_k=3)) for p in PROMPTS]
    spec = SpeculativeConfig(2, "probabilistic", proposer="feature_head")
    assert fit_p_value(spec, groups, seed_base=61_000_000, rows_per_group=3000) < FALSE_ALARM


def test_mixed_temperatures_in_one_batch() -> None:
    """Rows at temperature 0 (a point mass: the greedy sequence), 0.6 and 1.7 share a batch;
    each row follows its own law."""
    groups = [(prompt, SamplingParams(t)) for prompt in PROMPTS for t in MIXED_TEMPERATURES]
    p_value = fit_p_value(
        SpeculativeConfig(3, "probabilistic"), groups, seed_base=70_000_000, rows_per_group=2000
    )
    assert p_value > FALSE_ALARM


@pytest.mark.parametrize("k,top_k,top_p", BLOCK_CASES)
def test_block_verification_keeps_the_law(k: int, top_k: int, top_p: float) -> None:
    """Block verification with the probabilistic drafter at T = 1, where it differs from the
    token-wise rule."""
    groups = [(p, SamplingParams(1.0, top_k, top_p)) for p in PROMPTS]
    spec = SpeculativeConfig(k, "probabilistic", "block")
    assert fit_p_value(spec, groups, seed_base=80_000_000 + 1_000_000 * k) > FALSE_ALARM


@pytest.mark.parametrize("rejection", AUTO_RULES)
def test_auto_drafting_keeps_the_law_in_a_mixed_batch(rejection: str) -> None:
    """draft_sample_method "auto": in one batch a T = 0 row drafts greedily (a one-hot q) and a
    T = 1 row samples, inside the same round; each row follows its own law, under token-wise
    and block verification."""
    groups = [(prompt, SamplingParams(t)) for prompt in PROMPTS for t in (0.0, 1.0)]
    spec = SpeculativeConfig(3, "auto", rejection)
    seed_base = 75_000_000 + 1_000_000 * AUTO_RULES.index(rejection)
    assert fit_p_value(spec, groups, seed_base, rows_per_group=2500) > FALSE_ALARM


# One prompt repeats itself (the n-gram proposer matches at once), one does not (at first).
LOOKUP_PROMPTS = ((3, 5, 3, 5, 3), (1, 6, 2, 7, 0))


@pytest.mark.parametrize("proposer,rejection", PROPOSER_CASES)
def test_every_proposer_keeps_the_law(
    proposer: str, rejection: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """T = 0 and T = 1 rows in one batch; rows with full, short (none) and mixed proposals."""
    monkeypatch.setattr(minispec.proposers.parallel, "MASK_TOKEN_ID", VOCAB - 1)
    groups = [(prompt, SamplingParams(t)) for prompt in LOOKUP_PROMPTS for t in (0.0, 1.0)]
    spec = SpeculativeConfig(3, "probabilistic", rejection, proposer)
    seed_base = 90_000_000 + 1_000_000 * PROPOSER_CASES.index((proposer, rejection))
    assert fit_p_value(spec, groups, seed_base, rows_per_group=2500) > FALSE_ALARM


class RepeatLast:
    """What a fork adds: a proposer in one class, registered once. It proposes the row's last
    token K times (deterministic: a one-hot q)."""

    def propose(self, state, num_speculative_tokens: int, sampling, key_positions) -> Proposal:
        last = state.tokens.gather(1, state.seq_len[:, None] - 1)
        ids = last.expand(-1, num_speculative_tokens).clone()
        return Proposal(ids, torch.full_like(state.seq_len, num_speculative_tokens))


def test_a_proposer_registered_once_keeps_the_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """One entry in PROPOSERS makes a new proposer a valid SpeculativeConfig.proposer, and the
    loop runs it; the whole-sequence law holds, at T = 0 and T = 1 in one batch."""
    entry = Registered(lambda held: RepeatLast())
    monkeypatch.setitem(minispec.proposers.PROPOSERS, "repeat_last", entry)
    groups = [(prompt, SamplingParams(t)) for prompt in LOOKUP_PROMPTS for t in (0.0, 1.0)]
    spec = SpeculativeConfig(3, "probabilistic", proposer="repeat_last")
    assert fit_p_value(spec, groups, seed_base=97_000_000, rows_per_group=2500) > FALSE_ALARM


def test_adaptive_k_keeps_the_law(monkeypatch: pytest.MonkeyPatch) -> None:
    """K chosen each round from the batch's past: here by a rule as data-dependent as can be
    (the round's index plus the parity of the tokens the rows still have to emit), so that every
    width, K = 0 included, follows another; the draft model then catches up after K = 0
    rounds."""
    widths = (0, 1, 3)
    chosen = []

    def by_history(policy: AdaptivePolicy) -> int:
        chosen.append((len(chosen) + sum(policy.remaining) % 2) % len(widths))
        return widths[chosen[-1]]

    monkeypatch.setattr(AdaptivePolicy, "choose", by_history)
    groups = [(prompt, SamplingParams(t)) for prompt in LOOKUP_PROMPTS for t in (0.0, 1.0)]
    spec = SpeculativeConfig("auto", "probabilistic", adaptive=AdaptiveConfig(widths=widths))
    assert fit_p_value(spec, groups, seed_base=99_000_000, rows_per_group=2500) > FALSE_ALARM
    assert len(set(int(c) for c in chosen[:-1])) == len(widths), chosen  # every width ran
