"""Randomness: the round's counter-based noise, the sampler's own draws, and the one way noise
becomes a token.

The sampler is a pure function of its inputs: the caller (the decode loop, a test) may inject
uniforms and exponential noise; only when it does not are they drawn here, from a
``torch.Generator``, outside any compiled graph.

``race`` is the single place where a full-vocabulary draw happens, shared by ``sample`` and the
rejection sampler's corrective-or-bonus draw. With E_v ~ Exp(1) independent, E_v / w_v is
exponential with rate w_v, so the smallest one - the largest w_v / E_v - wins with probability
w_v / sum(w). That samples from w without normalising it (the Gumbel-max trick in another form).

**The round's noise is counter-based**: every random number is a hash of (seed, a position,
stream, index) (``round_noise``).

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


def check_generator(generator: object, device: torch.device) -> None:
    """TypeError or ValueError naming the argument: torch's own for a wrong type lists every
    overload, and for a generator on another device is a RuntimeError or a bare assertion."""
    if generator is None:
        return
    if not isinstance(generator, torch.Generator):
        raise TypeError(
            f"generator must be a torch.Generator or None, got {type(generator).__name__}"
        )
    if generator.device.type != device.type:
        raise ValueError(
            f"generator is on {generator.device}, the logits on {device}: "
            f"use torch.Generator(device={str(device)!r}) or None"
        )


def draw_uniforms(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """U[0, 1) in float64, the acceptance draws u."""
    check_generator(generator, device)
    return torch.rand(shape, dtype=torch.float64, device=device, generator=generator)


def draw_exponentials(
    shape: tuple[int, ...], generator: torch.Generator | None, device: torch.device
) -> torch.Tensor:
    """Exp(1) noise in float32 for ``race``."""
    check_generator(generator, device)
    noise = torch.empty(shape, dtype=torch.float32, device=device)
    return noise.exponential_(generator=generator)


def _max_and_first_index(ordered: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The max of int32 ``ordered`` along the last dim and the FIRST index holding it, as ONE
    int64 max-reduction over keys with the value on top and the index, reversed, below
    (docs/algorithm.md says why not torch.argmax)."""
    vocab_size = ordered.shape[-1]
    reversed_index = vocab_size - 1 - torch.arange(vocab_size, device=ordered.device)
    best = ((ordered.long() << 32) | reversed_index).amax(dim=-1)
    return (best >> 32).int(), vocab_size - 1 - (best & 0xFFFFFFFF)


def max_and_argmax(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``torch.max(values, dim=-1)`` for float32 without NaN: the largest value and the first
    index that holds it (docs/algorithm.md says why it is not written that way)."""
    bits = values.view(torch.int32)
    # A float's bits are sign and magnitude, and magnitudes order like the floats they encode;
    # giving negative floats minus their magnitude yields integers in the floats' order, with
    # -0.0 and 0.0 equal, as they should be.
    magnitude = bits & 0x7FFFFFFF
    best, index = _max_and_first_index(torch.where(bits < 0, -magnitude, magnitude))
    best_bits = torch.where(best < 0, -best | -0x80000000, best)  # back to sign and magnitude
    return best_bits.view(torch.float32), index


def race(weights: torch.Tensor, exponentials: torch.Tensor) -> torch.Tensor:
    """Index along the last dim of argmax(w / E): a draw proportional to the weights w >= 0;
    index 0 if none is positive (docs/algorithm.md: the guards)."""
    # w * (1 / E) rather than w / E: two races over the same noise (corrective and fallback)
    # share one reciprocal per entry. The bits of a float >= 0 order like the float itself, and
    # -1 sits below all of them.
    scores = (weights * exponentials.reciprocal()).view(torch.int32)
    return _max_and_first_index(torch.where(weights > 0, scores, -1))[1]


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
