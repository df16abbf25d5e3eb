"""The package files on disk: where they live, how one is compiled and loaded, and how the
folder stays sound and small.

A package is three files with one name: the AOTInductor package (.pt2), its outputs' structure
(.spec, a pickled TreeSpec) and its manifest (.json: a checksum of the other two and how long
the build took). A package is loaded only if its checksum matches, so a torn, truncated or
foreign file is removed and rebuilt rather than run. The folder keeps the packages used last.

Any file here may be garbage, a folder or unreadable (another program, a user, a disk): a run
says so in one line naming it, removes it (clear) and builds its package again, never a
traceback. A write that finds the disk full is said as such (no_space), whichever writer met it.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
import stat
import tempfile
import time
import warnings
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import BinaryIO, Callable, Iterator

import torch

from minispec.compilation import huge_pages

ROOT = Path(__file__).resolve().parents[2]  # the folder that holds minispec/, model/, sampling/
SOURCE_FOLDERS = ("minispec", "model", "sampling")  # the code a round runs
CACHE_VARIABLE = "TORCHINDUCTOR_CACHE_DIR"  # Inductor's cache folder, and so the packages'


@lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of every Python file a round may run, so that a package never outlives its code."""
    digest = hashlib.sha256()
    for path in sorted(p for folder in SOURCE_FOLDERS for p in (ROOT / folder).rglob("*.py")):
        digest.update(str(path.relative_to(ROOT)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def compile_cache() -> Path:
    """Inductor's cache folder: $TORCHINDUCTOR_CACHE_DIR, or Inductor's default. Inductor is
    asked only when the variable is unset: importing it imports Dynamo, a second of a warm
    start. Its default_cache_dir, not its cache_dir, which makes the folder: a folder that
    cannot be made is said by unwritable, in one line, not raised here."""
    folder = os.environ.get(CACHE_VARIABLE)
    if not folder:
        from torch._inductor.runtime.cache_dir_utils import default_cache_dir

        folder = default_cache_dir()
    return Path(folder)


def aot_folder() -> Path:
    """The packages' folder, inside Inductor's cache: clearing that cache clears them too."""
    return compile_cache() / "minispec-aot"


def compile_package(program, package_path: Path, options: dict) -> None:
    """AOTInductor: the exported program as C++, compiled into a package at package_path.
    Imported here: only a process that compiles pays for Inductor's import."""
    from torch._inductor import aoti_compile_and_package

    aoti_compile_and_package(program, package_path=str(package_path), inductor_configs=options)


def load_runner(path: Path) -> Callable:
    """The package's model, run by AOTInductor's C++ loader directly (docs/startup.md says why)."""
    # Arguments: the model's name inside the package, not single-threaded, one runner, the
    # default device. The loader copies the package's weights into memory it maps.
    with huge_pages.new_memory_on_huge_pages():
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
    return loader.boxed_run


def open_regular(path: Path) -> BinaryIO:
    """`path` opened for reading; OSError naming it if it is not a regular file. Opened
    without blocking, then looked at: a folder opens (and would fail only at the read, with a
    message naming nothing), and a pipe's read would wait forever for a writer."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    mode = os.fstat(fd).st_mode
    if not stat.S_ISREG(mode):
        os.close(fd)
        folder = stat.S_ISDIR(mode)
        reason = "is a folder" if folder else "is not a regular file"
        raise OSError(errno.EISDIR if folder else errno.EINVAL, reason, str(path))
    return os.fdopen(fd, "rb")


def reason_of(error: OSError) -> str:
    """An OSError as a reason, naming its file: "abc.spec: is a folder"."""
    reason = error.strerror or str(error)
    return f"{Path(error.filename).name}: {reason}" if error.filename else reason


def present(path: Path) -> bool:
    """Whether anything lies at `path`, a dangling link too (Path.exists would leave it there)."""
    return os.path.lexists(path)


def package_digest(package: Path, spec: Path) -> str:
    """sha256 of a package and its .spec."""
    digest = hashlib.sha256()
    for part in (package, spec):
        with open_regular(part) as f:
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


def manifest_and_problem(package: Path) -> tuple[dict, str | None]:
    """The package's manifest and None, or {} and what is wrong with it, naming it."""
    path = package.with_suffix(".json")
    try:
        with open_regular(path) as f:
            manifest = json.loads(f.read())
    except OSError as error:
        return {}, reason_of(error)
    except ValueError:  # not JSON, or not text (UnicodeDecodeError)
        return {}, f"{path.name}: not JSON"
    if not isinstance(manifest, dict):
        return {}, f"{path.name}: not a manifest"
    return manifest, None


def read_manifest(package: Path) -> dict:
    """The package's manifest; {} if missing or unreadable."""
    return manifest_and_problem(package)[0]


def check_package(package: Path) -> str | None:
    """Why the package must not be loaded (a corrupt, truncated or empty file, a .spec or
    manifest missing, changed, a folder or unreadable, another graph's files under this name),
    naming the file at fault, or None: its checksum matches the one written with it, for this
    graph."""
    manifest, problem = manifest_and_problem(package)
    expected = manifest.get("sha256")
    if expected is None:
        return f"has no readable checksum ({problem or 'none in its manifest'})"
    if manifest.get("graph") != package.stem:
        return f"holds another graph ({str(manifest.get('graph'))[:12]}...)"
    try:
        actual = package_digest(package, package.with_suffix(".spec"))
    except OSError as error:
        return f"cannot be read ({reason_of(error)})"
    return None if actual == expected else "does not match its checksum (corrupt or truncated)"


def failed_marker(package: Path) -> Path:
    """The file where the builder says building `package` failed (docs/reliability.md)."""
    return package.with_suffix(".failed")


def read_marker(package: Path) -> str | None:
    """The first line of the error the builder met building `package` (its marker), or None
    if it left none. ValueError naming the marker if the builder did not write it: not a
    regular file, unreadable, not text, or empty (the builder writes at least the error's
    name)."""
    marker = failed_marker(package)
    try:
        with open_regular(marker) as f:
            reason = f.read().decode().strip()
    except (FileNotFoundError, NotADirectoryError):  # none, or no folder to hold one
        return None
    except OSError as error:
        problem = error.strerror or str(error)
    except UnicodeDecodeError:
        problem = "not text"
    else:
        if reason:
            return reason
        problem = "empty"
    raise ValueError(f"{marker} is not a builder's note ({problem})")


def clear(path: Path) -> None:
    """Remove whatever lies at `path`: a file, a link, or a folder in the place of one of
    the cache's files. What cannot be removed stays, and its next check finds it again."""
    with suppress(OSError):
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path)
        else:
            path.unlink(missing_ok=True)


def remove_package(package: Path) -> None:
    for suffix in (".pt2", ".spec", ".json", ".failed"):
        clear(package.with_suffix(suffix))


def under_a_file(folder: Path) -> Path | None:
    """The file (not a folder) at `folder` or above it that keeps `folder` from being made,
    or None if there is none."""
    for path in (folder, *folder.parents):
        if present(path):
            return None if path.is_dir() else path
    return None


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in `folder` (made if missing), or None if they can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        if (file := under_a_file(folder)) is not None:
            return f"the compile cache lies under the file {file}; {CACHE_VARIABLE} moves it"
        return no_space(error) or reason_of(error)
    return None


# A short write, where the zip writer behind torch.save and AOTInductor's packages checks that
# the bytes it wrote are all there ("[enforce fail at inline_container.cc:672] . unexpected pos
# 4499584 vs 4499472"): what a full disk does to it, in its own words.
SHORT_WRITE = "unexpected pos"


def no_space(error: BaseException) -> str | None:
    """The words "no space left on device" if `error`, or an error it wraps (Inductor's and Dynamo's
    wrappers keep theirs in inner_exception), says a write found the disk full: an ENOSPC
    OSError, the zip writer's short write, or a message quoting either (a C++ compiler's
    output). None for any other error."""
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        message = str(error)
        full = isinstance(error, OSError) and error.errno == errno.ENOSPC
        if full or SHORT_WRITE in message or os.strerror(errno.ENOSPC) in message:
            return "no space left on device"
        error = getattr(error, "inner_exception", None) or error.__cause__ or error.__context__
    return None


def write_problem(error: BaseException) -> str:
    """Why a write to the cache failed, as cache_off_line's reason."""
    if (full := no_space(error)) is not None:
        return full
    return reason_of(error) if isinstance(error, OSError) else str(error)


def compile_cache_problem(error: BaseException) -> str | None:
    """Why a compile failed, in words naming the compile cache, if the cause is the cache's:
    a full disk, or the cache folder under a file. None for another failure."""
    folder = compile_cache()
    if (full := no_space(error)) is not None:
        return f"{full} (the compile cache is {folder})"
    if (file := under_a_file(folder)) is not None:
        return f"the compile cache {folder} lies under the file {file}; {CACHE_VARIABLE} moves it"
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
        # Gone (another process pruned it first) or not to be read (a link to nowhere): its
        # own check removes it when its graph is asked for.
        with suppress(OSError):
            if ".tmp" in path.name:
                if now - path.lstat().st_mtime > stale:
                    clear(path)
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
