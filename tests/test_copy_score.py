"""`minispec copy-score` measures the right bytes: made-up models that are right exactly where
the measure looks (and know nothing elsewhere) must score perfectly, so a span or prompt cut
off by one byte shows up."""

from __future__ import annotations

import math

import pytest
import torch

from minispec.commands import copy_measures as copy_score
from minispec.commands.train import get_batch
from model import tokenizer
from model.tokenizer import VOCAB_SIZE


def one_hot_logits(next_ids: torch.Tensor, where: torch.Tensor) -> torch.Tensor:
    """Logits [B, T, V]: sure of next_ids where `where` is set, uniform elsewhere."""
    logits = torch.zeros(*next_ids.shape, VOCAB_SIZE)
    logits.scatter_(2, next_ids.unsqueeze(-1), 100.0 * where.unsqueeze(-1).float())
    return logits


def test_copy_rows_charge_the_copy_and_the_fresh_span_apart() -> None:
    data = torch.randint(0, 256, (20_000,), generator=torch.Generator().manual_seed(0))
    rows, seq_len = 6, 600
    _, y = get_batch(data, rows, seq_len, seed=copy_score.COPY_SEED, step=0, copy_fraction=1.0)

    def copier(x: torch.Tensor) -> torch.Tensor:
        """Knows every byte of each copy but its first, and nothing else."""
        where = torch.zeros_like(x, dtype=torch.bool)
        for r in range(rows):
            n = copy_score.copy_span_length(torch.cat([x[r], y[r, -1:]]))
            where[r, n + 2 : 2 * n + 1] = True
        return one_hot_logits(y, where)

    got = copy_score.copy_rows_bits(copier, data, rows, seq_len)
    assert got["copy_span_bits_per_byte"] < 1e-3
    assert got["first_span_bits_per_byte"] == pytest.approx(math.log2(VOCAB_SIZE))


@pytest.mark.parametrize("context", [512, 30])  # 30: the prompt is cut, not the body
def test_edit_copy_counts_the_function_body_and_the_first_miss(context: int) -> None:
    prompt = "def f(x):\n    y = x + 1\n    return y\n\ndef f(x):\n"
    body = tokenizer.encode("    y = x + 1\n    return y", bos=False)
    miss = 7  # the body's 8th byte is predicted wrong

    def model(x: torch.Tensor) -> torch.Tensor:
        """Right at every position of the full sequence but the one that predicts body[miss]."""
        next_ids = torch.cat([x[:, 1:], torch.tensor([[body[-1]]])], dim=1)
        wrong = next_ids.clone()
        wrong[0, next_ids.shape[1] - len(body) + miss] = ord("#")
        return one_hot_logits(wrong, torch.ones_like(x, dtype=torch.bool))

    got = copy_score.edit_copy(model, [prompt, prompt], context)
    assert got["bytes"] == 2 * len(body)
    assert got["accuracy"] == pytest.approx(1 - 1 / len(body))
    assert got["bytes_before_first_miss"] == miss
