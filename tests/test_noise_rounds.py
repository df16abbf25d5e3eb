"""No two rounds share a random number (sampling/noise.py), and why it matters: block verification.

Block verification keeps X^tau with tau the LAST passing position, so every uniform after tau
failed and every draft after tau entered the block's weights: those numbers are conditioned on
what was kept. Numbers keyed by the drafted token's position hand them to the next round, which
starts inside the old block. The tests below see that, and that round-keyed noise does not.

1. The sampler alone: fixed p and q over V = 3, K = 3, rows of three tokens made round by round.
   Position-keyed noise (consecutive rounds overlap, as the loop's used to) biases block's law;
   round-keyed noise does not; the token-wise rule survives either.
2. The decode loop: a V = 5 target and a draft close to it, K = 3, T = 1, probabilistic drafts;
   block verification through the loop with the loop's own noise keeps the law, and with
   position-keyed noise swapped in it fails the same test.
3. The keys themselves: fresh per round, the same for a row in any batch and under any K.

Judged by Pearson's chi-square over every cell of the whole-sequence law (cells pooled to an
expectation >= 20; tests/_enumerate.py), each test at a false-alarm rate of 1e-6. The seeds are
fixed, so the outcome is deterministic; the rate says how unlucky a choice of seeds would have to
be to fail an exact sampler.
"""

from __future__ import annotations

from collections import Counter
from functools import lru_cache
from itertools import product

import pytest
import torch
from _enumerate import (
    chi_square,
    chi_square_sf,
    law_fit,
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
    sequence_law,
)

import minispec.round
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from sampling import noise as rng
from sampling import rejection_sample
from sampling.noise import race

pytestmark = pytest.mark.usefixtures("one_thread")

FALSE_ALARM = 1e-6


def position_keyed_noise(
    seeds: torch.Tensor, start: torch.Tensor, num_speculative_tokens: int, vocab_size: int, *_
) -> rng.RoundNoise:
    """The wrong keying, for power: the draft's noise and the uniforms keyed by the absolute
    position of the drafted token, so the round that starts at s + n + 1 draws the numbers of
    s + n + 1..s + K - 1 a second time."""
    positions = start[:, None] + torch.arange(num_speculative_tokens)
    draft = rng.exponential_float32(
        rng.hash_key(seeds[:, None], positions, rng.STREAM_DRAFT), vocab_size
    )
    uniforms = rng.uniform_float64(rng.hash_key(seeds[:, None], positions, rng.STREAM_UNIFORM))
    target = rng.exponential_float32(rng.hash_key(seeds, start, rng.STREAM_TARGET), vocab_size)
    return rng.RoundNoise(draft, uniforms, target)


def fresh_noise(
    seeds: torch.Tensor, start: torch.Tensor, num_speculative_tokens: int, vocab_size: int, method
) -> rng.RoundNoise:
    return rng.round_noise(seeds, start, num_speculative_tokens, vocab_size, method)


# ---------------------------------------------------------------------------------------------
# 1. The sampler alone

P_FIXED, Q_FIXED = [0.5, 0.3, 0.2], [0.4, 0.35, 0.25]  # a draft close to the target
SAMPLER_ROWS, SAMPLER_LENGTH, SAMPLER_K = 60_000, 3, 3


def rounds_of_the_sampler(method: str, noise) -> Counter:
    """Every row makes SAMPLER_LENGTH tokens, round by round, each round drafting K tokens from
    q with the round's draft noise and verifying them against p: the decode loop without
    models. Returns the counts of the rows' token sequences."""
    rows, k, vocab = SAMPLER_ROWS, SAMPLER_K, len(P_FIXED)
    seeds = torch.arange(rows) + 7
    logits = torch.tensor(P_FIXED).log().expand(rows, k + 1, vocab).contiguous()
    q = torch.tensor(Q_FIXED).expand(rows, k, vocab).contiguous()
    length = torch.zeros(rows, dtype=torch.long)
    out = torch.full((rows, SAMPLER_LENGTH + k + 1), -1)  # the last column takes what is cut
    while bool((length < SAMPLER_LENGTH).any()):
        round_ = noise(seeds, length, k, vocab, method)
        drafts = race(q, round_.draft)  # x_i ~ q, by the exponential race
        result = rejection_sample(
            logits,
            drafts,
            q,
            uniforms=round_.uniforms,
            exponentials=round_.target,
            method=method,
            compiled=False,
        )
        kept = (result.token_ids >= 0) & (length[:, None] < SAMPLER_LENGTH)
        position = torch.where(kept, length[:, None] + torch.arange(k + 1), out.shape[1] - 1)
        out.scatter_(1, position, torch.where(kept, result.token_ids, -1))
        length = torch.where(length < SAMPLER_LENGTH, length + result.num_accepted + 1, length)
    return Counter(tuple(row) for row in out[:, :SAMPLER_LENGTH].tolist())


def fixed_law() -> dict[tuple[int, ...], float]:
    """p x p x p: the tables do not depend on the prefix."""
    law = {}
    for sequence in product(range(len(P_FIXED)), repeat=SAMPLER_LENGTH):
        law[sequence] = float(torch.tensor([P_FIXED[x] for x in sequence]).double().prod())
    return law


@pytest.mark.parametrize(
    "method,noise,exact",
    [
        ("block", fresh_noise, True),
        ("standard", fresh_noise, True),
        ("standard", position_keyed_noise, True),  # reuse past the first rejection is harmless
        ("block", position_keyed_noise, False),  # reuse of what block conditioned is not
    ],
)
def test_the_sampler_through_rounds(method: str, noise, exact: bool) -> None:
    stat, df = chi_square(rounds_of_the_sampler(method, noise), fixed_law())
    p_value = chi_square_sf(stat, df)
    assert (p_value > FALSE_ALARM) == exact, f"chi2 {stat:.1f} / {df}, p = {p_value:.3g}"


# ---------------------------------------------------------------------------------------------
# 2. Through the decode loop

LOOP_VOCAB, LOOP_PROMPT, LOOP_NEW, LOOP_K, LOOP_ROWS = 5, [1, 3], 3, 3, 30_000


@lru_cache(maxsize=1)
def close_pair():
    """A peaky V = 5 target (logit std ~1.5) and a draft close to it (alpha ~0.65 per token):
    block's tau is often past a failed position, where the conditioned numbers sit."""
    target = random_gpt(LOOP_VOCAB, seed=1, scale=1.5)
    return target, perturbed_copy(target, seed=2, mix=0.3)


def loop_p_value(method: str, seed_base: int) -> tuple[float, float, int]:
    target, draft = close_pair()
    decoder = SpeculativeDecoder(target, draft, compile=False)
    params = [
        SamplingParams(1.0, seed=seed_base + i, max_new_tokens=LOOP_NEW) for i in range(LOOP_ROWS)
    ]
    out = decoder.generate(
        [LOOP_PROMPT] * LOOP_ROWS, params, SpeculativeConfig(LOOP_K, "probabilistic", method)
    )
    law = sequence_law(target, LOOP_PROMPT, LOOP_NEW)
    return law_fit(out.token_ids, [0] * LOOP_ROWS, [law])


@pytest.mark.parametrize("method", ["block", "standard"])
def test_the_loop_keeps_the_law(method: str) -> None:
    p_value, stat, df = loop_p_value(method, seed_base=3_000_000)
    assert p_value > FALSE_ALARM, f"chi2 {stat:.1f} / {df}, p = {p_value:.3g}"


def test_the_loop_with_position_keyed_noise_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    """Power: the same test, with the noise keyed by position as the loop's was, sees block's
    bias (the rounds run eagerly, so the module's round_noise is the one they call)."""
    monkeypatch.setattr(minispec.round, "round_noise", position_keyed_noise)
    p_value, stat, df = loop_p_value("block", seed_base=3_000_000)
    assert p_value < FALSE_ALARM, f"chi2 {stat:.1f} / {df}, p = {p_value:.3g}"


# ---------------------------------------------------------------------------------------------
# 3. The keys


def test_every_round_draws_fresh_numbers() -> None:
    """Rounds of a row at different starts share no uniform and no draft noise row, even
    where their positions overlap (start 10 with K = 4 and start 12)."""
    seeds = torch.tensor([5])
    first = rng.round_noise(seeds, torch.tensor([10]), 4, 16)
    second = rng.round_noise(seeds, torch.tensor([12]), 4, 16)
    assert not bool(torch.isin(first.uniforms, second.uniforms).any())
    for i, j in product(range(4), repeat=2):
        assert not torch.equal(first.draft[0, i], second.draft[0, j])
    assert not torch.equal(first.target, second.target)


def test_a_rows_numbers_do_not_depend_on_its_batch_or_k() -> None:
    """Row b's numbers are a function of its own seed and start: the same alone or third in a
    batch; a narrower round reads a prefix of a wider one's (the index within the round is the
    key, not the width)."""
    alone = rng.round_noise(torch.tensor([9]), torch.tensor([6]), 4, 16)
    batch = rng.round_noise(torch.tensor([1, 2, 9]), torch.tensor([3, 8, 6]), 4, 16)
    narrow = rng.round_noise(torch.tensor([9]), torch.tensor([6]), 2, 16)
    for name in ("draft", "uniforms", "target"):
        assert torch.equal(getattr(alone, name)[0], getattr(batch, name)[2]), name
    assert torch.equal(narrow.draft[0], alone.draft[0, :2])
    assert torch.equal(narrow.uniforms[0], alone.uniforms[0, :2])


def test_the_target_row_of_a_round_is_the_position_row() -> None:
    """Under every rule the round at s races its K = 0 token (or corrective/bonus) with E_s, the
    row keyed by (seed, s) alone that drafter_invariant uses at s: so K = 0 gives one output per
    seed whatever the rule."""
    seeds, start = torch.tensor([3, 4]), torch.tensor([7, 2])
    position = rng.position_noise(seeds, start, 3, 16)
    for method in ("standard", "block"):
        assert torch.equal(rng.round_noise(seeds, start, 2, 16, method).target, position[:, 0])
    invariant = rng.round_noise(seeds, start, 2, 16, "drafter_invariant")
    assert torch.equal(invariant.target, position)
    assert torch.equal(invariant.draft, position[:, :2])
    assert torch.equal(
        rng.round_noise(seeds, start, 0, 16, "drafter_invariant").target, position[:, 0]
    )


def test_the_hash_is_lowbias32_in_exact_integer_arithmetic() -> None:
    """mix32 on int64 tensors equals lowbias32 computed with Python's unbounded integers, at the
    edges of the 32-bit range and on random words: its one-multiply mul32 neither overflows nor
    drops a bit (a multiplier of 2**31 or more is used as c - 2**32)."""

    def reference(x: int) -> int:
        x ^= x >> 16
        x = (x * 0x7FEB352D) % 2**32
        x ^= x >> 15
        x = (x * 0x846CA68B) % 2**32
        return x ^ (x >> 16)

    words = [0, 1, 2**16 - 1, 2**16, 2**31 - 1, 2**31, 2**32 - 2, 2**32 - 1]
    words += torch.randint(0, 2**32, (1000,), generator=torch.Generator().manual_seed(0)).tolist()
    got = rng.mix32(torch.tensor(words, dtype=torch.int64)).tolist()
    assert got == [reference(x) for x in words]
    for c in (0x7FEB352D, 0x846CA68B, 0x9E3779B9, 2**31, 2**32 - 1):
        assert rng.mul32(torch.tensor(words), c).tolist() == [x * c % 2**32 for x in words]
