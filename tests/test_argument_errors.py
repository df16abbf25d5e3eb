"""Every argument error a user can make in `minispec decode` (and `samples`, `bench`) is one line
and exit code 2 before torch is imported (issue 54): K, the sampling ranges, the seed per
prompt, the method and proposer names, checkpoint paths, trees too large or too deep, whose
size is counted from the numbers, never built, and a feature head that its file's header shows
cannot draft for the target (issue 66).

The cases run in one child process in which torch cannot be imported at all: a check that
needed it, or a flag that slipped through to the work, ends the case in an ImportError instead
of an error line, and so fails it (no timing: what was imported says it). The names the flags
take are light copies of registries that import torch; the copies are held equal to them here.
"""

from __future__ import annotations

import json
import struct
import subprocess
import sys
from pathlib import Path

import pytest

from model.storage import HEAD_FORMAT

ROOT = Path(__file__).resolve().parent.parent

# argv -> a fragment of the one line. {folder}: a folder without a model in it.
CASES = [
    (["decode", "-k", "99"], "num_speculative_tokens must be 'auto' or an int in [0, 16]"),
    (["decode", "-k", "-1"], "--num-speculative-tokens"),
    (["decode", "--temperature", "-0.5"], "--temperature"),
    (["decode", "--temperature", "inf"], "--temperature"),
    (["decode", "--top-p", "0"], "--top-p"),
    (["decode", "--top-p", "1.5"], "--top-p"),
    (["decode", "--top-k", "-3"], "--top-k"),
    (["decode", "--seed", "-1"], "--seed"),
    (["decode", "--seed", str(2**32)], "--seed"),
    (["decode", "--seed", str(2**32 - 1), "--prompt", "a", "--prompt", "b"], "2**32 - 2"),
    (["decode", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["decode", "--draft-sample-method", "beam"], "--draft-sample-method"),
    (["decode", "--rejection-sample-method", "lenient"], "--rejection-sample-method"),
    (["decode", "--proposer", "oracle"], "--proposer"),
    (["decode", "--target", "{folder}/missing.safetensors"], "not found"),
    (["decode", "--draft", "{folder}/missing.safetensors"], "not found"),
    (["decode", "--head", "{folder}/missing.safetensors"], "not found"),
    (["decode", "--target", "{folder}"], "not a regular file"),
    (["decode", "--draft", "/dev/null"], "not a regular file"),
    (["decode", "--head", "{folder}"], "not a regular file"),
    (["decode", "--tree-branching", "3"], "--tree-branching: only with --proposer tree"),
    (["decode", "--proposer", "tree", "--tree-branching", "0"], "--tree-branching"),
    (
        ["decode", "--proposer", "tree", "-k", "5", "--tree-branching", "64,64,64,64,64"],
        "more than 64 nodes",
    ),
    (
        ["decode", "--proposer", "tree", "-k", "2", "--tree-branching", "64,64,64,64,64,64"],
        "deeper than the tree's depth K = 2",
    ),
    (["decode", "--proposer", "tree", "-k", "4", "--tree-branching", "64,64,64,64"], "64 nodes"),
    (["decode", "--proposer", "tree", "--tree-branching", "8,8"], "more than 64 nodes"),
    (["decode", "--proposer", "tree", "--rejection-sample-method", "block"], "'block'"),
    (["samples", "--max-new-tokens", "0"], "--max-new-tokens"),
    (["samples", "--target", "{folder}/missing.safetensors"], "not found"),
    (["bench", "--methods", "draft_model:4,oracle:4"], "'oracle:4': write proposer:K"),
    (["bench", "--methods", "tree:4:x"], "--methods"),
    # The feature head, from the headers (issue 66): {heads} holds hand-made bad head files.
    (["decode", "--head", "{heads}/garbage.safetensors"], "not a safetensors file"),
    (["decode", "--head", "checkpoints/target.safetensors"], "not a feature head (format"),
    (["decode", "--head", "{heads}/no_config.safetensors"], "its config does not parse"),
    (["decode", "--head", "{heads}/cut.safetensors"], "truncated safetensors file"),
    (["decode", "--head", "{heads}/short.safetensors"], "context of 64 tokens, shorter than"),
    (
        ["decode", "--proposer", "feature_head", "--target", "checkpoints/draft.safetensors"],
        "name one with --head",
    ),
    (  # the shipped head's path, named for another target, is read, not dropped
        ["decode", "--target", "checkpoints/draft.safetensors"]
        + ["--head", "checkpoints/head.safetensors"],
        "reads states of width 384, the target's are 128",
    ),
]

# Runs each argv (JSON on stdin) through the front door with torch's import refused, and
# prints each case's exit code, stdout and stderr as JSON.
RUN_WITHOUT_TORCH = """
import contextlib, io, json, sys

class NoTorch:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] == "torch":
            raise ImportError("torch was imported before the argument error")

sys.meta_path.insert(0, NoTorch())
from minispec.commands.cli import main

results = []
for argv in json.load(sys.stdin):
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
        except BaseException as exc:
            code = f"{type(exc).__name__}: {exc}"
    results.append([code, out.getvalue(), err.getvalue()])
print(json.dumps(results))
"""


def write_header(path: Path, metadata: dict[str, str]) -> None:
    """A safetensors file that holds no tensors and `metadata`."""
    header = json.dumps({"__metadata__": metadata}).encode()
    path.write_bytes(struct.pack("<Q", len(header)) + header)


def bad_heads(folder: Path) -> Path:
    """Head files that fail on their header alone: not safetensors, no config, a short context,
    cut inside its tensors."""
    (folder / "garbage.safetensors").write_bytes(b"not a checkpoint")
    whole = (ROOT / "checkpoints" / "head.safetensors").read_bytes()
    (folder / "cut.safetensors").write_bytes(whole[: len(whole) // 2])
    write_header(folder / "no_config.safetensors", {"format": HEAD_FORMAT})
    short = {"target_width": 384, "max_seq_len": 64}
    write_header(folder / "short.safetensors", {"format": HEAD_FORMAT, "config": json.dumps(short)})
    return folder


def assert_one_error_line(code: int | str | None, stderr: str, fragment: str) -> None:
    assert code == 2, (code, stderr)
    lines = stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), stderr
    assert fragment in lines[0], stderr


@pytest.fixture(scope="module")
def results(tmp_path_factory: pytest.TempPathFactory) -> list:
    folder = tmp_path_factory.mktemp("no_model")
    heads = bad_heads(tmp_path_factory.mktemp("bad_heads"))
    argvs = [[a.format(folder=folder, heads=heads) for a in argv] for argv, _ in CASES]
    child = subprocess.run(
        [sys.executable, "-c", RUN_WITHOUT_TORCH],
        input=json.dumps(argvs),
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert child.returncode == 0, child.stderr
    return json.loads(child.stdout)


@pytest.mark.parametrize("case", range(len(CASES)), ids=[" ".join(a) for a, _ in CASES])
def test_an_argument_error_is_one_line_before_torch(results: list, case: int) -> None:
    code, out, err = results[case]
    assert_one_error_line(code, err, CASES[case][1])
    assert out == ""


def test_the_light_name_lists_are_the_registries() -> None:
    """The flags check names against copies in a torch-free module; the library checks them
    against its registries. A proposer or method added to one only would fail here."""
    from minispec.proposers import PROPOSERS
    from minispec.rules import (
        HEAD_PROPOSERS,
        PROPOSER_NAMES,
        REJECTION_SAMPLE_METHOD_NAMES,
        TREE_SAMPLE_METHOD_NAMES,
    )
    from sampling.rules import REJECTION_SAMPLE_METHODS, TREE_SAMPLE_METHODS

    assert PROPOSER_NAMES == tuple(PROPOSERS)
    assert HEAD_PROPOSERS == tuple(name for name in PROPOSERS if PROPOSERS[name].needs == "head")
    assert REJECTION_SAMPLE_METHOD_NAMES == REJECTION_SAMPLE_METHODS
    assert TREE_SAMPLE_METHOD_NAMES == TREE_SAMPLE_METHODS


@pytest.mark.parametrize(
    "argv, depth",
    [
        ([], 4),
        (["--tree-branching", "3,2"], 4),
        (["--tree-branching", "2,1,1,1,1,1"], 6),
        (["-k", "AUTO", "--tree-branching", "2,2"], 4),
        (["-k", "2"], 2),
    ],
)
def test_the_tree_proposer_without_k_picks_a_depth(argv: list[str], depth: int) -> None:
    """-k defaults to auto, which a tree (of fixed depth) cannot take: the command chooses the
    branching's length, at least 4, as --tree-branching's help says."""
    from minispec.commands.cli import check_across_flags, decode_parser

    parser = decode_parser()
    args = parser.parse_args(["--proposer", "tree", *argv])
    check_across_flags(parser, args)
    assert args.num_speculative_tokens == depth
    assert "at least 4 deep" in " ".join(parser.format_help().split())
