"""How well a target copies what its context already holds: the ceiling of the lookup proposers.

    python -m minispec copy-score [CHECKPOINT ...] [--json FILE]   # default: the shipped target

An n-gram or suffix lookup drafts a copy of earlier text; the target accepts it only as far as
the target itself would write the copy. Two teacher-forced measures (every position predicted
from the true bytes before it), each on held-out text never trained on:

1. Edit prompts (the bench's, minispec.commands.prompts.edit_prompts): a function, a
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
from pathlib import Path

from minispec.commands.args import OneLineParser, integer, writable_file
from minispec.commands.corpus import load_corpus
from minispec.commands.prompts import edit_prompts

EDIT_PROMPTS = 12
EDIT_MAX_PROMPT = 376  # the bench's room for a prompt: 512 - 128 new tokens - the widest round
COPY_ROWS = 16
MAX_ROWS = 256  # scored in one batch: 256 rows of 512 positions' logits are about 135 MB


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
    parser.add_argument("checkpoints", nargs="*", help="default: the shipped target")
    parser.add_argument(
        "--rows", type=integer(1, MAX_ROWS), default=COPY_ROWS, help="copy rows (at most 256)"
    )
    parser.add_argument("--json", type=writable_file, help="also write the scores here")
    args = parser.parse_args(argv)
    from minispec.api import DEFAULT_TARGET  # deferred, as the two below: they import torch
    from minispec.commands.copy_measures import load_model, score
    from model.checkpoint import atomic_write

    args.checkpoints = args.checkpoints or [str(DEFAULT_TARGET)]

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
