"""`minispec train-head` refuses, in one line with exit code 2 and before any state is computed:
a flag out of range, an --out that is an input or a model (whatever --force says), and cached
states or a train.pt made with other settings, or damaged. What needs no torch is refused before
torch is imported."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from _cli import ROOT
from test_train_head import flag, make_corpus, one_line, prepare, train_head

from model.checkpoint import save_checkpoint
from model.folders import list_written
from model.gpt import GPT, PRESETS


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, list[str]]:
    """A finished short run: its states, train.pt and head, which no refusal may change."""
    tmp = tmp_path_factory.mktemp("trained")
    args = prepare(tmp)
    assert train_head([*args, "--steps", "2"]) == 0
    (tmp / "empty").mkdir()
    make_corpus(tmp / "other corpus", "x = 1\n" * 400)
    torch.manual_seed(1)
    save_checkpoint(tmp / "other.safetensors", GPT(PRESETS["tiny"]["target"]))
    return tmp, [*args, "--steps", "2"]


def files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def refused(argv: list[str], capsys: pytest.CaptureFixture, *fragments: str) -> str:
    """The one line train-head refuses `argv` with; nothing on stdout."""
    code = train_head(argv)
    out, err = capsys.readouterr()
    assert out == "", out
    return one_line(code, err, *fragments)


# (flags, what the line says): flags that no run could use, each named
FLAGS = [
    (["--eval-every", "0"], "--eval-every: must be >= 1, got 0"),
    (["--eval-every", "-1"], "--eval-every: must be >= 1, got -1"),
    (["--threads", "-1"], "--threads: must be >= 1"),
    (["--mlp-hidden", "0"], "--mlp-hidden: must be >= 1"),
    (["--depth", "99"], "--depth: must be <= 16"),
    (["--seed", "-1"], "--seed: seed must be in [0, 2**32)"),
    (["--lr", "0"], "--lr: must be > 0"),
    (["--steps", "0"], "--steps: must be >= 1"),
    (["--window", "1"], "--window: must be >= 2"),
    (["--corpus-root", ""], "--corpus-root: an empty path"),
    (["--state-dir", ""], "--state-dir: expected a path, got ''"),
    (["--out", ""], "--out: expected a path, got ''"),
    (["--heads", "3"], "--width 32 must split into --heads 3 even heads"),
    (["--window", "1000"], "--window 1000 is longer than the target's context (128 tokens"),
    (["--windows", str(10**15), "--state-dir", "{tmp}/fresh"], "GB for the target's states in"),
    (["--corpus-root", "{tmp}/missing"], "missing: not a folder"),
    (["--corpus-root", "{tmp}/empty"], "no .py files"),
    (["--target", "{tmp}/out/head.safetensors"], "not a minispec model checkpoint"),
]


@pytest.mark.parametrize(
    "flags,says", FLAGS, ids=lambda v: " ".join(v) if isinstance(v, list) else ""
)
def test_a_flag_no_run_can_use_is_one_line(trained, capsys, flags: list[str], says: str) -> None:
    tmp, args = trained
    before = files(tmp)
    refused([*args, *(f.format(tmp=tmp) for f in flags)], capsys, says)
    assert files(tmp) == before


def test_an_out_that_is_the_target_is_refused_even_with_force(trained, capsys) -> None:
    tmp, args = trained
    target = tmp / "target.safetensors"
    refused([*args, "--out", str(target), "--force"], capsys, "is the --target")
    refused([*args, "--out", str(tmp / "out" / ".." / target.name)], capsys, "is the --target")


def test_an_out_that_is_a_model_is_refused_even_with_force(trained, capsys) -> None:
    """The draft beside the target, listed as minispec's in the folder's marker: a model, not a
    head, so train-head never replaces it."""
    tmp, args = trained
    draft = tmp / "out" / "draft.safetensors"
    save_checkpoint(draft, GPT(PRESETS["tiny"]["draft"]))
    list_written(draft.parent, [draft.name])
    before = draft.read_bytes()
    for extra in ([], ["--force"]):
        refused([*args, "--out", str(draft), *extra], capsys, "holds a model", "even with --force")
    assert draft.read_bytes() == before


def test_an_out_that_is_a_state_file_is_refused(trained, capsys) -> None:
    tmp, args = trained
    state = flag(args, "--state-dir")
    for name in ("states.f16", "train.pt"):
        refused([*args, "--out", str(state / name), "--force"], capsys, f"train-head's {name}")


def test_an_out_folder_says_so_without_suggesting_force(trained, capsys) -> None:
    tmp, args = trained
    line = refused([*args, "--out", str(tmp / "out")], capsys, "a folder, not a file")
    assert "--force" not in line


def test_an_empty_out_writes_nothing(trained, capsys, tmp_path, monkeypatch) -> None:
    _, args = trained
    monkeypatch.chdir(tmp_path)
    refused([*args, "--out", ""], capsys, "--out")
    assert list(tmp_path.iterdir()) == []


def test_a_users_file_at_out_needs_force(trained, capsys) -> None:
    tmp, args = trained
    theirs = tmp / "out" / "notes.safetensors"
    theirs.write_bytes(b"the user's own file")
    refused([*args, "--out", str(theirs)], capsys, "was not written by minispec: pass --force")
    assert theirs.read_bytes() == b"the user's own file"


# (flags, the setting named): runs whose cached states were made with other settings
OTHER_STATES = [
    (["--seed", "2"], "--seed: this run asks for 2, but the states in {state} were made with 1234"),
    (["--window", "32"], "--window: this run asks for 32, but"),
    (["--windows", "16"], "--windows: this run asks for 16, but"),
    (["--corpus-root", "{tmp}/other corpus"], "--corpus-root: this run asks for a corpus of"),
    (["--target", "{tmp}/other.safetensors"], "--target: this run asks for a target of tensor"),
]


@pytest.mark.parametrize(
    "flags,says", OTHER_STATES, ids=lambda v: v[0] if isinstance(v, list) else ""
)
def test_states_of_other_settings_are_refused(trained, capsys, flags: list[str], says: str) -> None:
    tmp, args = trained
    state, before = flag(args, "--state-dir"), files(tmp)
    argv = [*args, *(f.format(tmp=tmp) for f in flags)]
    refused(argv, capsys, says.format(state=state), "use a fresh --state-dir")
    assert files(tmp) == before


# (flags, the setting named): a train.pt trained with other settings, on the same states
OTHER_TRAINING = [
    (["--width", "64"], "--width: this run asks for 64, but {state}/train.pt was trained with 32"),
    (["--lr", "0.001"], "--lr: this run asks for 0.001, but"),
    (["--steps", "3"], "--steps: this run asks for 3, but"),
    (["--depth", "2"], "--depth: this run asks for 2, but"),
]


@pytest.mark.parametrize(
    "flags,says", OTHER_TRAINING, ids=lambda v: v[0] if isinstance(v, list) else ""
)
def test_a_training_state_of_other_settings_is_refused(trained, capsys, flags, says) -> None:
    tmp, args = trained
    state, before = flag(args, "--state-dir"), files(tmp)
    refused([*args, *flags], capsys, says.format(state=state), f"remove {state}/train.pt")
    assert files(tmp) == before


def zero_filled(path: Path) -> None:
    path.write_bytes(bytes(path.stat().st_size))


def cut_short(path: Path) -> None:
    path.write_bytes(path.read_bytes()[:1000])


# (the file, what is done to it, what the line says)
DAMAGED = [
    ("states.f16", cut_short, "is 1,000 bytes, but states.json records"),
    ("states.f16", zero_filled, "are not the bytes states.json records"),
    ("states.json", Path.unlink, "has no states.json"),
    ("states.json", lambda p: p.write_text("{"), "is not train-head's record"),
    ("train.pt", lambda p: p.write_bytes(b""), "train.pt does not load"),
    ("train.pt", lambda p: p.write_bytes(b"PK\x03\x04 garbage"), "train.pt does not load"),
    ("train.pt", lambda p: torch.save({"step": 2}, p), "train.pt records no settings"),
]


@pytest.mark.parametrize("name,damage,says", DAMAGED, ids=lambda v: getattr(v, "__name__", v))
def test_a_damaged_state_file_is_one_line(trained, capsys, tmp_path, name, damage, says) -> None:
    tmp, args = trained
    state = tmp_path / "state"
    shutil.copytree(flag(args, "--state-dir"), state)
    damage(state / name)
    before = files(state)
    refused([*args, "--state-dir", str(state)], capsys, says)
    assert files(state) == before


REPORT_TORCH = (
    "import sys\n"
    "from minispec.commands.cli import main\n"
    "try:\n"
    "    code = main(sys.argv[1:])\n"
    "except SystemExit as exc:\n"
    "    code = exc.code\n"
    "print('torch imported:', 'torch' in sys.modules, file=sys.stderr)\n"
    "raise SystemExit(code)\n"
)


@pytest.mark.parametrize(
    "flags",
    [
        ["--eval-every", "0"],
        ["--window", "1000"],
        ["--seed", "2"],
        ["--out", "{tmp}/target.safetensors"],
    ],
    ids=lambda flags: flags[0],
)
def test_refusals_come_before_torch_is_imported(trained, flags: list[str]) -> None:
    """A flag, the target's header, --out and the states' record are checked before torch's
    second of start-up (whether torch is in sys.modules when the line is printed says it)."""
    tmp, args = trained
    argv = ["train-head", *args, *(f.format(tmp=tmp) for f in flags)]
    child = subprocess.run(
        [sys.executable, "-c", REPORT_TORCH, *argv], cwd=ROOT, capture_output=True, text=True
    )
    *error, verdict = child.stderr.splitlines()
    one_line(child.returncode, "\n".join(error))
    assert verdict == "torch imported: False", child.stderr
