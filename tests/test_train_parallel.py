"""`minispec train-parallel`: a short run on a tiny pair writes a draft that records how it was
made; a run stopped midway resumes to the draft an uninterrupted run writes, bit for bit, and
refuses to resume under another setting; bad flags are one line before torch is imported."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_head import make_corpus, one_line

import minispec.commands.train_parallel as train_parallel
from minispec.commands.cli import main
from model.checkpoint import load_checkpoint, save_checkpoint
from model.gpt import GPT, PRESETS
from model.tokenizer import MASK_TOKEN_ID

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def flags(tmp_path: Path) -> list[str]:
    """A tiny target and draft, a corpus, and the flags of a 4-step run on them."""
    torch.manual_seed(0)
    for role in ("target", "draft"):
        save_checkpoint(tmp_path / f"{role}.safetensors", GPT(PRESETS["tiny"][role]))
    return [
        "--target", str(tmp_path / "target.safetensors"),
        "--draft", str(tmp_path / "draft.safetensors"),
        "--corpus-root", str(make_corpus(tmp_path / "corpus")),
        "--state-dir", str(tmp_path / "state"),
        "--out", str(tmp_path / "parallel.safetensors"),
        "--window", "32", "--anchors", "4", "--depth", "4", "--batch-size", "2",
        "--steps", "4", "--save-every", "2", "--eval-every", "2", "--threads", "1",
    ]  # fmt: skip


def run(argv: list[str]) -> int:
    try:
        return main(["train-parallel", *argv])
    except SystemExit as exc:  # argparse's verdict on a flag, already one line
        return exc.code


def out_path(argv: list[str]) -> Path:
    return Path(argv[argv.index("--out") + 1])


def test_a_run_stopped_midway_resumes_to_the_same_draft(
    flags: list[str], monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    assert run(flags) == 0
    whole = load_file(out_path(flags))
    _, meta = load_checkpoint(out_path(flags))
    assert meta["mask_token_id"] == str(MASK_TOKEN_ID) and meta["parallel_depth"] == "4"
    assert len(json.loads(meta["held_out_alpha_by_depth"])) == 4

    out_path(flags).unlink()
    state = flags[flags.index("--state-dir") + 1]
    rerun = [*flags[: flags.index("--state-dir")], "--state-dir", state + "2",
             *flags[flags.index("--state-dir") + 2 :]]  # fmt: skip
    steps, real_loss = [], train_parallel.loss

    def stop_after_two(*args):
        if len(steps) == 2:
            raise KeyboardInterrupt
        steps.append(1)
        return real_loss(*args)

    monkeypatch.setattr(train_parallel, "loss", stop_after_two)
    assert run(rerun) == 130  # Ctrl-C after the state of step 2 was saved
    monkeypatch.setattr(train_parallel, "loss", real_loss)
    capsys.readouterr()
    code = run([*rerun, "--resume", "--lr", "0.002"])  # another setting: refused
    one_line(code, capsys.readouterr().err, "lr 0.001", "0.002", "--state-dir")
    assert run([*rerun, "--resume"]) == 0
    resumed = load_file(out_path(flags))
    assert resumed.keys() == whole.keys()
    assert all(torch.equal(resumed[k], whole[k]) for k in whole)


def test_bad_flags_are_one_line_before_torch(flags: list[str]) -> None:
    """Each refused in a process that never imports torch."""
    draft = flags[flags.index("--draft") + 1]
    cases = [
        (["--anchors", "40", "--window", "32"], "--anchors 40"),
        (["--out", draft, "--draft", draft], "one of the inputs"),
        (["--depth", "1"], "--depth"),
        (["--out", ""], "--out"),
        (["--out", flags[flags.index("--target") + 1]], "not a parallel draft"),
    ]
    for extra, fragment in cases:
        code = (
            "import sys; from minispec.commands.train_parallel import main; "
            f"code = main({extra!r}); assert 'torch' not in sys.modules; sys.exit(code)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True
        )
        lines = done.stderr.splitlines()
        assert done.returncode == 2 and len(lines) == 1 and fragment in lines[0], done.stderr
