"""The sampler refuses values it would silently misread (with check_values, the default outside
the decode loop): NaN or +inf logits, draft_probs that are not distributions, uniforms outside
[0, 1), exponentials below 0 or NaN; one ValueError naming the argument. The loop, which made
those values itself, passes check_values=False and is not charged for the reads."""

from __future__ import annotations

import pytest
import torch

from sampling import rejection_sample, sample

B, K, V = 2, 2, 5


def arguments(**changes) -> dict:
    """A valid call, with `changes` applied."""
    q = torch.full((B, K, V), 1 / V)
    args = dict(
        target_logits=torch.zeros(B, K + 1, V),
        draft_token_ids=torch.ones(B, K, dtype=torch.int64),
        draft_probs=q,
        uniforms=torch.full((B, K), 0.5, dtype=torch.float64),
        exponentials=torch.ones(B, V),
        compiled=False,
    )
    return {**args, **changes}


def with_value(name: str, value: float, index=(1, 0, 3)) -> dict:
    tensor = arguments()[name].clone()
    tensor[index[: tensor.dim()]] = value
    return arguments(**{name: tensor})


def test_a_valid_call_passes() -> None:
    out = rejection_sample(**arguments())
    assert out.token_ids.shape == (B, K + 1)


@pytest.mark.parametrize(
    "name,value,message",
    [
        ("target_logits", float("nan"), "target_logits must not hold NaN"),
        ("target_logits", float("inf"), "target_logits must not hold NaN or \\+inf"),
        ("draft_probs", float("nan"), "draft_probs must be probabilities"),
        ("draft_probs", -0.1, "draft_probs must be probabilities"),
        ("draft_probs", 0.9, "draft_probs must sum to 1"),
        ("uniforms", 1.0, "uniforms must lie in \\[0, 1\\)"),
        ("uniforms", -0.5, "uniforms must lie in \\[0, 1\\)"),
        ("uniforms", float("nan"), "uniforms must lie in \\[0, 1\\)"),
        ("exponentials", -1.0, "exponentials must be >= 0"),
        ("exponentials", float("nan"), "exponentials must be >= 0"),
    ],
)
def test_bad_values_are_refused(name: str, value: float, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        rejection_sample(**with_value(name, value))
    # Without the checks (the decode loop's setting) the same call runs: the checks, not the
    # rule, refuse it.
    rejection_sample(**with_value(name, value), temperature=torch.ones(B), check_values=False)


def test_nan_logits_no_longer_give_token_0() -> None:
    """What the unchecked sampler makes of NaN logits: a race over NaN scores picks token 0."""
    logits = torch.full((B, K + 1, V), float("nan"))
    unchecked = rejection_sample(
        **arguments(target_logits=logits), temperature=torch.ones(B), check_values=False
    )
    assert bool((unchecked.token_ids[:, 0] == 0).all())
    with pytest.raises(ValueError, match="NaN"):
        rejection_sample(**arguments(target_logits=logits))


def test_edge_values_that_are_valid_pass() -> None:
    """-inf logits (a masked token), u = 0, E = 0 and E = inf are legitimate inputs."""
    for args in (
        with_value("target_logits", float("-inf")),
        with_value("uniforms", 0.0),
        with_value("exponentials", 0.0),
        with_value("exponentials", float("inf")),
    ):
        rejection_sample(**args)


def test_draft_probs_past_a_rows_last_draft_are_not_read() -> None:
    """Past num_draft_tokens anything may stand in draft_probs (as in the draft ids)."""
    q = arguments()["draft_probs"].clone()
    q[1, 1] = float("nan")
    lengths = torch.tensor([K, 1])
    rejection_sample(**arguments(draft_probs=q), num_draft_tokens=lengths)
    with pytest.raises(ValueError, match="draft_probs"):
        rejection_sample(**arguments(draft_probs=q))


def test_drafter_invariant_needs_a_noise_row_per_position() -> None:
    with pytest.raises(ValueError, match="exponentials must have shape \\[2, 3, 5\\]"):
        rejection_sample(**arguments(), method="drafter_invariant")
    noise = torch.ones(B, K + 1, V)
    noise[0, 2, 1] = -1.0
    with pytest.raises(ValueError, match="exponentials must be >= 0"):
        rejection_sample(**arguments(exponentials=noise), method="drafter_invariant")
    out = rejection_sample(
        **arguments(exponentials=noise.abs(), uniforms=None), method="drafter_invariant"
    )
    assert out.token_ids.shape == (B, K + 1)


@pytest.mark.parametrize("value", [float("nan"), float("inf")])
def test_sample_refuses_nan_and_inf_logits(value: float) -> None:
    logits = torch.zeros(B, V)
    logits[0, 2] = value
    with pytest.raises(ValueError, match="logits must not hold NaN or \\+inf"):
        sample(logits, compiled=False)
    with pytest.raises(ValueError, match="exponentials must be >= 0"):
        sample(torch.zeros(B, V), exponentials=-torch.ones(B, V), compiled=False)
