"""`minispec train-head`: a short run on a tiny target writes a head that loads and drafts; a run
stopped by a full disk (while writing its states, train.pt or the head) is one line naming the
file, leaves no temporary file, and once space is freed resumes to the head an uninterrupted run
writes. The refusals: tests/test_train_head_refusals.py."""

from __future__ import annotations

import errno
import json
import os
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from minispec.commands.cli import main
from model.checkpoint import load_checkpoint, load_head, save_checkpoint
from model.gpt import GPT, PRESETS

CORPUS = "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n" * 40


def make_corpus(folder: Path, text: str = CORPUS) -> Path:
    """A corpus with training and held-out files (about 1 in 50 is held out, by a hash of its
    path)."""
    folder.mkdir()
    for i in range(60):
        (folder / f"m{i}.py").write_text(text)
    return folder


def prepare(tmp_path: Path) -> list[str]:
    """A tiny target checkpoint and a corpus in `tmp_path`, and the flags of a short run on
    them."""
    corpus = make_corpus(tmp_path / "corpus")
    torch.manual_seed(0)
    save_checkpoint(tmp_path / "target.safetensors", GPT(PRESETS["tiny"]["target"]))
    (tmp_path / "out").mkdir()
    return [
        "--target", str(tmp_path / "target.safetensors"),
        "--corpus-root", str(corpus),
        "--state-dir", str(tmp_path / "state"),
        "--out", str(tmp_path / "out" / "head.safetensors"),
        "--windows", "12", "--window", "64", "--batch-size", "2", "--steps", "4",
        "--width", "32", "--heads", "2", "--mlp-hidden", "64", "--eval-every", "2",
        "--threads", "1",
    ]  # fmt: skip


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, list[str]]:
    return tmp_path, prepare(tmp_path)


def train_head(argv: list[str]) -> int:
    """`minispec train-head ARGV` behind the front door: its exit code."""
    try:
        return main(["train-head", *argv])
    except SystemExit as exc:  # argparse's verdict on a flag, already one line
        return exc.code


def flag(args: list[str], name: str) -> Path:
    return Path(args[args.index(name) + 1])


def one_line(code: int, err: str, *fragments: str) -> str:
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert all(f in lines[0] for f in fragments), err
    return lines[0]


def test_a_short_run_writes_a_head_that_loads(setup, capsys) -> None:
    tmp_path, args = setup
    assert train_head(args) == 0
    target, _ = load_checkpoint(tmp_path / "target.safetensors")
    head, meta = load_head(tmp_path / "out" / "head.safetensors", target)
    assert meta["steps"] == "4" and len(json.loads(meta["held_out_alpha"])) == 3
    head.setup_cache(1)
    guess = head(target, torch.zeros(1, 1, 64), torch.tensor([[5]]), torch.tensor([[0]]))
    assert guess.shape == (1, 1, 64) and torch.isfinite(guess).all()
    # The same command again finds everything done: it resumes at the last step.
    assert train_head(args) == 0
    assert "resumed at step 4" in capsys.readouterr().out


def full_disk(*args, **kwargs):
    raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))


def fails_once(real, when):
    """`real`, but the call for which `when(*args)` holds fails as a full disk does."""

    def call(*args, **kwargs):
        if when(*args):
            full_disk()
        return real(*args, **kwargs)

    return call


def test_a_full_disk_while_allocating_the_states_is_one_line(setup, capsys, monkeypatch) -> None:
    """The states file is allocated whole before the first state is computed: no room is one
    line naming it, at once, and the run completes once there is room."""
    tmp_path, args = setup
    monkeypatch.setattr(os, "posix_fallocate", full_disk, raising=False)
    one_line(train_head(args), capsys.readouterr().err, "states.f16", "No space left on device")
    monkeypatch.undo()
    assert train_head(args) == 0


def test_a_full_disk_while_writing_states_resumes_to_the_same_head(
    setup, capsys, monkeypatch
) -> None:
    """A write the disk refuses is one line naming the states file (never SIGBUS: the file is
    not written through a memory map); the next run computes only the chunks missing, and
    the states and head are those of a run that never stopped."""
    tmp_path, args = setup
    second_chunk = fails_once(os.pwrite, lambda fd, data, offset: offset > 0)
    monkeypatch.setattr(os, "pwrite", second_chunk)
    one_line(train_head(args), capsys.readouterr().err, "states.f16", "No space left on device")
    monkeypatch.undo()
    assert train_head(args) == 0
    assert capsys.readouterr().out.startswith("states 12/12 windows")  # the first chunk kept
    whole = [*args, "--state-dir", str(tmp_path / "whole"), "--out", str(tmp_path / "whole.st")]
    assert train_head(whole) == 0
    for name in ("states.f16", "train.pt"):
        assert (tmp_path / "state" / name).read_bytes() == (tmp_path / "whole" / name).read_bytes()


# (the file, which of its writes finds the disk full, the step the next run resumes at)
FULL_WHILE_TRAINING = [("train.pt", 2, 2), ("head.log.jsonl", 2, 2), ("head.safetensors", 1, 4)]


@pytest.mark.parametrize("file,nth,resumed", FULL_WHILE_TRAINING)
def test_a_full_disk_while_training_is_one_line_and_resumes(
    setup, capsys, monkeypatch, file: str, nth: int, resumed: int
) -> None:
    """A save of train.pt (every --eval-every steps), a log line or the head fails for want of
    space: one line naming that file, no temporary file left; the next run resumes from the
    last train.pt and writes the head an uninterrupted run writes."""
    tmp_path, args = setup
    state, out = flag(args, "--state-dir"), flag(args, "--out")
    opened = []

    def nth_write(path, *rest) -> bool:  # atomic writes open a temporary named after the file
        opened.append(file in Path(path).name)
        return opened[-1] and opened.count(True) == nth

    monkeypatch.setattr("builtins.open", fails_once(open, nth_write))
    named = out if file == "head.safetensors" else state / file
    one_line(train_head(args), capsys.readouterr().err, f"{named}: No space left on device")
    monkeypatch.undo()
    assert not [p.name for p in [*state.iterdir(), *out.parent.iterdir()] if ".tmp" in p.name]
    assert train_head(args) == 0
    assert f"resumed at step {resumed}" in capsys.readouterr().out
    whole = [*args, "--state-dir", str(tmp_path / "whole"), "--out", str(tmp_path / "whole.st")]
    assert train_head(whole) == 0
    assert head_bytes(out) == head_bytes(tmp_path / "whole.st")


def head_bytes(path: Path) -> dict[str, bytes]:
    """A head file's tensors, without its metadata (which holds the command that wrote it)."""
    return {name: t.numpy().tobytes() for name, t in load_file(path).items()}
