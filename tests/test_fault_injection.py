"""Fault injection on the surfaces that write or read files beside the model: export, the suffix
index, Hugging Face folders, and the commands' paths and flags; then the Python API's messages
for inputs that used to fail deep inside torch, and what the wheel holds.

Each fault (a folder that is not ours, a process killed half-way, a file cut short, emptied or
from another program, a hostile config.json) must end in a correct result or in one clear line
that names the problem, with nothing lost and nothing left behind. Kills are made exact: a child
process SIGKILLs itself at a chosen moment of the write (the moment a real kill could land).
"""

from __future__ import annotations

import ast
import json
import os
import signal
import subprocess
import sys
import time
from functools import cache
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from _cli import ROOT
from _enumerate import random_gpt

import minispec
from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET, cached_decoder
from minispec.commands import build_index, copy_score
from minispec.commands.cli import main
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.proposers.suffix import SuffixIndex
from model import folders, hf
from model.checkpoint import CheckpointError, load_checkpoint, load_pair, save_checkpoint
from model.tokenizer import VOCAB_SIZE, encode
from sampling.constraints import sample
from sampling.rejection import rejection_sample

CORPUS = torch.tensor(list(b"def f(x):\n    return x + 1\n\n" * 40))  # a tiny corpus: fast builds


def dead_pid() -> int:
    """The id of a process that has ended (what a killed writer's leftovers carry)."""
    done = subprocess.Popen(["true"])
    done.wait()
    return done.pid


def one_error_line(code: int, err: str, *fragments: str) -> str:
    """The CLI's verdict on bad input: exit code 2 and one line naming the problem."""
    lines = err.splitlines()
    assert code == 2 and len(lines) == 1 and lines[0].startswith("error: "), (code, err)
    assert "Traceback" not in err and all(f in lines[0] for f in fragments), err
    return lines[0]


def contents(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


@pytest.fixture(scope="module")
def pair(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A tiny random byte-vocabulary target/draft pair as checkpoint files."""
    d = tmp_path_factory.mktemp("pair")
    for role, seed in (("target", 0), ("draft", 1)):
        save_checkpoint(d / f"{role}.safetensors", random_gpt(VOCAB_SIZE, seed, max_seq_len=64))
    return d / "target.safetensors", d / "draft.safetensors"


def export_argv(pair: tuple[Path, Path], out: Path | str) -> list[str]:
    return ["export", str(out), "--target", str(pair[0]), "--draft", str(pair[1])]


# ---- export: never replace what minispec did not write ----------------------------------------


def test_export_leaves_a_users_folder_alone(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    mine = tmp_path / "target"
    (mine / ".git").mkdir(parents=True)
    for name, text in (("config.json", "{}"), ("my_weights.bin", "w"), (".git/HEAD", "ref")):
        (mine / name).write_text(text)
    before = {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()}
    assert main(export_argv(pair, tmp_path)) == 2
    one_error_line(2, capsys.readouterr().err, str(mine), "not written by minispec")
    assert {p: p.read_bytes() for p in mine.rglob("*") if p.is_file()} == before
    assert sorted(p.name for p in tmp_path.iterdir()) == ["target"]  # draft/ not written either


def test_export_replaces_its_own_folder_but_not_files_added_to_it(
    pair: tuple[Path, Path], tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert main(export_argv(pair, tmp_path)) == 0
    first = contents(tmp_path / "draft")
    assert folders.MARKER in first
    assert main(export_argv(pair, tmp_path)) == 0  # its own export: replaced
    assert contents(tmp_path / "draft") == first
    (tmp_path / "draft" / "notes.txt").write_text("mine")
    capsys.readouterr()
    assert main(export_argv(pair, tmp_path)) == 2
    one_error_line(2, capsys.readouterr().err, "notes.txt", "did not write")
    assert (tmp_path / "draft" / "notes.txt").read_text() == "mine"


@pytest.mark.parametrize("where", ["", "{file}", "{file}/deeper"])
def test_export_refuses_an_empty_path_and_a_file(
    pair: tuple[Path, Path], tmp_path: Path, where: str, capsys: pytest.CaptureFixture
) -> None:
    (tmp_path / "file").write_text("a file")
    before = sorted(Path.cwd().iterdir())
    with pytest.raises(SystemExit) as exit_:
        main(export_argv(pair, where.format(file=tmp_path / "file")))
    line = one_error_line(exit_.value.code, capsys.readouterr().err, "out_dir")
    assert ".tmp-" not in line
    assert sorted(Path.cwd().iterdir()) == before and (tmp_path / "file").read_text() == "a file"


KILLED_EXPORT = """
import os, signal, sys
from model.checkpoint import load_checkpoint
from model.hf import export_folder

moment, checkpoint, out = sys.argv[1:]
real_fsync, real_replace, fsyncs = os.fsync, os.replace, []

def fsync(fd):  # the third file's bytes are written, not yet renamed into place
    fsyncs.append(fd)
    if len(fsyncs) == 3:
        os.kill(os.getpid(), signal.SIGKILL)
    real_fsync(fd)

def replace(src, dst):  # the old folder moved aside, the new one not yet in its place
    real_replace(src, dst)
    if ".old-" in str(dst):
        os.kill(os.getpid(), signal.SIGKILL)

if moment == "writing":
    os.fsync = fsync
else:
    os.replace = replace
export_folder(load_checkpoint(checkpoint)[0], out)
"""


def killed_export(moment: str, checkpoint: Path, out: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-c", KILLED_EXPORT, moment, str(checkpoint), str(out)], cwd=ROOT
    )
    assert child.returncode == -signal.SIGKILL


@pytest.mark.parametrize("moment", ["writing", "swapping"])
def test_a_killed_export_is_cleaned_up_by_the_next(
    pair: tuple[Path, Path], tmp_path: Path, moment: str
) -> None:
    out = tmp_path / "m"
    hf.export_folder(load_checkpoint(pair[0])[0], out)
    old = contents(out)
    killed_export(moment, pair[1], out)
    left = sorted(p.name for p in tmp_path.iterdir() if p.name.startswith(".m."))
    assert left, "the kill left nothing: it came too late to test anything"
    if moment == "swapping":  # the old export is aside and nothing is at `out`: it goes back
        assert not out.exists()
        folders.remove_stale_asides(out, hf.EXPORT_NAMES | {folders.MARKER})
        assert contents(out) == old
    draft = load_checkpoint(pair[1])[0]
    hf.export_folder(draft, out)
    assert [p.name for p in tmp_path.iterdir()] == ["m"]  # nothing left behind
    loaded = load_checkpoint(out)[0]
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), draft.parameters()))


def test_only_dead_exports_own_leftovers_are_removed(tmp_path: Path) -> None:
    out, names = tmp_path / "m", hf.EXPORT_NAMES | {folders.MARKER}
    live = tmp_path / f".m.tmp-{os.getppid()}"  # a write in progress
    foreign = tmp_path / f".m.tmp-{dead_pid()}"  # the name of ours, a user's file inside
    stale = tmp_path / f".m.old-{dead_pid()}"
    for folder, name in ((live, "config.json"), (foreign, "notes.txt"), (stale, "config.json")):
        folder.mkdir()
        (folder / name).write_text("x")
    out.mkdir()  # `out` is there, so the stale old folder is not needed back
    folders.remove_stale_asides(out, names)
    assert live.exists() and foreign.exists() and not stale.exists()


# ---- the suffix index: corrupt, truncated, foreign; a killed build ----------------------------


def saved_index(path: Path) -> SuffixIndex:
    index = SuffixIndex.build(CORPUS.numpy())
    index.save(path)
    return index


def truncated(path: Path) -> None:
    path.write_bytes(path.read_bytes()[: path.stat().st_size // 2])


def foreign(path: Path) -> None:
    np.savez(open(path, "wb"), weights=np.zeros(3))


def wrong_arrays(path: Path) -> None:  # the right names, but not an index's arrays
    np.savez(open(path, "wb"), corpus=np.zeros(4, np.float32), order=np.arange(5))


def out_of_range(path: Path) -> None:  # an index's shapes, but its suffix array points outside
    np.savez(open(path, "wb"), corpus=np.zeros(4, np.uint8), order=np.full(4, 9, np.int32))


CORRUPTIONS = {
    "truncated": truncated,
    "empty": lambda path: path.write_bytes(b""),
    "text": lambda path: path.write_text("not an index"),
    "foreign npz": foreign,
    "wrong arrays": wrong_arrays,
    "out of range": out_of_range,
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_corrupt_index_is_one_error_naming_the_file(tmp_path: Path, corruption: str) -> None:
    path = tmp_path / "index.npz"
    saved_index(path)
    CORRUPTIONS[corruption](path)
    with pytest.raises(ValueError, match="not a suffix index") as info:
        SuffixIndex.load(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)


@pytest.fixture
def small_corpus(monkeypatch: pytest.MonkeyPatch) -> None:
    """Index builds read CORPUS instead of the standard library: a build takes milliseconds."""
    corpus = SimpleNamespace(train=CORPUS)
    monkeypatch.setattr(build_index, "load_corpus", lambda: corpus)


@pytest.mark.parametrize("corruption", ["truncated", "empty", "foreign npz"])
def test_decode_rebuilds_a_corrupt_cached_index(
    pair: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    small_corpus: None,
    corruption: str,
) -> None:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    cached_decoder.cache_clear()  # a cached decoder keeps the index an earlier case loaded
    path = build_index.default_path()
    path.parent.mkdir(parents=True)
    expected = saved_index(path)
    CORRUPTIONS[corruption](path)
    argv = ["decode", "--proposer", "suffix", "--no-compile", "--max-new-tokens", "4", "--json"]
    assert main([*argv, "--target", str(pair[0]), "--draft", str(pair[1])]) == 0
    err = capsys.readouterr().err
    assert (
        err.count("\n") == 1
        and err.startswith("rebuilding the suffix index: ")
        and str(path) in err
    )
    rebuilt = SuffixIndex.load(path)
    assert np.array_equal(rebuilt.corpus, expected.corpus)
    assert np.array_equal(rebuilt.order, expected.order)
    assert [p.name for p in path.parent.iterdir()] == [path.name]


KILLED_BUILD = """
import os, signal, sys
import numpy as np
from minispec.proposers.suffix import SuffixIndex

def fsync(fd):  # the index's bytes are written, not yet renamed into place
    os.kill(os.getpid(), signal.SIGKILL)

os.fsync = fsync
SuffixIndex.build(np.frombuffer(b"def f(x):\\n    return x\\n" * 9, np.uint8)).save(sys.argv[1])
"""


def test_a_killed_index_build_leaves_nothing_after_the_rerun(
    tmp_path: Path, small_corpus: None, capsys: pytest.CaptureFixture
) -> None:
    path = tmp_path / "index.npz"
    child = subprocess.run([sys.executable, "-c", KILLED_BUILD, str(path)], cwd=ROOT)
    assert child.returncode == -signal.SIGKILL
    assert not path.exists() and len(list(tmp_path.iterdir())) == 1  # its temporary
    assert main(["build-index", "--out", str(path)]) == 0
    assert [p.name for p in tmp_path.iterdir()] == ["index.npz"]
    assert np.array_equal(SuffixIndex.load(path).order, SuffixIndex.build(CORPUS.numpy()).order)


@pytest.mark.parametrize("where", ["{file}/x.npz", "{folder}", ""])
def test_build_index_checks_its_path_before_the_work(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture, where: str
) -> None:
    def too_early():
        pytest.fail("the corpus was read before --out was checked")

    monkeypatch.setattr(build_index, "load_corpus", too_early)
    (tmp_path / "file").write_text("x")
    out = where.format(file=tmp_path / "file", folder=tmp_path)
    with pytest.raises(SystemExit) as exit_:
        main(["build-index", "--out", out])
    one_error_line(exit_.value.code, capsys.readouterr().err, "--out")


def test_build_index_module_goes_through_the_front_door(tmp_path: Path) -> None:
    child = subprocess.run(
        [sys.executable, "-m", "minispec.commands.build_index", "--out", str(tmp_path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    one_error_line(child.returncode, child.stderr, "is a folder, not a file")


# ---- hostile Hugging Face folders -------------------------------------------------------------


@pytest.fixture(scope="module")
def byte_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """An exported tiny model with the byte tokenizer: 258 tokens, 2 heads of 8, 1 layer."""
    folder = tmp_path_factory.mktemp("hf") / "m"
    hf.export_folder(random_gpt(VOCAB_SIZE, seed=0, max_seq_len=64), folder)
    return folder


def hostile(src: Path, dst: Path, config: dict | None = None, files: dict | None = None) -> Path:
    """A copy of folder `src` with config.json's keys changed (None: removed) and files replaced
    (bytes or a JSON value; None: removed)."""
    dst.mkdir()
    for p in src.iterdir():
        (dst / p.name).write_bytes(p.read_bytes())
    hf_config = {**json.loads((src / "config.json").read_text()), **(config or {})}
    files = {"config.json": hf_config, **(files or {})}
    for name, value in files.items():
        if value is None:
            (dst / name).unlink()
        else:
            (dst / name).write_bytes(
                value if isinstance(value, bytes) else json.dumps(value).encode()
            )
    return dst


NOT_A_LIST = {"version": "1.0", "model": {"type": "BPE", "vocab": {"a": 0}, "merges": []}}
HOSTILE = {
    # name: (config.json changes, file changes, a fragment of the one line)
    "no heads": ({"num_attention_heads": 0}, {}, "num_attention_heads must be a positive int"),
    "rope_scaling a string": ({"rope_scaling": "linear"}, {}, "rope_scaling 'linear'"),
    "hidden_size a string": ({"hidden_size": "384"}, {}, "hidden_size must be a positive int"),
    "1000 layers": ({"num_hidden_layers": 1000}, {}, "(8,991 in all)"),
    "huge mlp": ({"intermediate_size": 10**12}, {}, "do not stack"),
    "huge vocabulary": ({"vocab_size": 2**24}, {}, "has 258 token ids, but config.json's vocab"),
    "huge vocabulary, no tokenizer": (
        {"vocab_size": 2**24},
        {"tokenizer.json": None},
        "do not stack",
    ),
    "head_dim": ({"head_dim": 4}, {}, "head_dim 4 != hidden_size"),
    "config a list": ({}, {"config.json": [1, 2]}, "config.json does not load"),
    "config not JSON": ({}, {"config.json": b"{"}, "config.json does not load"),
    "index without weight_map": (
        {},
        {"model.safetensors": None, "model.safetensors.index.json": {"metadata": {}}},
        "no weight_map",
    ),
    "index not JSON": (
        {},
        {"model.safetensors": None, "model.safetensors.index.json": b"{,"},
        "model.safetensors.index.json does not load",
    ),
    "index outside the folder": (
        {},
        {"model.safetensors": None, "model.safetensors.index.json": {"weight_map": {"a": "../x"}}},
        "no weight_map",
    ),
    "tokenizer a list": ({}, {"tokenizer.json": [1, 2]}, "tokenizer.json: not a tokenizer"),
    "tokenizer not JSON": ({}, {"tokenizer.json": b"[1,"}, "tokenizer.json does not load"),
    "tokenizer of 96 tokens": ({}, {"tokenizer.json": NOT_A_LIST}, "has 1 token ids"),
}


@pytest.mark.parametrize("case", HOSTILE)
def test_a_hostile_folder_is_one_error_before_any_allocation(
    byte_folder: Path, tmp_path: Path, case: str
) -> None:
    changes, files, fragment = HOSTILE[case]
    folder = hostile(byte_folder, tmp_path / "m", changes, files)
    start = time.perf_counter()
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(folder)
    message = str(info.value)
    assert fragment in message and "\n" not in message, message
    assert message.count(str(folder)) == 1 and len(message) < 400, message
    assert time.perf_counter() - start < 5  # no model of the asked-for size was built


def test_a_folder_tokenizer_must_match_its_vocabulary(byte_folder: Path, tmp_path: Path) -> None:
    """A tokenizer with fewer ids than the model: the model's other ids would vanish from the
    text. Here 96 ids (the first 94 bytes and BOS/EOS) on the 258-token model."""
    spec = json.loads((byte_folder / "tokenizer.json").read_text())
    spec["model"]["vocab"] = {c: i for c, i in spec["model"]["vocab"].items() if i < 94}
    for token in spec["added_tokens"]:
        token["id"] -= 256 - 94
    folder = hostile(byte_folder, tmp_path / "m", files={"tokenizer.json": spec})
    with pytest.raises(CheckpointError, match="has 96 token ids, but config.json's vocab_size"):
        load_checkpoint(folder)


def test_huge_context_loads_without_allocating_its_cache(byte_folder: Path, tmp_path: Path) -> None:
    """max_position_embeddings has no weight to check against: it loads, and the cache is sized
    by each request, not by the context."""
    folder = hostile(byte_folder, tmp_path / "m", {"max_position_embeddings": 2**20})
    assert load_checkpoint(folder)[0].config.max_seq_len == 2**20


def test_a_shard_index_loads(byte_folder: Path, tmp_path: Path) -> None:
    weights = (byte_folder / "model.safetensors").read_bytes()
    index = {"weight_map": {"model.embed_tokens.weight": "shard-1.safetensors"}}
    files = {"model.safetensors": None, "shard-1.safetensors": weights}
    folder = hostile(
        byte_folder, tmp_path / "m", files={**files, "model.safetensors.index.json": index}
    )
    loaded, expected = load_checkpoint(folder)[0], load_checkpoint(byte_folder)[0]
    assert all(torch.equal(a, b) for a, b in zip(loaded.parameters(), expected.parameters()))


def test_same_size_different_tokenizers_say_so(byte_folder: Path, tmp_path: Path) -> None:
    spec = json.loads((byte_folder / "tokenizer.json").read_text())
    spec["pre_tokenizer"]["add_prefix_space"] = True  # not the byte tokenizer, still 258 ids
    other = hostile(byte_folder, tmp_path / "m", files={"tokenizer.json": spec})
    with pytest.raises(CheckpointError) as info:
        load_pair(byte_folder, other)
    message = str(info.value)
    assert "different tokenizers (hf " in message and "vs bytes)" in message, message
    assert "258 vs 258" not in message


def test_a_hostile_folder_is_one_line_in_the_cli(
    byte_folder: Path, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = hostile(byte_folder, tmp_path / "m", {"num_attention_heads": 0})
    argv = ["decode", "--no-compile", "--target", str(folder), "--draft", str(byte_folder)]
    assert main(argv) == 2
    one_error_line(2, capsys.readouterr().err, "num_attention_heads")


# ---- the commands' flags and paths ------------------------------------------------------------


def test_a_closed_stdout_is_one_line() -> None:
    child = subprocess.run(
        ["sh", "-c", 'exec "$@" >&-', "sh", sys.executable, "-m", "minispec", "decode"],
        cwd=ROOT,
        capture_output=False,
        stderr=subprocess.PIPE,
        text=True,
    )
    one_error_line(child.returncode, child.stderr, "stdout is closed")


TRAIN_REFUSALS = [
    (["--preset", "tiny", "--copy-fraction", "1.0"], "too short for a copy row"),
    (["--preset", "tiny", "--resume"], "--resume: there is no saved state"),
    (["--only", "target", "--init-from", "{missing}"], "no such file or folder"),
]


@pytest.mark.parametrize("flags,fragment", TRAIN_REFUSALS)
def test_train_refuses_what_it_cannot_do(
    tmp_path: Path, capsys: pytest.CaptureFixture, flags: list[str], fragment: str
) -> None:
    flags = [f.format(missing=tmp_path / "missing") for f in flags]
    dirs = ["--out-dir", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")]
    assert main(["train", *flags, *dirs, "--check-args"]) == 2
    one_error_line(2, capsys.readouterr().err, fragment)


def test_train_takes_a_model_folder_to_start_from(byte_folder: Path, tmp_path: Path) -> None:
    dirs = ["--out-dir", str(tmp_path / "out"), "--state-dir", str(tmp_path / "state")]
    flags = ["--only", "target", "--init-from", str(byte_folder), "--check-args"]
    assert main(["train", *flags, *dirs]) == 0


def test_make_train_checks_arguments_once_before_torchrun() -> None:
    child = subprocess.run(
        ["make", "--no-print-directory", "train", "NPROC=2", "ARGS=--steps x"],
        cwd=ROOT,
        capture_output=True,
        text=True,
    )
    assert child.returncode != 0 and "Traceback" not in child.stderr, child.stderr
    errors = [line for line in child.stderr.splitlines() if line.startswith("error: ")]
    assert errors == ["error: minispec train: argument --steps: expected an integer, got 'x'"]
    assert "torch.distributed.run" not in child.stdout


def test_copy_score_checks_before_scoring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def too_early():
        pytest.fail("the corpus was read before the checks")

    monkeypatch.setattr(copy_score, "load_corpus", too_early)
    short = tmp_path / "short.safetensors"
    save_checkpoint(short, random_gpt(VOCAB_SIZE, seed=0, max_seq_len=128))
    (tmp_path / "file").write_text("x")
    assert main(["copy-score", str(short)]) == 2
    one_error_line(2, capsys.readouterr().err, "context of 128 tokens is too short")
    for flags, fragment in (
        (["--json", str(tmp_path / "file" / "x.json")], "is a file, not a folder"),
        (["--json", str(tmp_path)], "is a folder, not a file"),
        (["--rows", "1000000000000"], "must be <= 256"),
    ):
        with pytest.raises(SystemExit) as exit_:
            main(["copy-score", str(short), *flags])
        one_error_line(exit_.value.code, capsys.readouterr().err, fragment)


@pytest.mark.parametrize("command", ["bench", "kernels"])
def test_out_must_be_a_folder(command: str, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    (tmp_path / "file").write_text("x")
    with pytest.raises(SystemExit) as exit_:
        main([command, "--out", str(tmp_path / "file")])
    one_error_line(exit_.value.code, capsys.readouterr().err, "--out", "is a file, not a folder")


# ---- model/ has no import cycle ---------------------------------------------------------------


def model_imports(path: Path) -> set[str]:
    """The model/ modules that `path` imports, at the top or inside a function."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
        found.update(n.split(".")[1] for n in names if n.startswith("model."))
    return found & {p.stem for p in (ROOT / "model").glob("*.py")}


def test_model_has_no_import_cycle() -> None:
    graph = {p.stem: model_imports(p) for p in (ROOT / "model").glob("*.py")}

    def reaches(start: str, target: str, seen: set[str]) -> bool:
        return any(
            n == target or (n not in seen and reaches(n, target, seen | {n})) for n in graph[start]
        )

    cycles = sorted(m for m in graph if reaches(m, m, set()))
    assert not cycles, f"model/ modules in an import cycle: {cycles}"


# ---- the API's messages: meta tensors, NaN, warm_up, BOS ---------------------------------------


@cache
def byte_decoder() -> SpeculativeDecoder:
    """A tiny eager decoder on the byte vocabulary, whose prompts start with BOS."""
    return SpeculativeDecoder(random_gpt(VOCAB_SIZE, 0, max_seq_len=32), compile=False)


def one_line_error(error: type, call, *fragments: str) -> None:
    """`call()` raises one `error` of one line that holds every fragment."""
    with pytest.raises(error) as info:
        call()
    message = str(info.value)
    assert "\n" not in message and all(f in message for f in fragments), message


def sample_meta(generator: torch.Generator | None) -> None:
    sample(torch.zeros(2, 5, device="meta"), generator=generator, compiled=False)


def reject_meta(generator: torch.Generator | None) -> None:
    drafts = torch.zeros(2, 2, dtype=torch.long, device="meta")
    rejection_sample(
        torch.zeros(2, 3, 5, device="meta"), drafts, generator=generator, compiled=False
    )


@pytest.mark.parametrize("draw", [sample_meta, reject_meta])
@pytest.mark.parametrize("with_generator", [False, True])
def test_meta_logits_are_one_value_error(draw, with_generator: bool) -> None:
    """Meta logits have shapes and no values: refused, not sampled into meta tensors (or, with a
    generator, failed in torch's reference code with a bare AssertionError)."""
    generator = torch.Generator() if with_generator else None
    one_line_error(ValueError, lambda: draw(generator), "meta device", "cpu or cuda")


class ElsewhereGenerator(torch.Generator):
    """A CPU generator that says it lives on another device: this torch build cannot make a
    meta generator, and a CPU machine has no CUDA one, so it stands in for either."""

    @property
    def device(self) -> torch.device:
        return torch.device("meta")


@pytest.mark.parametrize("method", ["standard", "drafter_invariant"])
def test_a_generator_on_another_device_is_one_value_error(method: str) -> None:
    logits, drafts = torch.zeros(2, 3, 5), torch.zeros(2, 2, dtype=torch.long)
    generator = ElsewhereGenerator()
    for call in (
        lambda: sample(logits[:, 0], generator=generator, compiled=False),
        lambda: rejection_sample(
            logits, drafts, generator=generator, method=method, compiled=False
        ),
    ):
        one_line_error(ValueError, call, "generator is on meta, the logits on cpu")


def test_a_model_on_the_meta_device_is_refused_when_the_decoder_is_built() -> None:
    target = random_gpt(VOCAB_SIZE, 0, max_seq_len=32)
    meta = random_gpt(VOCAB_SIZE, 1, max_seq_len=32).to("meta")
    one_line_error(ValueError, lambda: SpeculativeDecoder(meta), "target is on the meta device")
    one_line_error(
        ValueError, lambda: SpeculativeDecoder(target, meta), "draft is on the meta device"
    )


NAN = float("nan")
NAN_TEMPERATURES = {
    "sample, a [B] tensor": lambda: sample(
        torch.zeros(2, 5), temperature=torch.tensor([1.0, NAN]), compiled=False
    ),
    "rejection_sample, a [B] tensor": lambda: rejection_sample(
        torch.zeros(2, 3, 5),
        torch.zeros(2, 2, dtype=torch.long),
        temperature=torch.tensor([1.0, NAN]),
        compiled=False,
    ),
    "sample, a float": lambda: sample(torch.zeros(2, 5), temperature=NAN, compiled=False),
    "SamplingParams": lambda: SamplingParams(temperature=NAN).validate(),
}


@pytest.mark.parametrize("case", NAN_TEMPERATURES)
def test_a_nan_temperature_is_called_nan(case: str) -> None:
    """NaN fails every comparison: it was reported as a temperature below 0."""
    one_line_error(ValueError, NAN_TEMPERATURES[case], "temperature is NaN", ">= 0")


def test_a_nan_top_p_is_called_nan() -> None:
    one_line_error(ValueError, SamplingParams(top_p=NAN).validate, "top_p is NaN", "(0, 1]")


@pytest.mark.parametrize("warm_up", ["yes", 1, None])
def test_warm_up_must_be_a_bool(warm_up) -> None:
    """A str such as "no" is truthy: it warmed up, decoding nothing, without a word."""

    def call() -> None:
        minispec.generate(
            ["hi"],
            num_speculative_tokens=0,
            max_new_tokens=2,
            decoder=byte_decoder(),
            warm_up=warm_up,
        )

    one_line_error(TypeError, call, "warm_up must be a bool")


def test_a_byte_vocabulary_prompt_must_start_with_bos() -> None:
    params, spec = [SamplingParams(max_new_tokens=2)] * 2, SpeculativeConfig(0)
    one_line_error(
        ValueError,
        lambda: byte_decoder().generate([encode("ab"), encode("ab", bos=False)], params, spec),
        "prompt 1 does not start with BOS (id 256)",
        "model.tokenizer.encode",
    )
    # Another vocabulary's BOS is its tokenizer's business (GPT-2's adds none): no check.
    other = SpeculativeDecoder(random_gpt(32, 0, max_seq_len=32), compile=False)
    assert len(other.generate([[1, 2]], params[:1], spec).token_ids[0]) == 2


def test_the_wheel_finds_every_package_and_ships_the_pair() -> None:
    """pyproject.toml's discovery, run as setuptools runs it: every package folder (one with an
    __init__.py) under the shipped roots, and the pair the API loads by default, are in the
    wheel, with no test or benchmark code. make wheel-check installs the real wheel."""
    tomllib = pytest.importorskip("tomllib")
    setuptools = pytest.importorskip("setuptools")
    config = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    find = config["packages"]["find"]
    assert find["namespaces"]  # `checkpoints` has no __init__.py
    found = set(
        setuptools.find_namespace_packages(
            str(ROOT), include=find["include"], exclude=find["exclude"]
        )
    )
    wanted = {
        ".".join(init.parent.relative_to(ROOT).parts)
        for root in ("minispec", "model", "sampling")
        for init in (ROOT / root).rglob("__init__.py")
    }
    assert wanted | {"checkpoints"} <= found, sorted(wanted - found)
    assert not {p for p in found if p.split(".")[0] in ("tests", "benchmarks")}
    shipped = config["package-data"]["checkpoints"]
    for path in (DEFAULT_TARGET, DEFAULT_DRAFT):
        assert path.parent == ROOT / "checkpoints" and any(path.match(g) for g in shipped)


def test_one_decoder_shared_by_two_threads_gives_each_its_own_output() -> None:
    """Two threads calling generate on one decoder at once: each gets the tokens a call alone
    gives (the calls take turns), never a mix of the two calls' KV cache entries."""
    import threading

    from _enumerate import perturbed_copy, random_gpt

    from minispec.decode import SpeculativeDecoder
    from minispec.params import SamplingParams, SpeculativeConfig

    target = random_gpt(24, 11, scale=1.5, max_seq_len=96)
    decoder = SpeculativeDecoder(target, perturbed_copy(target, 12, 0.3), compile=False)
    prompts = [[1, 2, 3, 4], [5, 6, 7]]
    params = [SamplingParams(temperature=0.0, max_new_tokens=60)]
    spec = SpeculativeConfig(4, "greedy")
    alone = [decoder.generate([p], params, spec).token_ids[0] for p in prompts]
    for _ in range(3):
        results = [None, None]

        def work(i: int) -> None:
            results[i] = decoder.generate([prompts[i]], params, spec).token_ids[0]

        threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert results == alone


def test_decoder_generate_refuses_a_warm_up_that_is_not_a_bool() -> None:
    from _enumerate import random_gpt

    from minispec.decode import SpeculativeDecoder
    from minispec.params import SamplingParams, SpeculativeConfig

    decoder = SpeculativeDecoder(random_gpt(24, 1), compile=False)
    params = [SamplingParams(max_new_tokens=2)]
    with pytest.raises(TypeError, match="warm_up must be a bool"):
        decoder.generate([[1, 2]], params, SpeculativeConfig(0), warm_up="yes")
