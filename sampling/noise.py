"""Randomness for the sampler: the draws it consumes, and the one way it turns noise into a token.

The sampler is a pure function of its inputs: the caller (the decode loop, a test) may inject
uniforms and exponential noise; only when it does not are they drawn here, from a
``torch.Generator``, outside any compiled graph.

``race`` is the single place where a full-vocabulary draw happens, shared by ``sample`` and the
rejection sampler's corrective-or-bonus draw. With E_v ~ Exp(1) independent, E_v / w_v is
exponential with rate w_v, so the smallest one - the largest w_v / E_v - wins with probability
w_v / sum(w). That samples from w without normalising it (the Gumbel-max trick in another form).
"""

import torch


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
