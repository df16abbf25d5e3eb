"""Counter-based randomness: every random number is a hash of (seed, a position, stream, index).

Why not torch.Generator? A generator's output depends on how many numbers were drawn before,
so a request's tokens would change with the batch it shares and with the order of rows. A hash of
the request's own seed and its own positions gives every request its own numbers, identical in
any batch, on CPU and GPU alike, and it is plain integer tensor ops that torch.compile fuses
into the round.

The rule: a round may use a random number only if no earlier round's kept outcome depended on
it. Otherwise the number is conditioned on what was kept, and the next round's drafts no longer
follow q, or its uniforms are no longer uniform.

- standard, block, naive: every number of a round is keyed by (seed, s, stream, index within
  the round), where s is the round's first new position (``round_noise``). Every round of a row
  emits at least one token, so a row's rounds start at strictly increasing s and no two rounds
  share a key. Which s and which K a round gets depends only on earlier rounds (their numbers,
  and host-measured times), so the round's own numbers are fresh whatever came before. Keying
  by the drafted token's position instead reuses numbers: a round that starts at s drafts
  s..s+K-1, and the next, starting at s+n+1, would draw the numbers of s+n+1..s+K-1 again.
  Token-wise verification survives that (what it keeps depends only on the numbers up to its
  first rejection), block verification does not (its tau is the LAST passing position, so every
  uniform after tau failed and every draft after tau entered the block's weights).
- drafter_invariant: the token at position t is the exponential race argmax_x p_t(x) / E_t(x)
  with E_t keyed by (seed, t) alone (``position_noise``), the very row a K = 0 round at t uses.
  Reuse across rounds is the point here, and safe: what is kept at t is a function of the prefix
  and E_t only (a draft is kept only when it equals that choice), so the output is the K = 0
  output, a function of the seed; drafts read E_t but decide nothing that is kept.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from sampling.rules import DEFAULT_METHOD, RULES

MASK32 = 0xFFFFFFFF
STREAM_DRAFT, STREAM_UNIFORM, STREAM_TARGET = 1, 2, 3


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x in int64, in one multiply (docs/startup.md says how)."""
    return (x * (c - 2**32 if c >= 2**31 else c)) & MASK32


def mix32(x: torch.Tensor) -> torch.Tensor:
    """A 32-bit avalanche hash (xorshift-multiply, constants from Wellons' 'lowbias32')."""
    x = x & MASK32
    x = x ^ (x >> 16)
    x = mul32(x, 0x7FEB352D)
    x = x ^ (x >> 15)
    x = mul32(x, 0x846CA68B)
    return x ^ (x >> 16)


def hash_key(seeds: torch.Tensor, positions: torch.Tensor, stream: int) -> torch.Tensor:
    """One 32-bit key per (seed, position) for a stream; seeds/positions broadcast."""
    return mix32(mix32(mix32(seeds) ^ positions) + stream * 0x9E3779B9)


def round_keys(seeds: torch.Tensor, start: torch.Tensor, stream: int, count: int) -> torch.Tensor:
    """Keys [B, count] for the numbers 0..count-1 of the round that starts at `start` [B]: the
    round's own key, hashed with each index (mix32 is a bijection, so the indexes never share)."""
    index = torch.arange(count, device=start.device)
    return mix32(hash_key(seeds, start, stream)[:, None] ^ index)


def uniform_float64(key: torch.Tensor) -> torch.Tensor:
    """U[0, 1) with 53 random bits, from two hashes of `key` (float64, as the acceptance test
    uses)."""
    a, b = mix32(key ^ 0x1234567), mix32(key ^ 0x7654321)
    # The top 27 bits of a and 26 of b make one 53-bit integer, then scaled into [0, 1).
    return ((a >> 5) * 2**26 + (b >> 6)).double() / 2.0**53


def exponential_float32(key: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [..., V]: -log of a uniform in (0, 1) made from 24 hash bits per vocabulary id.
    The log is taken in float64: in float32, uniforms within 2**-25 of 1 round to 1 and give 0."""
    index = torch.arange(vocab_size, device=key.device)
    bits = mix32(key[..., None] ^ mix32(index)) >> 8
    return (-torch.log((bits.double() + 0.5) / 2.0**24)).float()


def position_noise(seeds: torch.Tensor, start: torch.Tensor, count: int, vocab_size: int):
    """E_t [B, count, V] for t = start..start+count-1: the target's Exp(1) row at position t,
    keyed by (seed, t) alone. A K = 0 round at t races p_t with exactly this row."""
    positions = start[:, None] + torch.arange(count, device=start.device)
    return exponential_float32(hash_key(seeds[:, None], positions, STREAM_TARGET), vocab_size)


class RoundNoise(NamedTuple):
    """All the randomness one round reads."""

    draft: torch.Tensor  # [B, K, V] Exp(1): the proposer's races, one per drafted position
    uniforms: torch.Tensor | None  # [B, K] float64 acceptance draws; None: the rule reads none
    # [B, V] the corrective-or-bonus race (K = 0: the target's token); drafter_invariant with
    # K > 0: [B, K+1, V], the target's race at every position of the round
    target: torch.Tensor


def round_noise(
    seeds: torch.Tensor,
    start: torch.Tensor,
    num_speculative_tokens: int,
    vocab_size: int,
    method: str = DEFAULT_METHOD,
) -> RoundNoise:
    """All the randomness of one round for rows with `seeds` [B] whose first new token is at
    `start` [B], under the rejection rule named `method` (the module docstring says which keys
    and why)."""
    k = num_speculative_tokens
    if RULES[method].races_every_position:
        noise = position_noise(seeds, start, k + 1, vocab_size)
        return RoundNoise(noise[:, :k], None, noise if k else noise[:, 0])
    draft = exponential_float32(round_keys(seeds, start, STREAM_DRAFT, k), vocab_size)
    uniforms = uniform_float64(round_keys(seeds, start, STREAM_UNIFORM, k))
    # The one row of the round in the target's stream: keyed by s alone, it is also E_s, the row
    # a drafter_invariant or K = 0 round at s reads (so K = 0 is one output under every method).
    target = position_noise(seeds, start, 1, vocab_size)[:, 0]
    return RoundNoise(draft, uniforms, target)
