"""Fault injection on the package cache (minispec/compilation/): a package
that is corrupt, truncated, empty, without its checksum or with a garbage .spec is never run:
it is removed and rebuilt, with one line saying so; an unwritable cache is one line naming it,
and the calls run eagerly; two processes building the same package both succeed and leave one
good package; the builder's lock and queue survive a busy lock and a bad request.

The AOTInductor compile is replaced by torch.export's saved program (run by torch's
interpreter) on a one-line function: these tests cost seconds. tests/test_aot.py compiles a
real package.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import minispec.compilation.builder
import minispec.compilation.packages
from minispec.compilation.aot import AheadOfTime
from minispec.compilation.packages import check_package


def double_plus_cache(x: torch.Tensor) -> tuple[torch.Tensor]:
    return (2 * x,)


def export_compile(program, package_path: Path, options: dict) -> None:
    torch.export.save(program, str(package_path))


def export_load(path: Path):
    module = torch.export.load(str(path)).module()
    return lambda flat: list(module(*flat))


@pytest.fixture(autouse=True)
def exported(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minispec.compilation.packages, "compile_package", export_compile)
    monkeypatch.setattr(minispec.compilation.packages, "load_runner", export_load)


def make(folder: Path, background: bool = False) -> AheadOfTime:
    models = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    torch.nn.init.constant_(models[0].weight, 0.5)  # the same weights: the same package name
    torch.nn.init.constant_(models[0].bias, 0.0)
    return AheadOfTime(double_plus_cache, models, "test", folder, "double", background)


X = torch.arange(3.0)


def zero_a_tenth(package: Path) -> None:
    data = bytearray(package.read_bytes())
    start = len(data) // 2
    data[start : start + len(data) // 10] = bytes(len(data) // 10)
    package.write_bytes(bytes(data))


CORRUPTIONS = {
    "a tenth zeroed": zero_a_tenth,
    "truncated": lambda p: p.write_bytes(p.read_bytes()[: p.stat().st_size // 2]),
    "empty": lambda p: p.write_bytes(b""),
    "garbage .spec": lambda p: p.with_suffix(".spec").write_bytes(b"not a pickle"),
    "no checksum": lambda p: p.with_suffix(".json").unlink(),
    "garbage checksum": lambda p: p.with_suffix(".json").write_text("[1, 2"),
}


@pytest.mark.parametrize("corruption", CORRUPTIONS)
def test_a_bad_package_is_removed_and_rebuilt(tmp_path: Path, capsys, corruption: str) -> None:
    first = make(tmp_path)
    assert torch.equal(first(X)[0], 2 * X)
    (package,) = tmp_path.glob("*.pt2")
    assert check_package(package) is None
    CORRUPTIONS[corruption](package)
    assert check_package(package) is not None
    capsys.readouterr()

    second = make(tmp_path)  # a new process's: it loads from disk
    assert torch.equal(second(X)[0], 2 * X)
    assert second.exports == 1  # rebuilt
    assert check_package(package) is None
    lines = [line for line in capsys.readouterr().err.splitlines() if "package" in line]
    assert len(lines) == 1 and str(package) in lines[0] and "rebuilding" in lines[0], lines


def test_a_good_package_loads_without_a_rebuild(tmp_path: Path, capsys) -> None:
    """The check's other side: an intact package is loaded, silently."""
    make(tmp_path)(X)
    capsys.readouterr()
    second = make(tmp_path)
    assert torch.equal(second(X)[0], 2 * X)
    assert second.exports == 0 and capsys.readouterr().err == ""


def test_a_bad_package_is_asked_for_again_in_the_background(tmp_path: Path, monkeypatch) -> None:
    """compile="auto": the bad package is removed, the call runs eagerly, and a builder is
    asked for it again."""
    make(tmp_path)(X)
    (package,) = tmp_path.glob("*.pt2")
    package.write_bytes(b"")
    started = []
    monkeypatch.setattr(minispec.compilation.builder, "start_builder", started.append)
    tiered = make(tmp_path, background=True)
    assert torch.equal(tiered(X)[0], 2 * X)  # eager
    assert not package.exists() and started == [tmp_path]
    assert len(list((tmp_path / "requests").glob("*.pt"))) == 1


def unwritable_folder(tmp_path: Path) -> Path:
    """A folder no file can be created in: read-only by its mode, or, for root (whom modes do
    not stop), one in sysfs, which refuses new entries."""
    if os.geteuid() == 0:
        return Path("/sys/fs/minispec-aot")
    folder = tmp_path / "cache"
    folder.mkdir()
    folder.chmod(0o500)
    return folder


@pytest.mark.parametrize("background", [False, True])
def test_an_unwritable_cache_is_one_line_then_eager(tmp_path: Path, capsys, background) -> None:
    folder = unwritable_folder(tmp_path)
    aot = make(folder, background)
    for _ in range(3):
        assert torch.equal(aot(X)[0], 2 * X)
    assert aot.exports == 0
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and str(folder) in lines[0] and "eagerly" in lines[0], lines


TWO_BUILDERS = """
import sys, time
from pathlib import Path
import torch
sys.path.insert(0, {tests!r})
import minispec.compilation.packages
import test_package_integrity as t

def slow_compile(program, package_path, options):
    time.sleep(1.0)  # both processes are inside the build at once
    t.export_compile(program, package_path, options)

minispec.compilation.packages.compile_package = slow_compile
minispec.compilation.packages.load_runner = t.export_load
print(t.make(Path({folder!r}))(t.X)[0].tolist())
"""


def test_two_processes_building_one_package(tmp_path: Path) -> None:
    script = TWO_BUILDERS.format(tests=str(Path(__file__).parent), folder=str(tmp_path))
    procs = [
        subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0]
    assert outputs == ["[0.0, 2.0, 4.0]\n"] * 2
    (package,) = tmp_path.glob("*.pt2")
    assert check_package(package) is None
    assert not [p for p in tmp_path.iterdir() if ".tmp" in p.name]  # nothing half-written


def test_a_busy_lock_leaves_the_queue_to_its_builder(tmp_path: Path) -> None:
    """A second builder exits at once while another holds the lock, and the queue stays."""
    (tmp_path / "requests").mkdir()
    request = tmp_path / "requests" / "1-1.pt"
    request.write_bytes(b"queued")
    with open(tmp_path / "builder.lock", "a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        assert minispec.compilation.builder.builder_running(tmp_path)
        assert minispec.compilation.builder.main([str(tmp_path)]) == 0
        assert request.exists()
    assert not minispec.compilation.builder.builder_running(tmp_path)


def test_a_bad_request_is_logged_and_dropped(tmp_path: Path, capsys) -> None:
    """A request that cannot be read (a killed writer would leave only a .tmp, but a foreign
    file may sit there) is logged and removed, and the builder goes on to the next one."""
    (tmp_path / "requests").mkdir()
    bad = tmp_path / "requests" / "1-1.pt"
    bad.write_bytes(b"not a request")
    aot = make(tmp_path, background=True)
    started = []
    minispec_start = minispec.compilation.builder.start_builder
    try:
        minispec.compilation.builder.start_builder = started.append
        aot(X)  # queues a good request after the bad one
    finally:
        minispec.compilation.builder.start_builder = minispec_start
    assert started == [tmp_path]
    assert minispec.compilation.builder.main([str(tmp_path)]) == 0
    assert not list((tmp_path / "requests").iterdir())
    assert "Traceback" in capsys.readouterr().err  # the bad one, in the builder's log
    assert torch.equal(aot(X)[0], 2 * X)
    assert aot.compiled_last  # the good one was built, and is now in use


def test_two_packages_swapped_between_names_are_rebuilt(tmp_path: Path, capsys) -> None:
    """Each package, manifest and .spec renamed to the other's name still matches its own
    checksum; the manifest's graph name tells it from the package that belongs there."""
    make(tmp_path)(X)
    make(tmp_path)(torch.arange(4.0))  # another shape: another graph, another package
    first, second = sorted(tmp_path.glob("*.pt2"))
    for suffix in (".pt2", ".spec", ".json"):
        a, b = first.with_suffix(suffix), second.with_suffix(suffix)
        a.rename(tmp_path / "swap"), b.rename(a), (tmp_path / "swap").rename(b)
    assert "another graph" in check_package(first) and "another graph" in check_package(second)
    capsys.readouterr()
    again = make(tmp_path)
    assert torch.equal(again(X)[0], 2 * X) and torch.equal(again(X4)[0], 2 * X4)
    assert again.exports == 2


X4 = torch.arange(4.0)


@pytest.mark.parametrize("niceness", ["abc", "", "99999999999999999999", "-3"])
def test_a_bad_builder_niceness_is_one_line_and_writes_nothing(
    tmp_path: Path, monkeypatch, capsys, niceness: str
) -> None:
    """A niceness the builder cannot use is refused in the run, in one line naming the
    variable, before any request is written: nothing accumulates run after run."""
    monkeypatch.setenv("MINISPEC_BUILDER_NICENESS", niceness)
    started = []
    monkeypatch.setattr(minispec.compilation.builder, "start_builder", started.append)
    tiered = make(tmp_path, background=True)
    assert torch.equal(tiered(X)[0], 2 * X)  # eager
    assert torch.equal(tiered(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "MINISPEC_BUILDER_NICENESS" in lines[0], lines
    assert started == [] and not list(tmp_path.rglob("*.pt")) and not list(tmp_path.rglob("*.tmp"))


def test_a_request_that_cannot_be_written_is_one_line(tmp_path: Path, monkeypatch, capsys) -> None:
    """torch.save on a full disk raises RuntimeError (an 'enforce fail' from its zip writer),
    not OSError: it is the cache's one line too, and no temporary file stays behind."""

    def full_disk(obj, path) -> None:
        Path(path).write_bytes(b"partial")
        raise RuntimeError("[enforce fail at inline_container.cc:672] . unexpected pos 64 vs 0")

    monkeypatch.setattr(minispec.compilation.builder.torch, "save", full_disk)
    monkeypatch.setattr(minispec.compilation.builder, "start_builder", lambda folder: None)
    tiered = make(tmp_path, background=True)
    assert torch.equal(tiered(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and "cannot write the package cache" in lines[0], lines
    assert not list(tmp_path.rglob("*.tmp")) and not list(tmp_path.rglob("*.pt"))


def test_a_build_that_failed_is_not_asked_for_again(tmp_path: Path, monkeypatch, capsys) -> None:
    """A builder that fails (a full disk mid-compile) leaves a marker; the next runs say so
    in one line and stay eager instead of queueing the same failing build every time."""

    def no_space(program, package_path: Path, options: dict) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(minispec.compilation.packages, "compile_package", no_space)
    monkeypatch.setattr(minispec.compilation.builder, "start_builder", lambda folder: None)
    make(tmp_path, background=True)(X)  # queues the request
    minispec.compilation.builder.build_queue(tmp_path)  # the builder fails, and says so
    assert len(list(tmp_path.glob("*.failed"))) == 1
    capsys.readouterr()
    for _ in range(2):  # two later runs
        later = make(tmp_path, background=True)
        assert torch.equal(later(X)[0], 2 * X)
        assert torch.equal(later(X)[0], 2 * X)
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2 and all("failed in the background" in line for line in lines), lines
    assert not list((tmp_path / "requests").glob("*.pt"))
