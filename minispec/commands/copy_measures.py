"""How well a target copies what its context already holds: the ceiling of the lookup proposers.

    python -m minispec copy-score [CHECKPOINT ...] [--json FILE]   # default: the shipped target

An n-gram or suffix lookup drafts a copy of earlier text; the target accepts it only as far as
the target itself would write the copy. Two teacher-forced measures (every position predicted
from the true bytes before it), each on held-out text never trained on:

1. Edit prompts (the bench's, minispec.commands.bench_proposers.edit_prompts): a function, a
   blank line, its first line again. Over the rest of the function written once more: the share
   of bytes the target's argmax gets right, and the bytes before its first miss (the length a
   greedy lookup draft of the copy survives, on average over prompts).
2. Copy rows (what `minispec train --copy-fraction` trains on): 48-239 bytes, a blank line, the
   same bytes again. Bits per byte on the first span (fresh text) and on the second (the copy).
   A model that copies pays a small fraction of a bit on the second; one that does not pays
   about what it pays on the first.
"""

from __future__ import annotations

import argparse
import json
import math
from collections.abc import Callable
from pathlib import Path

import torch
import torch.nn.functional as F

from minispec.api import DEFAULT_TARGET
from minispec.commands.args import OneLineParser, integer, writable_file
from minispec.commands.bench_proposers import edit_prompts
from minispec.commands.corpus import load_corpus
from minispec.commands.train import BLANK_LINE, COPY_SPAN, get_batch
from model import tokenizer
from model.checkpoint import atomic_write, load_checkpoint
from model.gpt import GPT

Model = Callable[[torch.Tensor], torch.Tensor]  # ids [B, T] -> next-token logits [B, T, V]
EDIT_PROMPTS = 12
EDIT_MAX_PROMPT = 376  # the bench's room for a prompt: 512 - 128 new tokens - the widest round
COPY_ROWS = 16
COPY_SEED = 777  # any seed; the rows are drawn from the held-out split, never trained on
MAX_ROWS = 256  # scored in one batch: 256 rows of 512 positions' logits are about 135 MB
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


def format_row(s: dict) -> str:
    e, c = s["edit"], s["copy_rows"]
    return (
        f"| {s['checkpoint']} | {e['accuracy']:.3f} | {e['bytes_before_first_miss']:.1f} | "
        f"{c['first_span_bits_per_byte']:.3f} | {c['copy_span_bits_per_byte']:.3f} |"
    )


HEADER = (
    "| checkpoint | edit prompts: accuracy | bytes before the first miss | "
    "copy rows: first span bits/byte | the copy: bits/byte |\n|---|---|---|---|---|"
)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="minispec copy-score",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("checkpoints", nargs="*", default=[str(DEFAULT_TARGET)])
    parser.add_argument(
        "--rows", type=integer(1, MAX_ROWS), default=COPY_ROWS, help="copy rows (at most 256)"
    )
    parser.add_argument("--json", type=writable_file, help="also write the scores here")
    args = parser.parse_args(argv)
    # Every checkpoint, before the corpus loads and before the table starts.
    models = [load_model(path) for path in args.checkpoints]
    prompts = edit_prompts(EDIT_PROMPTS, EDIT_MAX_PROMPT)
    data = load_corpus().held_out
    print(f"{len(prompts)} edit prompts, {args.rows} held-out copy rows\n\n{HEADER}", flush=True)
    scores = []
    for path, model in zip(args.checkpoints, models):
        scores.append(score(path, model, prompts, data, args.rows))
        print(format_row(scores[-1]), flush=True)
    if args.json:
        atomic_write(Path(args.json), (json.dumps(scores, indent=1) + "\n").encode())
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
