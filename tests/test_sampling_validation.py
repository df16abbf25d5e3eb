"""Bad arguments raise ValueError naming the argument, before anything is compiled or run."""

import pytest
import torch

from sampling import rejection_sample, sample

B, K, V = 2, 3, 11


def _args(**overrides):
    args = dict(
        target_logits=torch.randn(B, K + 1, V),
        draft_token_ids=torch.randint(0, V, (B, K)),
        draft_probs=torch.softmax(torch.randn(B, K, V), -1),
    )
    args.update(overrides)
    return args


@pytest.mark.parametrize(
    "overrides, name",
    [
        (dict(target_logits=torch.randn(B, K, V)), "target_logits"),  # not K + 1 rows
        (dict(target_logits=torch.randn(B + 1, K + 1, V)), "target_logits"),  # batch differs
        (dict(target_logits=torch.randn(B, V)), "target_logits"),  # not 3-d
        (dict(target_logits=torch.zeros(B, K + 1, V, dtype=torch.int64)), "target_logits"),
        (dict(draft_token_ids=torch.full((B, K), V)), "draft_token_ids"),  # id == V
        (dict(draft_token_ids=torch.full((B, K), -1)), "draft_token_ids"),  # id < 0
        (dict(draft_token_ids=torch.zeros(B, K, dtype=torch.int32)), "draft_token_ids"),
        (
            dict(
                draft_token_ids=torch.zeros(B, 0, dtype=torch.int64),
                target_logits=torch.randn(B, 1, V),
                draft_probs=None,
            ),
            "draft_token_ids",
        ),  # K = 0
        (dict(draft_probs=torch.rand(B, K, V + 1)), "draft_probs"),
        (dict(draft_probs=torch.rand(B, K + 1, V)), "draft_probs"),
        (dict(temperature=-0.5), "temperature"),
        (dict(temperature=torch.tensor([1.0, -1.0])), "temperature"),
        (dict(temperature=torch.ones(B + 1)), "temperature"),
        (dict(top_k=-1), "top_k"),
        (dict(top_k=torch.tensor([3, -2])), "top_k"),
        (dict(top_k=2.5), "top_k"),
        (dict(top_p=0.0), "top_p"),
        (dict(top_p=1.5), "top_p"),
        (dict(top_p=torch.tensor([0.5, 0.0])), "top_p"),
        (dict(uniforms=torch.rand(B, K + 1, dtype=torch.float64)), "uniforms"),
        (dict(exponentials=torch.rand(B, V - 1)), "exponentials"),
        (dict(method="greedy"), "method"),
        (dict(num_draft_tokens=torch.tensor([K, K + 1])), "num_draft_tokens"),
        (dict(num_draft_tokens=torch.tensor([-1, 0])), "num_draft_tokens"),
        (dict(num_draft_tokens=torch.tensor([1.0, 2.0])), "num_draft_tokens"),
        (dict(num_draft_tokens=torch.tensor([K])), "num_draft_tokens"),
        (dict(num_draft_tokens=[K, K]), "num_draft_tokens"),
        (
            dict(
                num_draft_tokens=torch.tensor([1, K]),
                draft_token_ids=torch.tensor([[0, -1, -1], [0, 0, -1]]),
            ),
            "draft_token_ids",
        ),
    ],
)
def test_rejection_sample_rejects_bad_arguments(overrides, name):
    with pytest.raises(ValueError, match=name):
        rejection_sample(**_args(**overrides))


@pytest.mark.parametrize(
    "kwargs, name",
    [
        (dict(logits=torch.randn(B, 1, V)), "logits"),
        (dict(logits=torch.randn(B, V), temperature=-1.0), "temperature"),
        (dict(logits=torch.randn(B, V), top_p=2.0), "top_p"),
        (dict(logits=torch.randn(B, V), exponentials=torch.rand(B + 1, V)), "exponentials"),
    ],
)
def test_sample_rejects_bad_arguments(kwargs, name):
    with pytest.raises(ValueError, match=name):
        sample(kwargs.pop("logits"), **kwargs)


def test_valid_arguments_pass_validation_without_compiling():
    out = rejection_sample(**_args(), compiled=False, generator=torch.Generator().manual_seed(0))
    assert out.token_ids.shape == (B, K + 1) and out.num_accepted.shape == (B,)


def test_ids_past_a_rows_last_draft_are_not_checked():
    """The placeholder (or any id) may stand past num_draft_tokens."""
    args = _args(draft_token_ids=torch.tensor([[0, -1, -1], [0, 0, V + 5]]))
    out = rejection_sample(
        **args,
        num_draft_tokens=torch.tensor([1, 2]),
        method="block",
        compiled=False,
        generator=torch.Generator().manual_seed(0),
    )
    assert (out.num_accepted <= torch.tensor([1, 2])).all()
