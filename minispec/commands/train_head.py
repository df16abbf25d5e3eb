"""`minispec train-head`: train a feature head (model/head.py) on the target's cached states.

Two phases, each resumable from --state-dir:
  states  the frozen target runs once over random windows of the corpus, in float32, and its
          final states are kept as float16 on disk (768 bytes a token at width 384), with a
          record of what made them (head_states.py);
  train   the head learns from those cached states, several passes, never running the target
          (head_training.py); its state, train.pt, records the settings it was trained with.
A run continues the states and the training state it finds only when they were made with the
settings it asks for; else one line names the setting that differs.

Every flag, the target's header, --out, the cached states and the corpus are checked here,
before torch is imported, so that a refusal is one line at once; the training state, which takes
torch to read, is checked before the first state is computed.
"""

from __future__ import annotations

import argparse
import json
from dataclasses import dataclass
from pathlib import Path

from minispec.commands.args import (
    OneLineParser,
    checkpoint_path,
    fail,
    in_range,
    integer,
    real,
    thread_count,
    writable_file,
    writable_folder,
)
from minispec.commands.corpus import corpus_root, documents, fingerprint, size_problem, split_sizes
from minispec.commands.head_states import LOG, RECORD, STATES, TRAINING_STATE, States
from minispec.commands.train_args import named_path
from minispec.rules import MAX_SPECULATIVE_TOKENS
from model.errors import CheckpointError
from model.folders import unlisted
from model.storage import FORMAT, HEAD_FORMAT, header_metadata

HELP = "train a feature-drafting head on the target's cached states"
SHIPPED_TARGET = Path(__file__).resolve().parents[2] / "checkpoints" / "target.safetensors"


def parser() -> OneLineParser:
    p = OneLineParser(prog="minispec train-head", description=HELP)
    p.add_argument(
        "--target",
        type=checkpoint_path(folder_ok=False),
        default=None,
        help="target checkpoint (default: the shipped one)",
    )
    p.add_argument(
        "--corpus-root",
        type=named_path,
        default=None,
        help="a folder of .py files (default: this Python's standard library)",
    )
    p.add_argument(
        "--state-dir",
        type=writable_folder,
        default="runs/head",
        help="cached states and training state",
    )
    p.add_argument("--out", type=writable_file, default="checkpoints/head.safetensors")
    p.add_argument("--windows", type=integer(1), default=5000, help="corpus windows of the states")
    p.add_argument("--window", type=integer(2), default=512, help="tokens a window")
    p.add_argument("--steps", type=integer(1), default=1400)
    p.add_argument("--batch-size", type=integer(1), default=16, help="windows a step")
    p.add_argument(
        "--depth",
        type=integer(1, MAX_SPECULATIVE_TOKENS),
        default=3,
        help="drafting steps trained per position",
    )
    p.add_argument("--lr", type=real(positive=True, high=1.0), default=2e-3)
    p.add_argument("--width", type=integer(1), default=256, help="the head's layer width")
    p.add_argument("--mlp-hidden", type=integer(1), default=704)
    p.add_argument("--heads", type=integer(1), default=4)
    p.add_argument("--seed", type=in_range("seed", integer()), default=1234)
    p.add_argument("--eval-every", type=integer(1), default=100, help="steps between saves")
    p.add_argument("--threads", type=thread_count, default=None)
    p.add_argument("--force", action="store_true", help="replace an --out minispec did not write")
    return p


@dataclass(frozen=True)
class Target:
    """What the target checkpoint's header says: enough to check every flag against it."""

    path: Path
    sha256: str  # of its tensors, which loading it verifies
    width: int
    context: int


def read_target(path: Path) -> Target:
    """The target's header, or ValueError: a file that is not a minispec model (a head, another
    program's safetensors) is refused here, not after torch's start-up."""
    meta = header_metadata(path)
    if meta.get("format") != FORMAT:
        raise ValueError(
            f"--target {path} is not a minispec model checkpoint (format "
            f"{meta.get('format')!r}, expected {FORMAT!r})"
        )
    try:
        config = json.loads(meta["config"])
        return Target(path, str(meta["sha256"]), int(config["d_model"]), int(config["max_seq_len"]))
    except (KeyError, TypeError, ValueError, RecursionError):
        raise CheckpointError(f"{path}: incomplete or unreadable metadata") from None


def check_shapes(args: argparse.Namespace, target: Target) -> None:
    if args.width % args.heads or (args.width // args.heads) % 2:
        raise ValueError(f"--width {args.width} must split into --heads {args.heads} even heads")
    if args.window > target.context:
        raise ValueError(
            f"--window {args.window} is longer than the target's context ({target.context} "
            f"tokens, {target.path})"
        )


def same_file(a: Path, b: Path) -> bool:
    return a.exists() and b.exists() and a.samefile(b)


def check_out(args: argparse.Namespace, target: Target) -> None:
    """--out never replaces an input or a model, whatever --force says; a file minispec did not
    write, only with --force."""
    out = Path(args.out)
    if same_file(out, target.path):
        raise ValueError(f"--out {out} is the --target: write the head to another file")
    state_dir = Path(args.state_dir)
    for name in (STATES, RECORD, TRAINING_STATE, LOG):
        if same_file(out, state_dir / name):
            raise ValueError(f"--out {out} is train-head's {name} in --state-dir: choose another")
    try:
        kind = header_metadata(out).get("format") if out.is_file() else None
    except CheckpointError:
        kind = None  # not a checkpoint: a file of the user's, which --force may replace
    if kind is not None and kind != HEAD_FORMAT:
        raise ValueError(
            f"--out {out} holds a model (format {kind!r}), not a feature head: train-head never "
            f"replaces it, even with --force; choose another --out"
        )
    if not args.force and unlisted(out.parent, [out.name]):
        raise ValueError(f"--out {out} was not written by minispec: pass --force to replace it")


def check_corpus(args: argparse.Namespace) -> Path:
    """The corpus's folder, once it is known to hold windows of --window for training and a
    held-out one."""
    if args.corpus_root is not None and not args.corpus_root.is_dir():
        raise ValueError(f"--corpus-root {args.corpus_root}: not a folder")
    root = corpus_root(args.corpus_root)
    if problem := size_problem(*split_sizes(root), args.window):
        raise ValueError(f"the corpus in {root}: {problem}")
    return root


def check(args: argparse.Namespace) -> tuple[Target, States]:
    """Every check that needs no torch, cheapest first (the corpus is read last); ValueError
    naming the flag."""
    target = read_target(Path(args.target or SHIPPED_TARGET))
    check_shapes(args, target)
    check_out(args, target)
    settings = {
        "target_sha256": target.sha256,
        "seed": args.seed,
        "window": args.window,
        "windows": args.windows,
    }
    states = States(Path(args.state_dir), settings, (args.windows, args.window, target.width))
    states.check()
    root = check_corpus(args)
    states.check_corpus(root, fingerprint(documents(root)))
    return target, states


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        target, states = check(args)
    except ValueError as exc:
        return fail(f"minispec train-head: {exc}")
    from minispec.commands import head_training  # torch, once every flag is known to be good

    return head_training.run(args, target.path, states, argv)
