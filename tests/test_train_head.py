"""`minispec train-head`: a short run on a tiny target writes a head that loads and drafts, an
interrupted run resumes from its saved step, and bad inputs are one-line refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from minispec.commands import train_head
from model.checkpoint import load_checkpoint, load_head, save_checkpoint
from model.gpt import GPT, PRESETS

CORPUS = "def f(x):\n    return x + 1\n\n\nclass A:\n    pass\n" * 40


@pytest.fixture
def setup(tmp_path: Path) -> tuple[Path, list[str]]:
    """A tiny target checkpoint and a corpus with training and held-out files."""
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(60):  # about 1 in 50 is held out (by a hash of its path)
        (corpus / f"m{i}.py").write_text(CORPUS)
    torch.manual_seed(0)
    target = GPT(PRESETS["tiny"]["target"])
    save_checkpoint(tmp_path / "target.safetensors", target)
    args = [
        "--target", str(tmp_path / "target.safetensors"),
        "--corpus-root", str(corpus),
        "--state-dir", str(tmp_path / "state"),
        "--out", str(tmp_path / "out" / "head.safetensors"),
        "--windows", "8", "--window", "64", "--batch-size", "2",
        "--width", "32", "--heads", "2", "--mlp-hidden", "64", "--eval-every", "2",
    ]  # fmt: skip
    (tmp_path / "out").mkdir()
    return tmp_path, args


def test_a_short_run_writes_a_head_that_loads_and_resumes(setup, capsys) -> None:
    tmp_path, args = setup
    assert train_head.main(args + ["--steps", "2"]) == 0
    # A longer run over the same state directory resumes at the saved step.
    assert train_head.main(args + ["--steps", "4"]) == 0
    assert "resumed at step 2" in capsys.readouterr().out
    target, _ = load_checkpoint(tmp_path / "target.safetensors")
    head, meta = load_head(tmp_path / "out" / "head.safetensors", target)
    assert meta["steps"] == "4" and len(json.loads(meta["held_out_alpha"])) == 3
    guess = head(target, torch.zeros(1, 1, 64), torch.tensor([[5]]), torch.tensor([[0]]))
    assert guess.shape == (1, 1, 64) and torch.isfinite(guess).all()


def test_refusals_are_one_line(setup, capsys) -> None:
    tmp_path, args = setup
    empty = tmp_path / "empty"
    empty.mkdir()
    (tmp_path / "out" / "head.safetensors").write_bytes(b"the user's own file")
    cases = {
        "no .py files": args + ["--corpus-root", str(empty)],
        "not a folder": args + ["--corpus-root", str(tmp_path / "missing")],
        "pass --force": args,
        "must be positive": args + ["--steps", "0"],
        "even heads": args + ["--heads", "3"],
    }
    for expected, argv in cases.items():
        assert train_head.main(argv) == 2, expected
        err = capsys.readouterr().err
        assert expected in err and err.count("\n") == 1, err
    assert (tmp_path / "out" / "head.safetensors").read_bytes() == b"the user's own file"
