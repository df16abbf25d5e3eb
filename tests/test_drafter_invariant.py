"""method="drafter_invariant" (Daliri et al. 2024): every emitted token is the target's own
exponential race at its position, so a seed gives the K = 0 output whatever drafts were made.

1. The sampler: compiled == eager == plain reference on random mixed batches; the emitted tokens
   are the races argmax p_i / E_i whatever the drafts; with drafts made from the same noise
   (argmax q_i / E_i) the acceptance rate is the coupling's, P(argmax p / E = argmax q / E) =
   sum_x 1 / sum_y max(p_y / p_x, q_y / q_x), by a binomial bound at a false-alarm rate of 1e-6.
2. The decode loop: the whole-sequence law by enumeration (as tests/test_decode_exactness.py
   does for the other rules); token-for-token equality with K = 0 at the same seed for
   K in {1, 2, 4, 8, auto}, every proposer, a row alone and inside a mixed batch (greedy and
   filtered rows, other lengths, an EOS inside a round, max_new_tokens cutting a round), in
   float64 where the forwards round alike.
"""

from __future__ import annotations

import pytest
import torch
from _enumerate import (
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
    random_head,
)
from test_decode_exactness import PROMPTS, fit_p_value
from test_sampling_compiled import _random_batch

import minispec.proposers.parallel
from minispec.decode import SpeculativeDecoder
from minispec.params import PROPOSERS, SamplingParams, SpeculativeConfig
from minispec.proposers import SuffixIndex
from minispec.rules import TREE_PROPOSERS
from sampling import reference, rejection_sample
from sampling.constraints import distribution, normalize_params
from sampling.noise import race
from tests._stats import SMALL, all_implementations, bernstein_radius

pytestmark = pytest.mark.usefixtures("one_thread")

METHOD = "drafter_invariant"
FALSE_ALARM = 1e-6


# ---------------------------------------------------------------------------------------------
# 1. The sampler


def position_noise(batch: dict, gen: torch.Generator) -> dict:
    """The batch with one Exp(1) row per position, [B, K+1, V], and edge values (0 and inf)."""
    b, k, v = batch["draft_probs"].shape
    noise = torch.empty(b, k + 1, v).exponential_(generator=gen)
    noise[torch.rand(noise.shape, generator=gen) < 0.05] = 0.0
    noise[torch.rand(noise.shape, generator=gen) < 0.05] = float("inf")
    return dict(batch, exponentials=noise)


def coupled_batch(seed: int, filters: bool) -> dict:
    """A random mixed batch (tests/test_sampling_compiled.py) with position noise, where half
    the rows draft from the same noise (the coupling), so that drafts are often kept."""
    gen = torch.Generator().manual_seed(seed)
    batch = position_noise(_random_batch(gen, 400, SMALL["drafts"], SMALL["vocab"], filters), gen)
    coupled = race(batch["draft_probs"], batch["exponentials"][:, :-1])
    half = torch.arange(400)[:, None] % 2 == 0
    batch["draft_token_ids"] = torch.where(half, coupled, batch["draft_token_ids"])
    batch["num_draft_tokens"] = torch.randint(0, SMALL["drafts"] + 1, (400,), generator=gen)
    return batch


def test_compiled_equals_plain() -> None:
    """One compiled graph (no filters, rows of every length); the filtered case eagerly below."""
    out = all_implementations(**coupled_batch(40, False), method=METHOD)
    assert (out.num_accepted > 0).any() and (out.num_accepted < SMALL["drafts"]).any()


def test_eager_equals_plain_with_filters() -> None:
    batch = coupled_batch(41, True)
    eager = rejection_sample(**batch, method=METHOD, compiled=False)
    plain = reference.rejection_sample(**batch, method=METHOD)
    assert torch.equal(eager.token_ids, plain.token_ids)
    assert (eager.num_accepted > 0).any() and (eager.num_accepted < SMALL["drafts"]).any()


def test_every_emitted_token_is_the_targets_race() -> None:
    """Whatever the drafts (coupled, random, all wrong), the first n + 1 emitted tokens are
    argmax p_i / E_i at their rows, and n is the first draft that differs from its race."""
    gen = torch.Generator().manual_seed(7)
    b, k, v = 3000, 4, 12
    logits = torch.randn(b, k + 1, v, generator=gen) * 2
    noise = torch.empty(b, k + 1, v).exponential_(generator=gen)
    temperature = torch.where(torch.rand(b, generator=gen) < 0.2, 0.0, 0.9)
    params = normalize_params(temperature, None, 0.95, b, torch.device("cpu"))
    choice = race(distribution(logits, params), noise)  # [B, K+1]
    q = torch.softmax(logits[:, :k] + torch.randn(b, k, v, generator=gen), -1)
    for drafts in (
        race(q, noise[:, :k]),  # the coupling
        torch.randint(0, v, (b, k), generator=gen),
        (choice[:, :k] + 1) % v,  # every draft wrong
    ):
        out = rejection_sample(
            logits, drafts, q, temperature=temperature, top_p=0.95, exponentials=noise,
            method=METHOD, compiled=False,
        )  # fmt: skip
        mismatch = (drafts != choice[:, :k]).long()
        expected_n = torch.where(mismatch.any(1), mismatch.argmax(1), k)
        assert torch.equal(out.num_accepted, expected_n)
        position = torch.arange(k + 1)
        emitted = position <= out.num_accepted[:, None]
        assert torch.equal(out.token_ids[emitted], choice[emitted])
        assert bool((out.token_ids[~emitted] == -1).all())


def coupling_acceptance(p: torch.Tensor, q: torch.Tensor) -> float:
    """P(argmax p / E = argmax q / E = x) = 1 / sum_y max(p_y / p_x, q_y / q_x): given E_x = e,
    x wins both races when every other E_y exceeds e max(p_y / p_x, q_y / q_x)."""
    total = 0.0
    for x in range(len(p)):
        if p[x] > 0 and q[x] > 0:
            total += 1 / float(torch.maximum(p / p[x], q / q[x]).sum())
    return total


def test_acceptance_is_the_couplings() -> None:
    """K = 1 drafts from the same noise: the accepted count is Binomial(N, the coupling's
    acceptance), which lies between (1 - d) / (1 + d) and 1 - d (d the total variation)."""
    p = torch.tensor([0.50, 0.25, 0.15, 0.07, 0.03], dtype=torch.float64)
    q = torch.tensor([0.30, 0.40, 0.10, 0.15, 0.05], dtype=torch.float64)
    expected = coupling_acceptance(p, q)
    d = 0.5 * float((p - q).abs().sum())
    assert (1 - d) / (1 + d) <= expected < 1 - d
    n = 200_000
    noise = torch.empty(n, 2, 5).exponential_(generator=torch.Generator().manual_seed(3))
    q_rows = q.float().expand(n, 1, 5).contiguous()
    drafts = race(q_rows, noise[:, :1])
    logits = p.log().float().expand(n, 2, 5).contiguous()
    out = rejection_sample(
        logits, drafts, q_rows, exponentials=noise, method=METHOD, compiled=False
    )
    accepted = int(out.num_accepted.sum())
    assert abs(accepted - n * expected) < bernstein_radius(n, expected, FALSE_ALARM)
    # Power: the token-wise rule's acceptance, 1 - d = 0.75, lies far outside the bound.
    assert abs(n * (1 - d) - n * expected) > bernstein_radius(n, expected, FALSE_ALARM)


# ---------------------------------------------------------------------------------------------
# 2. The decode loop


@pytest.mark.parametrize("k,top_k,top_p", [(3, 0, 1.0), (2, 4, 0.7)])
def test_sequence_law_matches_target(k: int, top_k: int, top_p: float) -> None:
    """The whole-sequence law by enumeration (V = 8, 4 new tokens, 2 ragged prompts); the naive
    rule failing this very test is tests/test_decode_exactness.py's power check."""
    groups = [(prompt, SamplingParams(1.0, top_k, top_p)) for prompt in PROMPTS]
    spec = SpeculativeConfig(k, "probabilistic", METHOD)
    assert fit_p_value(spec, groups, seed_base=120_000_000 + 1_000_000 * k) > FALSE_ALARM / 2


VOCAB = 16
EOS = 3  # inside the vocabulary: rows end at random places, some inside a round


# Our row: at T = 0.6 this target falls into runs, which the n-gram proposer matches. The others:
# greedy, filtered, other lengths and budgets, other seeds; one ends at an EOS.
OURS = ([4, 5, 6, 4, 5, 6, 4, 5], SamplingParams(0.6, top_p=0.95, seed=22, max_new_tokens=24))
OTHERS = [
    ([1, 2], SamplingParams(0.0, max_new_tokens=30)),
    ([7, 8, 9, 10, 11], SamplingParams(0.8, top_k=5, seed=22, max_new_tokens=5)),
    ([4, 5, 6, 4, 5, 6, 4, 5], SamplingParams(1.0, seed=21, max_new_tokens=17)),
]


@pytest.fixture(scope="module")
def decoder() -> SpeculativeDecoder:
    """A float64 pair (the (K+1)-token verify rounds like the 1-token step there), a draft
    close enough to be kept often, and a suffix index over text the target itself wrote (at
    other seeds too), so that suffix lookups are kept as well."""
    target = random_gpt(VOCAB, seed=11, scale=1.5, dtype=torch.float64, max_seq_len=64, n_layer=2)
    draft = perturbed_copy(target, seed=12, mix=0.2)
    plain = SpeculativeDecoder(target, draft, compile=False, eos_token_id=EOS)
    prompt, params = OURS
    written = []
    for seed in range(20, 26):
        row = SamplingParams(params.temperature, top_p=params.top_p, seed=seed, max_new_tokens=24)
        written += prompt + plain.generate([prompt], [row], SpeculativeConfig(0)).token_ids[0]
    return SpeculativeDecoder(
        target,
        draft,
        compile=False,
        eos_token_id=EOS,
        suffix_index=SuffixIndex.build(torch.tensor(written).numpy(), min_match=2),
        head=random_head(target, seed=13),
    )


def generate(decoder: SpeculativeDecoder, rows: list, k, proposer: str = "draft_model"):
    spec = SpeculativeConfig(k, "auto", METHOD, proposer)
    return decoder.generate([p for p, _ in rows], [s for _, s in rows], spec)


# Trees verify with the token-wise rule only (SpeculativeConfig refuses drafter_invariant).
@pytest.mark.parametrize("proposer", [name for name in PROPOSERS if name not in TREE_PROPOSERS])
def test_same_tokens_as_k0(
    decoder: SpeculativeDecoder, proposer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    vocab = decoder.target.config.vocab_size  # the parallel drafter's mask: a tiny vocab's last id
    monkeypatch.setattr(minispec.proposers.parallel, "MASK_TOKEN_ID", vocab - 1)
    batch = [*OTHERS[:2], OURS, OTHERS[2]]
    alone_k0 = generate(decoder, [OURS], 0, proposer).token_ids[0]
    batch_k0 = generate(decoder, batch, 0, proposer).token_ids
    assert batch_k0[2] == alone_k0
    kept = 0
    for k in (1, 2, 4, 8, "auto"):
        assert generate(decoder, [OURS], k, proposer).token_ids[0] == alone_k0, (k, "alone")
        out = generate(decoder, batch, k, proposer)
        assert out.token_ids == batch_k0, (k, "in a batch")
        kept += out.stats.accepted
    assert kept > 0  # drafts were kept: the rounds did more than K = 0's work
    assert any(EOS in row for row in batch_k0)  # some row ended at an EOS
    assert any(len(row) == s.max_new_tokens for row, (_, s) in zip(batch_k0, batch))


def test_the_seed_matters(decoder: SpeculativeDecoder) -> None:
    """Power for the equality test: another seed gives other tokens."""
    other = (OURS[0], SamplingParams(1.0, top_p=0.95, seed=99, max_new_tokens=24))
    ours = generate(decoder, [OURS], 4).token_ids
    assert generate(decoder, [other], 4).token_ids != ours


def test_the_standard_rule_is_not_drafter_invariant(decoder: SpeculativeDecoder) -> None:
    """The property is the rule's, not the loop's: the token-wise rule's output changes with K."""
    outputs = set()
    for k in (0, 1, 2, 4):
        spec = SpeculativeConfig(k, "auto", "standard")
        outputs.add(tuple(decoder.generate([OURS[0]], [OURS[1]], spec).token_ids[0]))
    assert len(outputs) > 1


def test_a_one_hot_draft_is_kept_only_as_the_race() -> None:
    """A deterministic (lookup) draft: kept while it equals the race, replaced at the first
    difference; its q is never read."""
    logits = torch.tensor([[[0.0, 1.0, 2.0], [2.0, 1.0, 0.0], [0.0, 0.0, 0.0]]])
    noise = torch.ones(1, 3, 3)  # the race is then the argmax of p
    for drafts, n in (([2, 0], 2), ([2, 1], 1), ([0, 0], 0)):
        out = rejection_sample(
            logits, torch.tensor([drafts]), None, exponentials=noise, method=METHOD, compiled=False
        )
        assert int(out.num_accepted[0]) == n
        assert out.token_ids[0, n] == [2, 0, 0][n]


@pytest.mark.slow
def test_a_compiled_round_gives_the_eager_k0_tokens(decoder: SpeculativeDecoder) -> None:
    """One compiled graph (K = 2, our row alone): the tier does not change the tokens either."""
    compiled = SpeculativeDecoder(decoder.target, decoder.draft, compile=True, eos_token_id=EOS)
    eager_k0 = generate(decoder, [OURS], 0).token_ids
    out = generate(compiled, [OURS], 2)
    assert out.token_ids == eager_k0
    assert out.stats.compiled_calls > 0 and out.stats.accepted > 0
