"""The two measures of `minispec copy-score` (copy_score.py says what each one shows): a
target's teacher-forced accuracy on edit prompts, and its bits per byte on copy rows.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minispec.commands.train import BLANK_LINE, COPY_SPAN, get_batch
from model import tokenizer
from model.checkpoint import load_checkpoint
from model.gpt import GPT

Model = Callable[[torch.Tensor], torch.Tensor]  # ids [B, T] -> next-token logits [B, T, V]
COPY_SEED = 777  # any seed; the rows are drawn from the held-out split, never trained on
# The longest copy row (two spans and the blank line) must fit in a row of the context and the
# one byte that its last position predicts. The edit prompts are shorter.
MIN_CONTEXT = 2 * (COPY_SPAN[1] - 1) + len(BLANK_LINE) - 1


def edit_copy(model: Model, prompts: list[str], context: int) -> dict:
    """Teacher-forced greedy accuracy of `model` on each prompt's function written again (the
    prompt's start cut where prompt and copy outgrow the model's `context`)."""
    hits = total = before_miss = 0
    for prompt in prompts:
        function = prompt[: prompt.rindex("\n\n")]
        body = tokenizer.encode(function[function.index("\n") + 1 :], bos=False)
        ids = torch.tensor([(tokenizer.encode(prompt) + body)[-(context + 1) :]])
        predicted = model(ids[:, :-1])[0, -len(body) :].argmax(-1)
        right = predicted == ids[0, -len(body) :]
        hits, total = hits + int(right.sum()), total + len(body)
        before_miss += int(right.int().cumprod(0).sum())
    return {
        "prompts": len(prompts),
        "bytes": total,
        "accuracy": hits / total,
        "bytes_before_first_miss": before_miss / len(prompts),
    }


def copy_span_length(row: torch.Tensor) -> int:
    """n such that the row starts with n bytes, a blank line and the same n bytes."""
    return next(
        n
        for n in range(*COPY_SPAN)
        if torch.equal(row[n : n + 2], BLANK_LINE) and torch.equal(row[:n], row[n + 2 : 2 * n + 2])
    )


def copy_rows_bits(model: Model, data: torch.Tensor, rows: int, seq_len: int) -> dict:
    """Bits per byte on the first span of held-out copy rows and on its copy."""
    x, y = get_batch(data, rows, seq_len, seed=COPY_SEED, step=0, copy_fraction=1.0)
    bits = F.cross_entropy(model(x).transpose(1, 2), y, reduction="none") / math.log(2)
    first, second = [], []
    for r in range(rows):
        n = copy_span_length(torch.cat([x[r], y[r, -1:]]))
        # Position i predicts byte i + 1. The first byte of each span is left out of both: no
        # model can know it (a fresh start; where a copy begins), so each counts n - 1 bytes.
        first.append(bits[r, : n - 1])
        second.append(bits[r, n + 2 : 2 * n + 1])
    return {
        "rows": rows,
        "first_span_bits_per_byte": float(torch.cat(first).mean()),
        "copy_span_bits_per_byte": float(torch.cat(second).mean()),
    }


def load_model(path: str) -> GPT:
    """The checkpoint's model, after checking that its context holds a whole copy row."""
    if not Path(path).exists():
        raise ValueError(f"checkpoint not found: {path}")
    model, _ = load_checkpoint(path)
    if model.config.max_seq_len < MIN_CONTEXT:
        raise ValueError(
            f"{path}: its context of {model.config.max_seq_len} tokens is too short to score: "
            f"a copy row needs {MIN_CONTEXT}"
        )
    return model.eval()


def score(path: str, model: GPT, prompts: list[str], data: torch.Tensor, rows: int) -> dict:
    with torch.no_grad():
        return {
            "checkpoint": path,
            "edit": edit_copy(model, prompts, model.config.max_seq_len),
            "copy_rows": copy_rows_bits(model, data, rows, model.config.max_seq_len),
        }
