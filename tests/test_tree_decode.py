"""The tree proposer and its round (minispec/proposers/tree.py, minispec/tree_round.py) keep the
target's law, through the whole decode loop: the tree's slots and mask, the verify, the rule
(sampling/tree.py) and the moving of the accepted path into place.

- A tree of one branch per depth is the chain: the same tokens, seed for seed.
- At temperature 0 a tree gives the K = 0 tokens (float64, where that is exact).
- Whole sequences on the tiny pair of tests/test_decode_exactness.py follow the target's law
  computed by enumeration, at T = 1 with and without filters, with greedy and sampled drafts,
  with rows at three temperatures in one batch, and with an EOS that can come inside a tree;
  the naive tree rule (no residual between siblings) fails the same test.

False alarms: this file's chi-square tests share a budget of 1e-6 (Bonferroni, as in
test_decode_exactness.py, whose pair, prompts and chi-square fit they use).
"""

from __future__ import annotations

import copy
from collections import Counter

import pytest
import torch
from _enumerate import (
    chi_square,
    chi_square_sf,
    full_logits,
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
    target_probs,
)
from test_decode_exactness import NEW_TOKENS, PROMPTS, exactness_pair, fit_p_value

from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig

pytestmark = pytest.mark.usefixtures("one_thread")

# (draft_sample_method, K, tree_branching, top_k, top_p)
# (The pair's context is 16 tokens: a prompt of 5, 4 new tokens and at most 7 nodes.)
CASES = [
    ("probabilistic", 2, (2,), 0, 1.0),
    ("probabilistic", 3, (2,), 4, 0.7),
    ("probabilistic", 2, (2, 2), 0, 1.0),
    ("probabilistic", 2, (3,), 3, 1.0),
    ("greedy", 2, (3,), 0, 1.0),
]
NUM_CHI_SQUARE_TESTS = len(CASES) + 3  # + mixed temperatures, EOS, and the naive rule's
FALSE_ALARM = 1e-6 / NUM_CHI_SQUARE_TESTS


def tree(k: int, branching: tuple[int, ...], method: str = "probabilistic", rule="standard"):
    return SpeculativeConfig(k, method, rule, "tree", tree_branching=branching)


@pytest.fixture(scope="module")
def float64_decoder() -> SpeculativeDecoder:
    target = random_gpt(16, seed=11, scale=1.5, dtype=torch.float64, max_seq_len=64, n_layer=2)
    return SpeculativeDecoder(target, perturbed_copy(target, seed=12, mix=0.3), compile=False)


RAGGED = [[1, 2], [3, 4, 5, 6, 7], [8, 9, 10]]


def seeded(temperature: float) -> list[SamplingParams]:
    return [SamplingParams(temperature, seed=7 + i, max_new_tokens=12) for i in range(3)]


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_a_tree_of_one_branch_is_the_chain(
    float64_decoder: SpeculativeDecoder, temperature: float, method: str
) -> None:
    """Branching 1 at every depth: the same slots, noise and draws as the chain, so the same
    tokens; the tree's mask, its verify and the moved path change nothing."""
    chain = float64_decoder.generate(RAGGED, seeded(temperature), SpeculativeConfig(3, method))
    one = float64_decoder.generate(RAGGED, seeded(temperature), tree(3, (1,), method))
    assert one.token_ids == chain.token_ids
    assert 0 < one.stats.accepted < one.stats.drafted


@pytest.mark.parametrize("branching", [(2,), (3,), (2, 2)])
@pytest.mark.parametrize("method", ["greedy", "probabilistic"])
def test_a_greedy_tree_gives_the_target_only_tokens(
    float64_decoder: SpeculativeDecoder, branching: tuple[int, ...], method: str
) -> None:
    baseline = float64_decoder.generate(RAGGED, seeded(0.0), SpeculativeConfig(0))
    out = float64_decoder.generate(RAGGED, seeded(0.0), tree(3, branching, method))
    assert out.token_ids == baseline.token_ids
    assert 0 < out.stats.accepted < out.stats.drafted


@pytest.mark.parametrize("method,k,branching,top_k,top_p", CASES)
def test_a_tree_keeps_the_law(
    method: str, k: int, branching: tuple[int, ...], top_k: int, top_p: float
) -> None:
    groups = [(p, SamplingParams(1.0, top_k, top_p)) for p in PROMPTS]
    seed_base = 200_000_000 + 1_000_000 * CASES.index((method, k, branching, top_k, top_p))
    assert fit_p_value(tree(k, branching, method), groups, seed_base) > FALSE_ALARM


def test_a_tree_keeps_the_law_at_mixed_temperatures() -> None:
    """Rows at temperature 0 (top-b drafts, one-hot q), 0.6 and 1.7 (drafts without
    replacement) in one batch, each row by its own law."""
    groups = [(prompt, SamplingParams(t)) for prompt in PROMPTS for t in (0.0, 0.6, 1.7)]
    p_value = fit_p_value(tree(3, (2,)), groups, seed_base=210_000_000, rows_per_group=2000)
    assert p_value > FALSE_ALARM


def test_the_naive_tree_rule_fails_the_same_test() -> None:
    """Power: testing the second candidate against p rather than against the residual the
    first one left over-weights the draft's top tokens."""
    groups = [(p, SamplingParams(1.0)) for p in PROMPTS]
    spec = tree(2, (2,), "greedy", rule="naive")
    assert fit_p_value(spec, groups, seed_base=220_000_000) < FALSE_ALARM


EOS = 2  # a token of the tiny vocabulary: rows stop at it, often inside a tree


@torch.no_grad()
def law_with_eos(prompt: list[int], temperature: float, eos: int) -> dict[tuple[int, ...], float]:
    """The target's law over outputs that stop at the first EOS or at NEW_TOKENS tokens."""
    target = exactness_pair()[0]
    law, live = {}, {(): 1.0}
    for depth in range(NEW_TOKENS):
        prefixes = list(live)
        logits = full_logits(target, torch.tensor([prompt + list(s) for s in prefixes]))
        p = target_probs(logits[:, -1], temperature, 0, 1.0).tolist()
        grown = {}
        for prefix, row in zip(prefixes, p):
            for token, prob in enumerate(row):
                if prob > 0:
                    ended = token == eos or depth == NEW_TOKENS - 1
                    (law if ended else grown)[prefix + (token,)] = live[prefix] * prob
        live = grown
    assert abs(sum(law.values()) - 1) < 1e-9
    return law


def test_a_tree_keeps_the_law_with_eos_inside_it() -> None:
    """EOS in the vocabulary: a row ends at the first EOS it keeps, which is often an
    accepted node in the middle of the tree, so the tokens after it in the round are dropped."""
    target, draft = exactness_pair()
    decoder = SpeculativeDecoder(target, draft, compile=False, eos_token_id=EOS)
    rows, prompts, params = 4000, [], []
    for i in range(rows):
        prompts.append(list(PROMPTS[i % 2]))
        params.append(SamplingParams(1.0, seed=230_000_000 + i, max_new_tokens=NEW_TOKENS))
    out = decoder.generate(prompts, params, tree(3, (2,)))
    stopped_inside = sum(EOS in t[:-1] for t in out.token_ids)
    assert stopped_inside == 0 and sum(t[-1] == EOS for t in out.token_ids) > rows // 10
    stat, df = 0.0, 0
    for g, prompt in enumerate(PROMPTS):
        counts = Counter(tuple(t) for i, t in enumerate(out.token_ids) if i % 2 == g)
        s, d = chi_square(counts, law_with_eos(list(prompt), 1.0, EOS))
        stat, df = stat + s, df + d
    assert chi_square_sf(stat, df) > FALSE_ALARM


@torch.no_grad()
def test_the_caches_hold_the_sequence_after_tree_rounds(
    float64_decoder: SpeculativeDecoder,
) -> None:
    """After tree rounds each cache holds, at every position of a row's sequence, the keys and
    values a fresh prefill of that sequence gives: the accepted path was moved into place and
    no sibling's entry is left in it. (The target has every token but the last; the draft may
    also lack the last accepted draft, which it sees first in the next round.)"""
    out = float64_decoder.generate(RAGGED, seeded(1.0), tree(3, (2, 2)))
    assert out.stats.accepted > 0
    for model, behind in ((float64_decoder.target, 1), (float64_decoder.draft, 2)):
        fresh = copy.deepcopy(model)
        for row, (prompt, generated) in enumerate(zip(RAGGED, out.token_ids)):
            sequence = torch.tensor([prompt + generated])
            fresh.setup_cache(1)
            fresh.prefill(sequence)
            known = sequence.shape[1] - behind
            for kept, expected in zip(model.blocks, fresh.blocks):
                for name in ("k", "v"):
                    got = getattr(kept.attn.kv_cache, name)[row, :, :known]
                    want = getattr(expected.attn.kv_cache, name)[0, :, :known]
                    torch.testing.assert_close(got, want, rtol=1e-9, atol=1e-9)


def test_verify_expects_the_exact_tree_figures() -> None:
    """`make verify` part 5's expected figures: the exact acceptance of two candidates on the
    worked example (17/20 i.i.d., 28943/32300 without replacement), output p for the tree rule
    and not for naive."""
    from minispec.commands.verify_checks import P, tree_law

    accept, law = tree_law("iid", "standard")
    assert accept == pytest.approx(17 / 20) and law == pytest.approx(P)
    accept, law = tree_law("without_replacement", "standard")
    assert accept == pytest.approx(28943 / 32300) and law == pytest.approx(P)
    _, law = tree_law("without_replacement", "naive")
    assert abs(law - P).sum() > 0.1


# ---- a tree's size, counted before it is built (issue 54) ----------------------------------


@pytest.mark.parametrize(
    "branching, k", [((2,), 4), ((2, 2), 2), ((3, 1, 2), 5), ((1,), 1), ((4, 4, 2), 3)]
)
def test_the_node_count_is_the_built_trees(branching: tuple[int, ...], k: int) -> None:
    from minispec.rules import tree_nodes
    from sampling.tree import tree_shape

    built = tree_shape(branching + (1,) * (k - len(branching))).num_nodes
    assert tree_nodes(branching, k, bound=10**6) == built == tree(k, branching).tree.num_nodes
    assert tree_nodes(branching, k, bound=built - 1) > built - 1  # stops early, past the bound


TOO_LARGE = [
    (4, (2**70,), "more than 64 nodes"),  # a MemoryError after half a minute, when built
    (5, (64,) * 5, "more than 64 nodes"),
    (4, (64,) * 4, "more than 64 nodes"),
    (2, (64,) * 6, "deeper than the tree's depth K = 2"),
]


@pytest.mark.parametrize("k, branching, fragment", TOO_LARGE)
def test_a_tree_too_large_is_refused_before_it_is_built(
    monkeypatch: pytest.MonkeyPatch,
    float64_decoder: SpeculativeDecoder,
    k: int,
    branching: tuple[int, ...],
    fragment: str,
) -> None:
    def built(*args) -> None:
        raise AssertionError("a tree was built before its size was checked")

    monkeypatch.setattr("minispec.params.tree_shape", built)
    spec = tree(k, branching)
    for refusal in (
        spec.validate,
        lambda: spec.tree,
        lambda: float64_decoder.generate([[1, 2]], seeded(1.0)[:1], spec),
    ):
        with pytest.raises(ValueError, match="tree_branching") as info:
            refusal()
        assert fragment in str(info.value)
