"""The front door of every command (issue 13): one line for each expected failure, exit 130 on
Ctrl-C whenever it comes, quiet on a closed pipe, JSON that is JSON, NO_COLOR, the UTF-8 tail.

The table runs in-process through `main` (no interpreter start-up: torch is already imported).
A few cases run as real processes, started together so that their torch imports overlap:
signals, pipes and closed streams only show there.
"""

from __future__ import annotations

import contextlib
import fcntl
import io
import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from _cli import start_minispec
from _enumerate import random_gpt

from minispec.commands import copy_score, train, train_args
from minispec.commands.cli import Streamer, json_safe, main, use_colour
from model.checkpoint import save_checkpoint
from model.tokenizer import VOCAB_SIZE

ROOT = Path(__file__).resolve().parent.parent
HUGE = "99999999999999999999"  # past int64: torch would overflow on it


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> list[str]:
    """Decode flags for a tiny random pair with room for 400 new tokens (a few seconds eager)."""
    d = tmp_path_factory.mktemp("pair")
    for role, seed in (("target", 0), ("draft", 1)):
        model = random_gpt(VOCAB_SIZE, seed=seed, max_seq_len=512)
        save_checkpoint(d / f"{role}.safetensors", model)
    return [
        "--no-compile",
        "--target",
        str(d / "target.safetensors"),
        "--draft",
        str(d / "draft.safetensors"),
    ]


@pytest.fixture(scope="module")
def a_file(tmp_path_factory: pytest.TempPathFactory) -> str:
    path = tmp_path_factory.mktemp("plain") / "a_file"
    path.write_text("not a folder")
    return str(path)


# command x bad arguments -> a fragment the one line must contain (the flag, or the problem).
# {file} is a plain file: a folder "under" it cannot be made.
BAD_ARGUMENTS = [
    (["decode", "--threads", HUGE], "--threads"),
    (["decode", "--threads", "0"], "--threads"),
    (["decode", "--top-k", HUGE], "--top-k"),
    (["decode", "--seed", HUGE], "--seed"),
    (["decode", "-k", HUGE], "--num-speculative-tokens"),
    (["decode", "--max-new-tokens", "many"], "--max-new-tokens"),
    (["decode", "--temperature", "nan"], "--temperature"),
    (["decode", "--top-p", "inf"], "--top-p"),
    (["decode", "--device", "abacus"], "--device"),
    (["decode", "--json", "--bogus"], "--bogus"),
    (["decode", "-k", "automatic"], "expected auto or an integer"),
    (["train", "--steps", "x"], "--steps"),
    (["train", "--steps", "0"], "--steps"),
    (["train", "--batch-size", HUGE], "--batch-size"),
    (["train", "--lr", "-1"], "--lr"),
    (["train", "--lr", "nan"], "--lr"),
    (["train", "--seed", "-3"], "--seed"),
    (["train", "--only", "both"], "--only"),
    (["train", "--preset", "huge"], "--preset"),
    (["train", "--resume", "--force"], "--force"),
    (["train", "--out-dir", "{file}/out"], "--out-dir"),
    (["train", "--state-dir", "{file}/state"], "--state-dir"),
    (["train", "--only", "draft", "--out-dir", "{empty}"], "train it first"),
    (["bench", "--ks", "x"], "--ks"),
    (["bench", "--ks", "1,,2"], "--ks"),
    (["bench", "--temperatures", "0,-1"], "--temperatures"),
    (["bench", "--batch-sizes", "0"], "--batch-sizes"),
    (["bench", "--repeats", "0"], "--repeats"),
    (["bench", "--skip", "everything"], "--skip"),
    (["bench", "--threads", HUGE], "--threads"),
    (["bench", "--device", "cuda:7"], "--device"),
    (["bench", "--proposers", "oracle"], "--proposers"),
    (["bench-sampler", "--threads", "2,zero"], "--threads"),
    (["bench-sampler", "--repeats", "-1"], "--repeats"),
    (["bench-sampler", "--device", "foo"], "--device"),
    (["verify", "--draws", "-5"], "--draws"),
    (["verify", "--draws", HUGE], "--draws"),
    (["verify", "--rounds", "0"], "--rounds"),
    (["verify", "--seed", "x"], "--seed"),
    (["kernels", "--device", "foo"], "--device"),
    (["kernels", "--out"], "--out"),
    (["export"], "out_dir"),
    (["export", "{empty}", "--dtype", "int8"], "--dtype"),
    (["copy-score", "--rows", "0"], "--rows"),
    (["copy-score", "{empty}/missing.safetensors"], "missing.safetensors"),
    (["samples", "--n", "0"], "--n"),
    (["samples", "--max-new-tokens", HUGE], "--max-new-tokens"),
    (["speculate"], "unknown command"),
]


def corpus_too_early():
    pytest.fail("the corpus was loaded before the arguments and folders were checked")


def assert_one_error_line(code: int | str | None, stderr: str, fragment: str = "") -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert fragment in lines[0], stderr


@pytest.mark.parametrize(
    "argv, fragment", BAD_ARGUMENTS, ids=[" ".join(a) for a, _ in BAD_ARGUMENTS]
)
def test_every_command_gives_one_line_for_bad_arguments(
    argv: list[str],
    fragment: str,
    a_file: str,
    tmp_path: Path,
    capsys: pytest.CaptureFixture,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # a command past its checks would write here, not in the repo
    monkeypatch.setattr(train, "load_corpus", corpus_too_early)
    monkeypatch.setattr(copy_score, "load_corpus", corpus_too_early)
    argv = [a.format(file=a_file, empty=tmp_path) for a in argv]
    try:
        code = main(argv)
    except SystemExit as exc:  # argparse's verdict leaves through SystemExit
        code = exc.code
    out, err = capsys.readouterr()
    assert_one_error_line(code, err, fragment)
    assert out == ""


def test_train_refuses_to_overwrite_a_state_without_resume_or_force(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    state = tmp_path / "state"
    state.mkdir()
    (state / "draft.state.safetensors").write_bytes(b"an earlier run")
    monkeypatch.setattr(train, "load_corpus", corpus_too_early)
    monkeypatch.setattr(copy_score, "load_corpus", corpus_too_early)
    code = main(["train", "--out-dir", str(tmp_path / "out"), "--state-dir", str(state)])
    assert_one_error_line(code, capsys.readouterr().err, "draft.state.safetensors holds an earlier")
    assert (state / "draft.state.safetensors").read_bytes() == b"an earlier run"


def test_train_removes_temporaries_of_killed_saves_before_it_starts(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = tmp_path / f".target.state.safetensors.tmp-{dead.pid}"
    stale.write_bytes(b"half a save")

    class Stop(Exception):
        pass

    monkeypatch.setattr(train, "load_corpus", lambda root=None: (_ for _ in ()).throw(Stop()))
    with pytest.raises(Stop):  # called directly: no front door turns it into a line
        train_args.main(["--out-dir", str(tmp_path), "--state-dir", str(tmp_path)])
    assert not stale.exists()
    assert f"removed {stale}" in capsys.readouterr().out


def test_a_finished_checkpoint_is_not_a_training_state(
    tmp_path: Path, capsys: pytest.CaptureFixture, monkeypatch: pytest.MonkeyPatch
) -> None:
    from test_train import synthetic_corpus

    state = tmp_path / "state"
    save_checkpoint(
        state / "target.state.safetensors",
        random_gpt(VOCAB_SIZE, seed=0, max_seq_len=64),
        {"seed": "1234"},
    )
    monkeypatch.setattr(train, "load_corpus", lambda root=None: synthetic_corpus())
    code = main(
        [
            "train",
            "--preset",
            "tiny",
            "--only",
            "target",
            "--resume",
            "--no-compile",
            "--out-dir",
            str(tmp_path / "out"),
            "--state-dir",
            str(state),
        ]
    )
    assert_one_error_line(
        code, capsys.readouterr().err, "is a finished model, not a training state"
    )


# ---- output -------------------------------------------------------------------------------------


def test_json_safe_turns_missing_figures_into_null() -> None:
    report = {"alpha": math.nan, "speedup": math.inf, "c": None, "rows": [1.5, -math.inf, {"x": 2}]}
    safe = json_safe(report)
    assert safe == {"alpha": None, "speedup": None, "c": None, "rows": [1.5, None, {"x": 2}]}
    json.dumps(safe, allow_nan=False)  # would raise on a NaN left behind


@pytest.mark.parametrize(
    "no_colour, json_output, expected",
    [(None, False, True), ("1", False, False), ("", False, True), (None, True, False)],
)
def test_colour_only_on_a_terminal_without_no_color(
    monkeypatch: pytest.MonkeyPatch, no_colour: str | None, json_output: bool, expected: bool
) -> None:
    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    monkeypatch.setattr(sys, "stdout", Terminal())
    if no_colour is None:
        monkeypatch.delenv("NO_COLOR", raising=False)
    else:
        monkeypatch.setenv("NO_COLOR", no_colour)  # no-color.org: set and not empty means no colour
    assert use_colour(json_output) is expected


def test_streamed_text_ends_like_the_decoded_text(capsys: pytest.CaptureFixture) -> None:
    """Bytes of a character may be cut off by the end of generation: the stream must end with
    the same U+FFFD that the decoded text (--json) has, not drop it."""
    from model import tokenizer

    ids = list("añ€".encode()) + [0xF0, 0x9F]  # the last character is cut after 2 of its 4 bytes
    streamer = Streamer(colour=False, header="")
    for i in range(0, len(ids), 2):
        streamer(0, ids[i : i + 2], ["accepted"] * len(ids[i : i + 2]))
    streamer.finish()
    assert capsys.readouterr().out == tokenizer.decode(ids) == "añ€\ufffd"


# ---- real processes: signals, pipes, closed streams --------------------------------------------


def torch_is_loading(proc: subprocess.Popen) -> None:
    """Wait until torch's shared library is mapped into the process: its import is under way."""
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        if "libtorch" in Path(f"/proc/{proc.pid}/maps").read_text():
            return
        time.sleep(0.01)


def output_shows(proc: subprocess.Popen, text: str) -> None:
    """Wait until the process has written `text` (or ended)."""
    seen = ""
    while text not in seen and (chunk := proc.stdout.read(1)):
        seen += chunk


# name -> (command, the moment to press Ctrl-C)
INTERRUPTS = {
    "decode, while torch imports": ("decode", torch_is_loading),
    "decode, while it generates": ("decode", lambda proc: output_shows(proc, "def")),
    "train, while it trains": ("train", lambda proc: output_shows(proc, "corpus:")),
}


@pytest.fixture(scope="module")
def processes(pair: list[str], tmp_path_factory: pytest.TempPathFactory) -> dict:
    """Start every case at once, then act on each at its moment; returns name -> (code, stderr).
    Moments are events, not delays: on a busy machine Python's own start-up can take longer
    than any fixed delay, and a Ctrl-C before minispec runs is Python's to handle, not ours."""
    run_dir = tmp_path_factory.mktemp("train")
    argvs = {
        "decode": ["decode", *pair, "--max-new-tokens", "480"],
        "train": [
            "train",
            "--preset",
            "tiny",
            "--no-compile",
            "--out-dir",
            str(run_dir / "out"),
            "--state-dir",
            str(run_dir / "state"),
        ],
    }
    procs = {
        name: start_minispec(argvs[command], stdout=subprocess.PIPE)
        for name, (command, _) in INTERRUPTS.items()
    }
    with open("/dev/full", "w") as full:
        # The reader's pipe holds 4 KiB, and 64 rows of 480 tokens print more than that: the run
        # blocks on a full pipe until the reader goes away, however soon it would end otherwise
        # (with the default 64 KiB, a run faster than this fixture's other moments ended first).
        many_rows = [arg for _ in range(64) for arg in ("--prompt", "x")]
        reader = start_minispec(argvs["decode"] + many_rows, stdout=subprocess.PIPE)
        fcntl.fcntl(reader.stdout.fileno(), fcntl.F_SETPIPE_SZ, 4096)
        disk_full = start_minispec(argvs["decode"], stdout=full)
        closed = subprocess.Popen(
            [
                "sh",
                "-c",
                'exec "$@" >&-',
                "sh",
                sys.executable,
                "-m",
                "minispec",
                "decode",
                *pair,
                "--max-new-tokens",
                "8",
                "--json",
            ],
            cwd=ROOT,
            stderr=subprocess.PIPE,
            text=True,
        )
    for name, (_, moment) in INTERRUPTS.items():
        moment(procs[name])
        with contextlib.suppress(ProcessLookupError):  # it ended first: the test below says so
            os.killpg(procs[name].pid, signal.SIGINT)
    reader.stdout.read(10)  # the reader takes 10 characters of the stream, then goes away
    reader.stdout.close()
    results = {name: (proc.wait(timeout=300), proc.stderr.read()) for name, proc in procs.items()}
    for name, proc in ("closed pipe", reader), ("/dev/full", disk_full), ("closed stdout", closed):
        results[name] = (proc.wait(timeout=300), proc.stderr.read())
    return results


@pytest.mark.parametrize("name", INTERRUPTS)
def test_ctrl_c_at_any_moment_exits_130_without_a_traceback(processes: dict, name: str) -> None:
    code, err = processes[name]
    assert code == 130, err
    assert "Traceback" not in err and "Error" not in err, err


def test_a_reader_that_goes_away_ends_the_run_quietly(processes: dict) -> None:
    code, err = processes["closed pipe"]
    assert code == 141, err  # 128 + SIGPIPE, what `set -o pipefail` reports for other tools
    assert "Traceback" not in err and "Error" not in err, err


def test_a_full_disk_is_one_line(processes: dict) -> None:
    code, err = processes["/dev/full"]
    assert_one_error_line(code, err, "No space left on device")


def test_a_closed_stdout_is_one_line(processes: dict) -> None:
    code, err = processes["closed stdout"]
    assert_one_error_line(code, err, "stdout is closed")


# ---- argument errors before torch; files that a command writes again ------------------------

# Each is an argument error; the wrapper reports whether torch was imported when it was printed.
BEFORE_TORCH = [
    ["decode", "--bogus"],
    ["decode", "--device", "cuda", "--bogus"],  # a --device given still waits for the others
    ["decode", "-k", "AUTO", "--bogus"],
    ["bench", "--bogus"],
    ["bench-sampler", "--repeats", "0"],
    ["copy-score", "--rows", "0"],
    ["export"],
    ["build-index", "--bogus"],
    ["kernels", "--bogus"],
    ["samples", "--n", "0"],
    ["verify", "--draws", "0"],
    ["train", "--bogus"],
    ["train", "--preset", "huge"],
]
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


@pytest.mark.parametrize("argv", BEFORE_TORCH, ids=lambda a: " ".join(a))
def test_an_argument_error_comes_before_torch_is_imported(argv: list[str]) -> None:
    """A bad flag is one line at once, not after torch's second of start-up (not timed here:
    whether torch is in sys.modules when the line is printed says it)."""
    child = subprocess.run(
        [sys.executable, "-c", REPORT_TORCH, *argv],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    error, verdict = child.stderr.splitlines()[:-1], child.stderr.splitlines()[-1]
    assert_one_error_line(child.returncode, "\n".join(error) + "\n")
    assert verdict == "torch imported: False", child.stderr


def test_k_takes_auto_in_any_case() -> None:
    from minispec.commands.cli import decode_parser

    assert decode_parser().parse_args(["-k", "AUTO"]).num_speculative_tokens == "auto"
    assert decode_parser().parse_args(["-k", "3"]).num_speculative_tokens == 3


@pytest.fixture
def tiny_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Index builds read a few hundred bytes instead of the standard library."""
    from types import SimpleNamespace

    import torch

    from minispec.commands import build_index

    text = torch.tensor(list(b"def f(x):\n    return x + 1\n\n" * 20))
    monkeypatch.setattr(build_index, "load_corpus", lambda: SimpleNamespace(train=text))


def test_build_index_replaces_an_index_already_there(
    tmp_path: Path, capsys: pytest.CaptureFixture, tiny_corpus: None
) -> None:
    from minispec.proposers.suffix import SuffixIndex

    out = tmp_path / "index.npz"
    out.write_bytes(b"an earlier index")
    assert main(["build-index", "--out", str(out)]) == 0
    assert len(SuffixIndex.load(out).corpus) > 0
    assert [p.name for p in tmp_path.iterdir()] == ["index.npz"]  # no temporary file left
    assert str(out) in capsys.readouterr().out


def test_copy_score_json_may_name_its_earlier_result(tmp_path: Path) -> None:
    """--json (and build-index's --out) is written by a rename: a file already there is fine."""
    from minispec.commands.args import path_problem

    earlier = tmp_path / "scores.json"
    earlier.write_text("[]")
    assert path_problem(str(earlier), folder=False) is None
    blocked = path_problem(str(earlier / "x.json"), folder=False)
    assert blocked == f"{earlier} is a file, not a folder"


def test_an_unwritable_index_cache_names_the_path_and_the_way_out(
    tmp_path: Path, capsys: pytest.CaptureFixture, tiny_corpus: None
) -> None:
    """A cache folder that cannot be made (here: a file is in the way, which holds even for
    root, who may write anywhere) is one line naming the cache file and XDG_CACHE_HOME."""
    from minispec.commands.build_index import cached_index

    (tmp_path / "blocked").write_text("a file where the cache folder would be")
    path = tmp_path / "blocked" / "index.npz"
    with pytest.raises(OSError) as info:
        cached_index(path)
    message = str(info.value)
    assert str(path) in message and "XDG_CACHE_HOME" in message and "\n" not in message
