"""Offline training of the draft/target pair: the target first, then a draft distilled from it.

    python -m minispec train --preset cpu            # the shipped shapes, ~100 min on one core
    python -m minispec train --device cuda --steps 3000 --batch-size 64 ...  # the shipped pair
    python -m minispec train --preset cpu --resume   # continue an interrupted run
    python -m minispec train --preset cpu --force    # start afresh over a saved state
    torchrun --standalone --nproc_per_node=N -m minispec train ...   # N processes (DDP)
    python -m minispec train --only target --init-from checkpoints/target.safetensors \\
        --copy-fraction 0.5 --steps 300 --lr 5e-4 --out-dir runs/copy  # fine-tune to copy

Under torchrun every rank draws the same global batch (a pure function of seed and step) and
trains on its own slice; DistributedDataParallel averages the gradients (gloo on CPU, nccl on
CUDA), so N processes take the steps one process would. Only rank 0 writes.

Periodic state (fp32 weights + AdamW moments + step) goes to runs/<preset>/<role>.state.safetensors,
progress to runs/<preset>/<role>.log.jsonl (and stdout); the finished models go to checkpoints/
(float16 for the cpu preset to fit the 30 MB budget) with a loss curve. Writes are atomic, so
Ctrl-C or a kill at any moment leaves the last state intact (a kill also leaves a temporary
file, which the next run removes), and `--resume` continues it with any number of processes.
A saved state is never overwritten silently: start over with `--force`. Nor is a file in
--out-dir that train did not write (a model of the user's): `--force` replaces it too.

The flags are parsed here, before torch is imported, so that a wrong flag is one line at once;
train.py does the training."""

from __future__ import annotations

import argparse
from pathlib import Path

from minispec.commands.args import OneLineParser, integer, real
from minispec.commands.schedules import SCHEDULES


def named_path(text: str) -> Path:
    """An argparse type: a path. An empty one would be the current folder, which no one means
    (an unset variable in a script, ARGS='--corpus-root $ROOT')."""
    if not text:
        raise argparse.ArgumentTypeError("an empty path; name a folder")
    return Path(text)


def parser() -> OneLineParser:
    parser = OneLineParser(
        prog="minispec train",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--preset", default="cpu", choices=sorted(SCHEDULES))
    parser.add_argument(
        "--out-dir", default="checkpoints", help="where the finished pair is written"
    )
    parser.add_argument(
        "--state-dir", default=None, help="periodic training state (default runs/<preset>)"
    )
    parser.add_argument("--seed", type=integer(0), default=1234)
    fresh_or_not = parser.add_mutually_exclusive_group()
    fresh_or_not.add_argument(
        "--resume", action="store_true", help="continue from the last saved state"
    )
    fresh_or_not.add_argument(
        "--force", action="store_true", help="start afresh over a saved state"
    )
    parser.add_argument("--only", choices=["target", "draft"], help="train one model of the pair")
    parser.add_argument(
        "--no-compile", dest="compile", action="store_false", help="train eagerly (debugging)"
    )
    parser.add_argument(
        "--fp32",
        action="store_true",
        help="no bf16 autocast even where bf16 is fast (runs with different process counts "
        "then agree to fp32 rounding)",
    )
    for flag, kind in (
        ("steps", integer(1)),
        ("batch-size", integer(1)),
        ("lr", real(positive=True)),
    ):
        parser.add_argument(
            f"--{flag}", type=kind, help="override the preset's schedule (learning-rate sweeps)"
        )
    parser.add_argument(
        "--copy-fraction",
        type=real(0.0, high=1.0),
        help="share of rows that repeat a span of their window, to teach in-context copying "
        "(default 0)",
    )
    parser.add_argument(
        "--init-from",
        type=Path,
        help="start the --only model from this checkpoint's weights (a fine-tune)",
    )
    parser.add_argument(
        "--device",
        default="cpu",
        help="where to train: cpu, or cuda (each torchrun process takes GPU LOCAL_RANK)",
    )
    parser.add_argument(
        "--corpus-root",
        type=named_path,
        help="read the corpus from this copy of a standard library instead of the running "
        "interpreter's (its fingerprint says whether it is the same corpus)",
    )
    parser.add_argument(
        "--check-args",
        action="store_true",
        help="check the arguments, folders, corpus and saved state, then stop (make train "
        "NPROC=N does this once before torchrun starts its processes)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    from minispec.commands import train  # torch, once the flags are known to be good

    return train.run(args, argv)
