"""`python -m minispec decode` on bad and good input (issue 4, "Bad input").

Every bad input must give exactly one line on stderr, starting with "error:", exit code 2 and
no traceback. All cases run in-process through minispec.commands.cli.main (cheap: an exception
escaping main fails the test as a traceback would); a representative subset also runs as real
subprocesses, started together, which is the honest check of what a user sees (warnings,
interpreter start-up, the default compiled mode). Tiny checkpoints are written to a tmp dir, so
nothing here needs the shipped pair.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
from _cli import start_minispec
from _enumerate import (
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    random_gpt,
)

from minispec.commands.cli import main
from model.checkpoint import save_checkpoint
from model.tokenizer import VOCAB_SIZE

pytestmark = pytest.mark.usefixtures("one_thread")

ROOT = Path(__file__).resolve().parent.parent
CONTEXT = 64  # the tiny checkpoints' max_seq_len


@pytest.fixture(scope="module")
def files(tmp_path_factory: pytest.TempPathFactory) -> dict[str, str]:
    d = tmp_path_factory.mktemp("checkpoints")
    target = random_gpt(VOCAB_SIZE, seed=0, max_seq_len=CONTEXT)
    save_checkpoint(d / "target.safetensors", target)
    save_checkpoint(d / "draft.safetensors", random_gpt(VOCAB_SIZE, seed=1, max_seq_len=CONTEXT))
    (d / "junk.safetensors").write_bytes(b"\x00junk" * 50)
    return {
        "target": str(d / "target.safetensors"),
        "draft": str(d / "draft.safetensors"),
        "junk": str(d / "junk.safetensors"),
        "missing": str(d / "nope.safetensors"),
    }


def decode_argv(
    files: dict[str, str],
    *extra: str,
    compile: bool = False,
    target: str = "target",
    draft: str = "draft",
) -> list[str]:
    return [
        "decode",
        *([] if compile else ["--no-compile"]),
        "--target",
        files[target],
        "--draft",
        files[draft],
        "--max-new-tokens",
        "4",
        *extra,
    ]


# name -> (decode_argv keyword arguments, extra flags). Without --prompt the default prompt
# (16 tokens) is used, which fits the 64-token context with 4 new tokens and K = 4.
BAD_INPUT = {
    "empty prompt": ({}, ["--prompt", ""]),
    "prompt longer than the context": ({}, ["--prompt", "x" * (CONTEXT + 10)]),
    "max_new_tokens beyond the context": ({}, ["--max-new-tokens", str(CONTEXT + 1)]),
    "max_new_tokens zero": ({}, ["--max-new-tokens", "0"]),
    "K below 0": ({}, ["-k", "-1"]),
    "K above the limit": ({}, ["--num-speculative-tokens", "17"]),
    "K not an integer": ({}, ["-k", "two"]),
    "unknown draft method": ({}, ["--draft-sample-method", "beam"]),
    "unknown rejection method": ({}, ["--rejection-sample-method", "lenient"]),
    "unknown proposer": ({}, ["--proposer", "oracle"]),
    "negative temperature": ({}, ["--temperature", "-0.5"]),
    "top_p zero": ({}, ["--top-p", "0"]),
    "top_p above one": ({}, ["--top-p", "1.5"]),
    "negative top_k": ({}, ["--top-k", "-3"]),
    "missing target checkpoint": ({"target": "missing"}, []),
    "missing draft checkpoint": ({"draft": "missing"}, []),
    "corrupt target checkpoint": ({"target": "junk"}, []),
    "corrupt draft checkpoint": ({"draft": "junk"}, []),
    "unknown flag": ({}, ["--speculate-harder"]),
    "unknown device": ({}, ["--device", "abacus"]),
    "tree branching without the tree proposer": ({}, ["--tree-branching", "2,2"]),
    "a tree of 64**4 nodes": ({}, ["--proposer", "tree", "--tree-branching", "64,64,64,64"]),
    "head checkpoint that is a folder": ({}, ["--head", "."]),
    # The default, compiled mode must validate before it starts (and announces) compiling.
    "negative temperature, compiled mode": ({"compile": True}, ["--temperature", "-1"]),
}
IN_SUBPROCESS = [
    "K not an integer",
    "prompt longer than the context",
    "corrupt draft checkpoint",
    "unknown device",
    "negative temperature, compiled mode",
]


def assert_one_error_line(code: int, stderr: str) -> None:
    assert code == 2, stderr
    assert "Traceback" not in stderr
    lines = stderr.splitlines()
    assert (
        len(lines) == 1 and lines[0].startswith("error: ") and len(lines[0]) > len("error: ") + 10
    ), stderr


@pytest.mark.parametrize("case", BAD_INPUT)
def test_bad_input_in_process(
    case: str, files: dict[str, str], capsys: pytest.CaptureFixture
) -> None:
    kwargs, extra = BAD_INPUT[case]
    try:
        code = main(decode_argv(files, *extra, **kwargs))
    except SystemExit as exc:  # argparse's errors leave through SystemExit
        code = exc.code
    assert_one_error_line(code, capsys.readouterr().err)


@pytest.fixture(scope="module")
def subprocess_results(files: dict[str, str]) -> dict[str, tuple[int, str, str]]:
    """All subprocess cases, plus the happy path, started at once: each spends most of its time
    importing torch, which overlaps."""
    argvs = {
        case: decode_argv(files, *BAD_INPUT[case][1], **BAD_INPUT[case][0])
        for case in IN_SUBPROCESS
    }
    argvs["happy"] = decode_argv(
        files,
        "--prompt",
        "def f(",
        "--prompt",
        "x = [",
        "-k",
        "2",
        "--seed",
        "3",
        "--temperature",
        "0.8",
        "--top-k",
        "50",
        "--json",
    )
    procs = {case: start_minispec(argv, stdout=subprocess.PIPE) for case, argv in argvs.items()}
    results = {}
    for case, proc in procs.items():
        out, err = proc.communicate(timeout=300)
        results[case] = (proc.returncode, out, err)
    return results


@pytest.mark.parametrize("case", IN_SUBPROCESS)
def test_bad_input_in_a_subprocess(case: str, subprocess_results: dict) -> None:
    code, _, err = subprocess_results[case]
    assert_one_error_line(code, err)


def test_json_happy_path(subprocess_results: dict) -> None:
    code, out, err = subprocess_results["happy"]
    assert code == 0, err
    assert "Traceback" not in err and "error" not in err
    report = json.loads(out)  # stdout is exactly one JSON document
    requests = report["requests"]
    assert [r["prompt"] for r in requests] == ["def f(", "x = ["]
    for r in requests:
        assert 1 <= len(r["token_ids"]) <= 4 and len(r["origins"]) == len(r["token_ids"])
        assert all(0 <= t < VOCAB_SIZE for t in r["token_ids"])
        assert set(r["origins"]) <= {"accepted", "corrective", "bonus"}
    stats = report["stats"]
    assert stats["num_speculative_tokens"] == 2
    assert stats["emitted"] == sum(len(r["token_ids"]) for r in requests)
    assert stats["host_syncs_per_round"] == 1.0


def test_the_tree_proposer_decodes_without_k(
    files: dict[str, str], capsys: pytest.CaptureFixture
) -> None:
    """-k defaults to auto, which a tree cannot take (its depth is fixed): the command picks
    the depth, 4 for the default branching, instead of refusing the default."""
    code = main(decode_argv(files, "--proposer", "tree", "--json"))
    out, err = capsys.readouterr()
    assert code == 0, err
    assert json.loads(out)["stats"]["num_speculative_tokens"] == 4
