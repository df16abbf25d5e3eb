"""The package files on disk: where they live, how one is compiled and loaded, and how the
folder stays sound and small.

A package is three files with one name: the AOTInductor package (.pt2), its outputs' structure
(.spec, a pickled TreeSpec) and its manifest (.json: a checksum of the other two and how long
the build took). A package is loaded only if its checksum matches, so a torn, truncated or
foreign file is removed and rebuilt rather than run. The folder keeps the packages used last.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
import time
import warnings
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import torch

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds minispec/, model/, sampling/
SOURCE_FOLDERS = ("minispec", "model", "sampling")  # the code a round runs


@lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of every Python file a round may run, so that a package never outlives its code."""
    digest = hashlib.sha256()
    for path in sorted(p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def aot_folder() -> Path:
    """Where the packages live: inside Inductor's cache folder ($TORCHINDUCTOR_CACHE_DIR, or
    Inductor's default), so that clearing that cache clears them too. Inductor is asked only
    when the variable is unset: importing it imports Dynamo, a second of a warm start."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        folder = cache_dir()
    return Path(folder) / "minispec-aot"


def compile_package(program, package_path: Path, options: dict) -> None:
    """AOTInductor: the exported program as C++, compiled into a package at package_path.
    Imported here: only a process that compiles pays for Inductor's import."""
    from torch._inductor import aoti_compile_and_package

    aoti_compile_and_package(program, package_path=str(package_path), inductor_configs=options)


def load_runner(path: Path) -> Callable:
    """The package's model, run by AOTInductor's C++ loader, called directly:
    torch._inductor.aoti_load_package wraps the same object but imports Inductor and Dynamo
    first (docs/startup.md: what that costs a warm start), and its call adds a pytree round
    trip per round.
    Arguments: the model's name inside the package, one runner, not single-threaded, the
    default device."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1).boxed_run


def package_digest(package: Path, spec: Path) -> str:
    """sha256 of a package and its .spec."""
    digest = hashlib.sha256()
    for part in (package, spec):
        with open(part, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def write_manifest(package: Path, spec: Path, graph: str, seconds: float, cpu: float) -> None:
    """Beside the package (same name, .json): the graph it holds (its package name, which
    hashes everything the code depends on), its checksum, and how long it took to build, in
    wall seconds and in CPU seconds (the C++ compiler's included)."""
    manifest = {"graph": graph, "sha256": package_digest(package, spec)}
    manifest["seconds"] = round(seconds, 1)
    manifest["cpu_seconds"] = round(cpu, 1)
    package.with_suffix(".json").write_text(json.dumps(manifest))


def cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the C++ compiler)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def read_manifest(package: Path) -> dict:
    """The package's manifest; {} if missing or unreadable."""
    try:
        manifest = json.loads(package.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def check_package(package: Path) -> str | None:
    """Why the package must not be loaded (a corrupt, truncated or empty file, a .spec or
    manifest missing or changed, another graph's files under this name), or None: its
    checksum matches the one written with it, for this graph."""
    manifest = read_manifest(package)
    expected = manifest.get("sha256")
    if expected is None:
        return "has no readable checksum"
    if manifest.get("graph") != package.stem:
        return f"holds another graph ({str(manifest.get('graph'))[:12]}...)"
    try:
        actual = package_digest(package, package.with_suffix(".spec"))
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    return None if actual == expected else "does not match its checksum (corrupt or truncated)"


def failed_marker(package: Path) -> Path:
    """Where the builder says that building `package` failed (its error's first line): a run
    then stays eager instead of asking for the same failing build again."""
    return package.with_suffix(".failed")


def remove_package(package: Path) -> None:
    for suffix in (".pt2", ".spec", ".json", ".failed"):
        with suppress(OSError):
            package.with_suffix(suffix).unlink(missing_ok=True)


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in `folder` (made if missing), or None if they can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def cache_off_line(folder: Path, reason: str) -> str:
    return f"  cannot write the package cache {folder} ({reason}): running eagerly, uncached"


# Every code change or other checkpoint makes new packages (each with its own copy of the
# weights) and leaves the old ones unused: the folder keeps the ones used last.
KEEP_PACKAGES = 64
# A temporary file this old belongs to a build that died: a build takes minutes, not an hour.
STALE_SECONDS = 3600


def prune(folder: Path, keep: int = KEEP_PACKAGES, stale: float = STALE_SECONDS) -> None:
    """Delete all but the `keep` packages used last (a load touches its package), with their
    .spec and manifest, and the temporary files of builds that died (older than `stale`
    seconds). A package another process is loading stays readable: it holds the file open."""
    used, now = {}, time.time()
    for path in folder.glob("*"):
        with suppress(FileNotFoundError):  # another process pruned it first
            if ".tmp" in path.name:
                if now - path.stat().st_mtime > stale:
                    path.unlink(missing_ok=True)
            elif path.suffix == ".pt2":
                used[path] = path.stat().st_mtime
    for old in sorted(used, key=used.get, reverse=True)[keep:]:
        remove_package(old)


@contextmanager
def quiet_treespecs() -> Iterator[None]:
    """Around export and around pickling a TreeSpec (torch's treespec_dumps cannot write one
    with a NamedTuple in it, LoopState): both touch a LeafSpec check inside torch that warns it
    is deprecated, which says nothing to the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield
