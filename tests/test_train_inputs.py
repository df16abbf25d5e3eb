"""`minispec train` on inputs it cannot train from (issue 54): a corpus too small to draw a
window from, the state of a run on another corpus, a folder holding the user's own model, a
device that is not there. Each is one line and exit code 2 before any work, and under
`--check-args` too, which `make train NPROC=N` runs before torchrun starts its processes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from test_train import synthetic_corpus

from minispec.commands import train
from minispec.commands.cli import main
from minispec.commands.corpus import is_held_out, load_corpus
from model.checkpoint import save_checkpoint
from model.folders import MARKER
from model.gpt import GPT, PRESETS

# 272 bytes: more than a window of the tiny preset (64 bytes, and the next one for the target)
SOURCE = b"def double(x):\n    return 2 * x\n\n\n" * 8


def names(held: bool, count: int) -> list[str]:
    """The first `count` file names m<i>.py that are held out (`held`) or trained on."""
    found = (f"m{i}.py" for i in range(10_000))
    return [n for n in found if is_held_out(n) == held][:count]


def a_corpus(root: Path) -> Path:
    """A corpus the tiny preset trains on, and hardly more: one file to train on, one held out."""
    root.mkdir()
    for name in names(False, 1) + names(True, 1):
        (root / name).write_bytes(SOURCE)
    return root


def train_line(
    tmp: Path, capsys: pytest.CaptureFixture, *flags: str, check_args: bool = True
) -> tuple[int, str]:
    """`minispec train --preset tiny` into tmp/out and tmp/state: its exit code and its stderr,
    which must be one line and no traceback whenever the code is 2."""
    argv = [
        "train",
        "--preset",
        "tiny",
        "--no-compile",
        "--out-dir",
        str(tmp / "out"),
        "--state-dir",
        str(tmp / "state"),
        *(["--check-args"] if check_args else []),
        *flags,
    ]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's verdict leaves through SystemExit
        code = exc.code
    err = capsys.readouterr().err
    if code == 2:
        assert "Traceback" not in err and len(err.splitlines()) == 1, err
        assert err.startswith("error: "), err
    return code, err


def corpus_too_early(root: Path | None = None) -> None:
    pytest.fail("the corpus was loaded before the arguments and folders were checked")


# ---- the corpus ---------------------------------------------------------------------------------


def empty(root: Path) -> None:
    pass


def only_text(root: Path) -> None:
    (root / "notes.txt").write_bytes(SOURCE)


def only_tests(root: Path) -> None:
    (root / "tests").mkdir()
    (root / "tests" / "a.py").write_bytes(SOURCE)
    (root / "test_b.py").write_bytes(SOURCE)


def symlink_loops(root: Path) -> None:
    (root / "loop").symlink_to(root)  # a folder that holds itself
    (root / "self.py").symlink_to("self.py")  # a .py that names itself: it cannot be read


def one_small_file(root: Path) -> None:
    (root / names(False, 1)[0]).write_bytes(b"x = 1\n\n\n")  # 8 bytes


def nothing_held_out(root: Path) -> None:
    for name in names(False, 3):
        (root / name).write_bytes(SOURCE)


FOLDERS = {
    empty: "no .py files",
    only_text: "no .py files",
    only_tests: "no .py files",
    symlink_loops: "no .py files",
    one_small_file: "too small: 10 training bytes, a window needs 66",
    nothing_held_out: "too small: 0 held-out bytes",
}


@pytest.mark.parametrize("check_args", [True, False], ids=["--check-args", "run"])
@pytest.mark.parametrize("fill", FOLDERS, ids=[f.__name__ for f in FOLDERS])
def test_a_corpus_too_small_to_train_on_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, fill, check_args: bool
) -> None:
    root = tmp_path / "corpus"
    root.mkdir()
    fill(root)
    code, err = train_line(tmp_path, capsys, "--corpus-root", str(root), check_args=check_args)
    assert code == 2, err
    assert f"--corpus-root {root}: {FOLDERS[fill]}" in err
    assert not (tmp_path / "out" / "target.safetensors").exists()


def test_a_small_corpus_passes_the_check(tmp_path: Path, capsys: pytest.CaptureFixture):
    root = a_corpus(tmp_path / "corpus")
    assert train_line(tmp_path, capsys, "--corpus-root", str(root)) == (0, "")


@pytest.mark.parametrize("root, problem", [("", "empty"), ("nowhere", "no such folder")])
def test_an_empty_or_missing_corpus_root_is_refused(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    root: str,
    problem: str,
) -> None:
    monkeypatch.chdir(a_corpus(tmp_path / "cwd"))  # '' would be this folder, which trains
    code, err = train_line(tmp_path, capsys, "--corpus-root", root)
    assert code == 2 and "--corpus-root" in err and problem in err, err


# ---- --resume -----------------------------------------------------------------------------------


def saved_state(state: Path, **meta: str) -> None:
    """A target's training state at step 10 of a tiny run with seed 1234, with `meta` on top."""
    meta = {"role": "target", "preset": "tiny", "seed": "1234", "step": "10", **meta}
    save_checkpoint(state / "target.state.safetensors", GPT(PRESETS["tiny"]["target"]), meta)


def test_check_args_refuses_to_resume_the_state_of_another_corpus(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = a_corpus(tmp_path / "corpus")
    flags = ["--only", "target", "--resume", "--corpus-root", str(root)]
    saved_state(tmp_path / "state", corpus_fingerprint="another corpus")
    code, err = train_line(tmp_path, capsys, *flags)
    assert code == 2 and "target.state.safetensors is from another run" in err, err
    assert "corpus another corpus" in err

    saved_state(tmp_path / "state", corpus_fingerprint=load_corpus(root).fingerprint)
    assert train_line(tmp_path, capsys, *flags) == (0, "")
    code, err = train_line(tmp_path, capsys, *flags, "--seed", "7")
    assert code == 2 and "is from another run" in err and "seed 1234" in err, err


def test_check_args_refuses_to_resume_a_finished_model(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    root = a_corpus(tmp_path / "corpus")
    save_checkpoint(tmp_path / "state" / "target.state.safetensors", GPT(PRESETS["tiny"]["target"]))
    flags = ["--only", "target", "--resume", "--corpus-root", str(root)]
    code, err = train_line(tmp_path, capsys, *flags)
    assert code == 2 and "is a finished model, not a training state" in err, err


# ---- the output folder --------------------------------------------------------------------------


@pytest.mark.parametrize("check_args", [True, False], ids=["--check-args", "run"])
def test_a_model_train_did_not_write_is_not_replaced_without_force(
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
    check_args: bool,
) -> None:
    monkeypatch.setattr(train, "load_corpus", corpus_too_early)
    mine = tmp_path / "out" / "target.safetensors"
    mine.parent.mkdir()
    mine.write_bytes(b"the user's own model")
    code, err = train_line(tmp_path, capsys, check_args=check_args)
    assert code == 2, err
    assert f"{mine} is not listed in {mine.parent / MARKER}" in err and "--force" in err, err
    assert mine.read_bytes() == b"the user's own model"
    saved_state(tmp_path / "state", corpus_fingerprint="any")  # --resume cannot take --force
    code, err = train_line(tmp_path, capsys, "--only", "target", "--resume")
    assert code == 2 and f"{mine} is not listed" in err and "move it away" in err, err
    (tmp_path / "state" / "target.state.safetensors").unlink()
    # --only draft reads the target and writes none; --force replaces it.
    assert train_line(tmp_path, capsys, "--only", "draft") == (0, "")
    assert train_line(tmp_path, capsys, "--force") == (0, "")


def test_what_train_wrote_it_may_replace(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run lists the files it writes in the folder's MARKER before it writes them, so a later
    run (a --resume above all, which cannot take --force) replaces them without asking."""
    monkeypatch.setattr(train, "load_corpus", lambda root=None: synthetic_corpus())
    monkeypatch.setattr(train, "train_one", lambda *args, **kwargs: None)
    monkeypatch.setattr(train, "load_checkpoint", lambda path: (GPT(PRESETS["tiny"]["target"]), {}))
    out = tmp_path / "out"
    out.mkdir()
    (out / "target.safetensors").write_bytes(b"the user's own model")
    assert train_line(tmp_path, capsys, "--force", check_args=False) == (0, "")
    assert MARKER in {p.name for p in out.iterdir()}
    assert train_line(tmp_path, capsys) == (0, "")


# ---- the device ---------------------------------------------------------------------------------


MPS_HERE = torch.backends.mps.is_available()


@pytest.mark.parametrize(
    "device, problem",
    [
        pytest.param("mps", "mps", marks=pytest.mark.skipif(MPS_HERE, reason="mps is here")),
        ("meta", "meta is not a device to train on"),
    ],
)
def test_a_device_that_cannot_train_is_one_line(
    tmp_path: Path, capsys: pytest.CaptureFixture, device: str, problem: str
) -> None:
    code, err = train_line(tmp_path, capsys, "--device", device)
    assert code == 2 and f"--device {device}: " in err and problem in err, err
