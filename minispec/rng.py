"""Counter-based randomness: every random number is a hash of (seed, position, stream, index).

Why not torch.Generator? A generator's output depends on how many numbers were drawn before,
so a request's tokens would change with the batch it shares and with the order of rows. A hash of
the request's own seed and the absolute position of the token being decided gives every request
its own numbers, identical in any batch, on CPU and GPU alike, and it is plain integer tensor ops
that torch.compile fuses into the round.

Exactness needs each number used at most once per decision. Keys: the draft's noise and the
acceptance uniforms are keyed by the position of the drafted token; only positions past the
last accepted one are ever drafted again, and their old numbers influenced nothing that was kept.
The corrective/bonus noise row is keyed by the round's first position, which strictly increases.
"""

from __future__ import annotations

import torch

MASK32 = 0xFFFFFFFF
STREAM_DRAFT, STREAM_UNIFORM, STREAM_TARGET = 1, 2, 3


def mul32(x: torch.Tensor, c: int) -> torch.Tensor:
    """(x * c) mod 2**32 for 32-bit x in int64, without overflowing int64 (x * c may reach 2**64).

    Split x into 16-bit halves: each partial product stays below 2**48.
    """
    lo, hi = x & 0xFFFF, x >> 16
    return (lo * c + (((hi * c) & 0xFFFF) << 16)) & MASK32


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


def uniform_float64(key: torch.Tensor) -> torch.Tensor:
    """U[0, 1) with 53 random bits, from two hashes of `key` (float64, as the acceptance test
    uses)."""
    a, b = mix32(key ^ 0x1234567), mix32(key ^ 0x7654321)
    # The top 27 bits of a and 26 of b make one 53-bit integer, then scaled into [0, 1).
    return ((a >> 5) * 2**26 + (b >> 6)).double() / 2.0**53


def exponential_float32(key: torch.Tensor, vocab_size: int) -> torch.Tensor:
    """Exp(1) noise [..., V]: -log of a uniform in (0, 1) made from 24 hash bits per vocabulary id.

    The log is taken in float64: in float32, uniforms within 2**-25 of 1 round to 1 and give 0.
    """
    index = torch.arange(vocab_size, device=key.device)
    bits = mix32(key[..., None] ^ mix32(index)) >> 8
    return (-torch.log((bits.double() + 0.5) / 2.0**24)).float()


def round_noise(
    seeds: torch.Tensor, start: torch.Tensor, num_speculative_tokens: int, vocab_size: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """All the randomness of one round for rows with `seeds` [B] whose first new token is at
    `start` [B].

    Returns (draft exponentials [B, K, V], acceptance uniforms [B, K] float64, target
    exponentials [B, V]).
    """
    positions = start[:, None] + torch.arange(num_speculative_tokens, device=start.device)
    draft_noise = exponential_float32(hash_key(seeds[:, None], positions, STREAM_DRAFT), vocab_size)
    uniforms = uniform_float64(hash_key(seeds[:, None], positions, STREAM_UNIFORM))
    target_noise = exponential_float32(hash_key(seeds, start, STREAM_TARGET), vocab_size)
    return draft_noise, uniforms, target_noise
