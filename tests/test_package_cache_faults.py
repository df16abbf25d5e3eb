"""Fault injection on the package cache's files and on the messages around it (issue 54).

Every file the package cache reads (a package, its .spec, its manifest, a builder's .failed
marker, a queued request) may be garbage, a folder or unreadable: the run says so in one line
naming the file, runs eagerly, and the package is built again. A full disk is "no space left on
device" in one line in every compile mode, whichever writer met it. A bad
MINISPEC_BUILDER_NICENESS, a corrupt guard reference, a compile cache under a file and a
gpu-check without torch are each one line naming what is wrong.

As in tests/test_package_integrity.py, torch.export's saved program stands in for the
AOTInductor compile (its `exported` fixture): no test here compiles C++. A file no read can
open is a symlink to itself, unreadable to root too, whom file modes do not stop.
"""

from __future__ import annotations

import errno
import os
import subprocess
import sys
from pathlib import Path
from typing import Callable

import pytest
import torch
from _cli import ROOT
from test_package_integrity import (
    X4,
    X,
    exported,  # noqa: F401 (a fixture, autouse: the stand-in compile)
    make,
)
from torch.utils._pytree import tree_flatten

import minispec.compilation.builder as builder
import minispec.compilation.packages as packages
from benchmarks import guard
from minispec.commands.front_door import one_line, run
from minispec.compilation import compile_round
from minispec.compilation.announce import Announced
from minispec.compilation.aot import AheadOfTime

ZIP_WRITER = "[enforce fail at inline_container.cc:672] . unexpected pos 4499584 vs 4499472"


def a_folder(path: Path) -> None:
    path.mkdir()
    (path / "inside").write_text("x")  # not empty: rmdir alone would not do


def a_loop(path: Path) -> None:
    """A file no open can read, even as root: a symlink to itself (ELOOP)."""
    path.symlink_to(path.name)


def lies_there(path: Path) -> bool:
    return os.path.lexists(path)


def built_then_removed(folder: Path, capsys: pytest.CaptureFixture) -> Path:
    """Where X's package goes: built once in the foreground, then removed."""
    make(folder)(X)
    (package,) = folder.glob("*.pt2")
    packages.remove_package(package)
    capsys.readouterr()
    return package


MARKERS: dict[str, Callable[[Path], None]] = {
    "bytes ff fe 00": lambda p: p.write_bytes(b"\xff\xfe\x00"),
    "a folder": a_folder,
    "unreadable": a_loop,
    "empty": lambda p: p.write_bytes(b""),
}


@pytest.mark.parametrize("marker_kind", MARKERS)
def test_a_marker_the_builder_did_not_write_is_one_line_then_eager_then_a_rebuild(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, marker_kind: str
) -> None:
    package = built_then_removed(tmp_path, capsys)
    marker = packages.failed_marker(package)
    MARKERS[marker_kind](marker)
    started = []
    monkeypatch.setattr(builder, "start_builder", started.append)
    tiered = make(tmp_path, background=True)
    for _ in range(2):
        assert torch.equal(tiered(X)[0], 2 * X)
        assert not tiered.ran_compiled  # eager while the builder builds
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert str(marker) in lines[0] and "removed" in lines[0], lines
    assert "in the background" in lines[1], lines
    assert not lies_there(marker) and started == [tmp_path]
    builder.build_queue(tmp_path)  # the builder's turn
    assert torch.equal(tiered(X)[0], 2 * X) and tiered.ran_compiled  # the package took over


def double_at_width(x: torch.Tensor, num_speculative_tokens: int) -> tuple:
    return (2 * x,)


def test_a_garbage_marker_of_a_sibling_width_is_one_line_and_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """A round expecting several widths (an adaptive call) asks for its other widths' graphs
    too (sibling_kwargs), after reading their markers: a garbage one does not keep its graph
    out of the request."""
    models = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    tiered = AheadOfTime(double_at_width, models, "test", tmp_path, "round", background=True)
    tiered.expect((2, 4))
    flat, spec = [*tiered.buffers().values(), X], tree_flatten((X,))[1]
    sibling = tiered.paths(flat, spec, {"num_speculative_tokens": 4})[0]
    marker = packages.failed_marker(sibling)
    marker.parent.mkdir(parents=True, exist_ok=True)
    marker.write_bytes(b"\xff\xfe\x00")
    monkeypatch.setattr(builder, "start_builder", lambda folder: None)
    assert torch.equal(tiered(X, num_speculative_tokens=2)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and str(marker) in lines[0] and "K = 2, 4" in lines[1], lines
    assert not lies_there(marker) and sibling in tiered.requested


@pytest.mark.parametrize("marker_kind", MARKERS)
def test_read_marker_names_a_marker_the_builder_did_not_write(
    tmp_path: Path, marker_kind: str
) -> None:
    package = tmp_path / "graph.pt2"
    assert packages.read_marker(package) is None  # none: no build failed
    packages.failed_marker(package).write_text("OSError: a compiler error\n")
    assert packages.read_marker(package) == "OSError: a compiler error"
    packages.clear(packages.failed_marker(package))
    MARKERS[marker_kind](packages.failed_marker(package))
    with pytest.raises(ValueError, match=str(packages.failed_marker(package))):
        packages.read_marker(package)
    packages.clear(packages.failed_marker(package))
    assert not lies_there(packages.failed_marker(package))


PACKAGE_FILES = (".pt2", ".spec", ".json")


@pytest.mark.parametrize("suffix", PACKAGE_FILES)
@pytest.mark.parametrize("kind", ["a folder", "unreadable"])
def test_a_package_file_that_is_a_folder_or_unreadable_is_one_line_then_rebuilt(
    tmp_path: Path, capsys, suffix: str, kind: str
) -> None:
    make(tmp_path)(X)
    (package,) = tmp_path.glob("*.pt2")
    bad = package.with_suffix(suffix)
    bad.unlink()
    (a_folder if kind == "a folder" else a_loop)(bad)
    capsys.readouterr()
    second = make(tmp_path)
    assert torch.equal(second(X)[0], 2 * X)
    assert second.exports == 1  # rebuilt
    assert packages.check_package(package) is None
    lines = [line for line in capsys.readouterr().err.splitlines() if "rebuilding" in line]
    assert len(lines) == 1 and bad.name in lines[0], lines


def test_a_package_that_is_a_folder_is_asked_for_again_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    make(tmp_path)(X)
    (package,) = tmp_path.glob("*.pt2")
    package.unlink()
    a_folder(package)
    capsys.readouterr()
    started = []
    monkeypatch.setattr(builder, "start_builder", started.append)
    tiered = make(tmp_path, background=True)
    assert torch.equal(tiered(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and str(package) in lines[0] and "background" in lines[1], lines
    assert started == [tmp_path] and not package.exists()
    builder.build_queue(tmp_path)
    assert torch.equal(tiered(X)[0], 2 * X) and tiered.ran_compiled


def test_a_request_that_is_a_folder_is_dropped_and_the_next_one_built(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    (tmp_path / "requests").mkdir()
    a_folder(tmp_path / "requests" / "1-1.pt")  # oldest: the builder meets it first
    monkeypatch.setattr(builder, "start_builder", lambda folder: None)
    tiered = make(tmp_path, background=True)
    tiered(X)  # queues a good request after it
    assert builder.main([str(tmp_path)]) == 0
    assert not list((tmp_path / "requests").iterdir())
    assert torch.equal(tiered(X)[0], 2 * X) and tiered.ran_compiled


def test_prune_removes_a_stale_temporary_folder_and_skips_an_unreadable_package(
    tmp_path: Path,
) -> None:
    a_folder(tmp_path / "graph.1.tmp.pt2")
    a_loop(tmp_path / "loop.pt2")
    packages.prune(tmp_path, stale=-1)
    assert not lies_there(tmp_path / "graph.1.tmp.pt2")


FULL_DISK: dict[str, Callable[[], BaseException]] = {
    "ENOSPC": lambda: OSError(errno.ENOSPC, os.strerror(errno.ENOSPC)),
    "the zip writer": lambda: RuntimeError(ZIP_WRITER),
    "the zip writer, in Inductor's error": lambda: inductor_error(RuntimeError(ZIP_WRITER)),
}


def inductor_error(inner: BaseException) -> BaseException:
    from torch._inductor.exc import InductorError

    return InductorError(inner, None)


@pytest.mark.parametrize("failure", FULL_DISK)
def test_no_space_finds_a_full_disk_and_only_that(failure: str) -> None:
    assert packages.no_space(FULL_DISK[failure]()) == "no space left on device"
    try:
        try:
            raise FULL_DISK[failure]()
        except Exception as inner:
            raise RuntimeError("a wrapper's own words") from inner
    except RuntimeError as outer:
        assert packages.no_space(outer) == "no space left on device"
    assert packages.no_space(RuntimeError("a compiler error")) is None
    assert packages.no_space(OSError(errno.EACCES, "Permission denied")) is None


def full_disk_compile(failure: str, calls: list) -> Callable:
    def compile_package(program, package_path: Path, options: dict) -> None:
        calls.append(package_path)
        Path(package_path).write_bytes(b"partial")
        raise FULL_DISK[failure]()

    return compile_package


@pytest.mark.parametrize("failure", FULL_DISK)
def test_a_full_disk_in_aot_mode_is_one_line_then_eager(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, failure: str
) -> None:
    """compile="aot" on a full disk: the compile line ends, one line says the disk is full,
    and every call runs eagerly without trying to compile again."""
    calls: list = []
    monkeypatch.setattr(packages, "compile_package", full_disk_compile(failure, calls))
    aot = make(tmp_path)
    for x in (X, X, X4):
        assert torch.equal(aot(x)[0], 2 * x)
    assert aot.exports == 0 and len(calls) == 1
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 2 and lines[0].startswith("  compiling"), lines
    assert "no space left on device" in lines[1] and str(tmp_path) in lines[1], lines
    assert "eagerly" in lines[1] and "enforce fail" not in err, lines
    assert [p.name for p in tmp_path.iterdir()] == []  # nothing half-written stays


@pytest.mark.parametrize("failure", ["ENOSPC", "the zip writer"])
def test_a_full_disk_writing_a_request_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, failure: str
) -> None:
    def save(obj, path) -> None:
        Path(path).write_bytes(b"partial")
        raise FULL_DISK[failure]()

    monkeypatch.setattr(builder.torch, "save", save)
    monkeypatch.setattr(builder, "start_builder", lambda folder: None)
    tiered = make(tmp_path, background=True)
    assert torch.equal(tiered(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "no space left on device" in lines[0], lines
    assert "enforce fail" not in lines[0] and str(tmp_path) in lines[0], lines


def test_a_full_disk_in_the_builder_is_said_by_the_next_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    monkeypatch.setattr(packages, "compile_package", full_disk_compile("the zip writer", []))
    monkeypatch.setattr(builder, "start_builder", lambda folder: None)
    make(tmp_path, background=True)(X)
    builder.build_queue(tmp_path)  # fails, and leaves its marker
    capsys.readouterr()
    later = make(tmp_path, background=True)
    assert torch.equal(later(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "no space left on device" in lines[0], lines
    assert "enforce fail" not in lines[0], lines


@pytest.mark.parametrize("failure", FULL_DISK)
def test_a_full_disk_under_torch_compile_is_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, failure: str
) -> None:
    """compile=True (and CUDA): Inductor's error becomes one OSError whose line (as the front
    door prints it) says the disk is full and which compile cache it was writing."""
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(tmp_path))

    def compiled(x: torch.Tensor) -> torch.Tensor:
        raise FULL_DISK[failure]()

    with pytest.raises(OSError) as caught:
        Announced(compiled, "round")(X)
    line = one_line(caught.value)
    assert "no space left on device" in line and str(tmp_path) in line, line
    assert "\n" not in line and "enforce fail" not in line, line
    assert capsys.readouterr().err.endswith("\n")  # the compile line was ended


@pytest.mark.parametrize("background", [False, True])
def test_a_compile_cache_under_a_file_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, background: bool
) -> None:
    file = tmp_path / "file"
    file.write_text("x")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(file / "cache"))
    aot = make(packages.aot_folder(), background)
    assert torch.equal(aot(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "compile cache" in lines[0] and str(file) in lines[0], lines
    assert "TORCHINDUCTOR_CACHE_DIR" in lines[0], lines


@pytest.mark.parametrize("niceness", ["²", "①", "1_0"])
def test_a_niceness_of_other_digits_names_the_variable(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, niceness: str
) -> None:
    """Characters str.isdigit takes but int() does not: still the variable's one line."""
    monkeypatch.setenv("MINISPEC_BUILDER_NICENESS", niceness)
    with pytest.raises(ValueError, match="MINISPEC_BUILDER_NICENESS"):
        builder.builder_niceness()
    monkeypatch.setattr(builder, "start_builder", lambda folder: None)
    assert torch.equal(make(tmp_path, background=True)(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "MINISPEC_BUILDER_NICENESS" in lines[0], lines


REFERENCES: dict[str, bytes] = {
    "corrupt JSON": b'{"settings": {',
    "not text": b"\xff\xfe\x00",
    "not a reference": b"[1, 2]",
    "a setting without its speedup": b'{"settings": {"T=0 K=4": {}}}',
}


@pytest.mark.parametrize("content", REFERENCES)
def test_a_bad_guard_reference_is_one_line_naming_it_before_measuring(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys, content: str
) -> None:
    reference = tmp_path / "guard.json"
    reference.write_bytes(REFERENCES[content])

    def measure(pairs: int) -> dict:
        raise AssertionError("measured before the reference was checked")

    monkeypatch.setattr(guard, "measure", measure)
    assert run(guard.main, ["--reference", str(reference)]) == 2
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and str(reference) in lines[0], lines


def test_gpu_check_without_torch_is_one_line() -> None:
    """A Python without torch (-S: no site-packages) gets one line and exit code 2."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    done = subprocess.run(
        [sys.executable, "-S", "-m", "benchmarks.gpu_check"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    lines = done.stderr.splitlines()
    assert done.returncode == 2 and len(lines) == 1, done.stderr
    assert lines[0].startswith("gpu-check needs a Python with torch and CUDA: "), lines


def test_a_request_that_cannot_be_removed_stops_the_builder(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys
) -> None:
    """Rather than build it again and again, forever, in the background."""
    (tmp_path / "requests").mkdir()
    a_folder(tmp_path / "requests" / "1-1.pt")
    taken = []
    monkeypatch.setattr(builder, "build_request", taken.append)
    monkeypatch.setattr(packages, "clear", lambda path: None)
    assert builder.main([str(tmp_path)]) == 0
    assert len(taken) == 1 and "cannot be removed" in capsys.readouterr().out


def test_jit_with_the_compile_cache_under_a_file_says_so(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """--compile-mode jit imports Dynamo, which makes the cache folder: refused first, in the
    compile cache's words, rather than as Dynamo's bare NotADirectoryError."""
    file = tmp_path / "file"
    file.write_text("x")
    monkeypatch.setenv("TORCHINDUCTOR_CACHE_DIR", str(file / "cache"))
    with pytest.raises(OSError, match="compile cache .* lies under the file .*TORCHINDUCTOR"):
        compile_round(lambda x: 2 * x, "round", True, torch.device("cpu"))
