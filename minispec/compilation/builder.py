"""The background builder: a round runs at once, eagerly, while a separate process compiles it;
the compiled round takes over at a round boundary once its package is on disk (aot.py's
AheadOfTime, with background=True, is the decoder's side).

Dynamo and Inductor are not thread-safe, so the compile runs in a process of its own,
`python -m minispec.compilation.builder FOLDER`: niced, on one thread, so that it leaves the
decoding core alone. A decoder asks for packages by writing a request into FOLDER/requests (the
round function with its models, the example arguments, and each package's path and static
arguments, in the order the run needs them) and starting the builder unless one runs. The
builder takes the requests oldest first, under a lock: two runs started together share one
builder. A package is written under a temporary name and renamed, so a builder that is killed
leaves nothing torn, and its request stays queued for the next builder, which the next run
starts. The builder is detached from the run that starts it: a package it has not finished
when the run ends is there for the next run.

Reproducibility: a tier is another program for the same round (PyTorch's eager kernels, or
Inductor's C++), so the two may round floats differently, and a seeded run whose tier
switches mid-request may, rarely, sample another token where two are within rounding of a
draw's threshold. The same seed and settings give the same tokens in the same tier;
compile="aot" (always compiled, waiting for the compile) or compile=False (always eager)
fixes the tier, for bitwise-repeatable output.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
import time
import traceback
from contextlib import suppress
from pathlib import Path
from typing import Callable

import torch
from torch.utils._pytree import tree_flatten

from minispec.compilation import export, packages

NICENESS = 10  # below the decoding process, which runs at the default 0


def request_build(
    folder: Path,
    fn: Callable,
    models: torch.nn.Module,
    options: dict,
    dynamic: str | None,
    args: tuple,
    todo: list[tuple],
) -> None:
    """Queue `todo` ((package path, static arguments) pairs, in the order wanted) for a builder,
    with what rebuilds the calls: the function, its models, Inductor's options, the name of the
    argument whose length the package leaves dynamic, and `args`, the example inputs (a copy of
    them as they are now, the models' buffers included). Then start a builder unless one runs.
    Raises OSError if the folder cannot be written, ValueError if the builder's niceness setting
    is not one it can use (nothing is written then)."""
    builder_niceness()  # checked here, where the run can say so, not in the builder's log
    requests = folder / "requests"
    requests.mkdir(parents=True, exist_ok=True)
    request = {
        "fn": fn,
        "models": models,
        "options": options,
        "dynamic": dynamic,
        "args": args,
        "todo": [(str(path), kwargs) for path, kwargs in todo],
        "threads": torch.get_num_threads(),  # Inductor bakes it into the parallel loops
        "source": packages.source_hash(),
        "torch": torch.__version__,
    }
    name = f"{time.time_ns()}-{os.getpid()}"
    temp = requests / f"{name}.tmp"
    try:
        torch.save(request, temp)
        os.replace(temp, requests / f"{name}.pt")  # named by time: the builder's order
    except RuntimeError as error:  # torch.save's own error for a write that failed (full disk)
        first = (str(error).strip().splitlines() or ["?"])[0][:80]
        raise OSError(f"a build request could not be written: {first}") from None
    finally:
        temp.unlink(missing_ok=True)
    if not builder_running(folder):
        start_builder(folder)


def builder_running(folder: Path) -> bool:
    """Whether a builder holds the folder's lock. The request is written before this is asked,
    and a builder looks for requests again after it lets the lock go: either this sees the
    lock held, or that builder sees the request."""
    with open(folder / "builder.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            return True
        fcntl.flock(lock, fcntl.LOCK_UN)
    return False


def start_builder(folder: Path) -> None:
    """`python -m minispec.compilation.builder folder`, detached (its own session: Ctrl-C on the
    run leaves it building), its output appended to folder/builder.log."""
    env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1"}  # no pool of compile workers
    # The builder imports minispec from where this run does.
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(packages.ROOT), env.get("PYTHONPATH")]))
    with open(folder / "builder.log", "ab") as log:
        subprocess.Popen(
            [sys.executable, "-m", "minispec.compilation.builder", str(folder)],
            stdin=subprocess.DEVNULL,
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )


def queued(folder: Path) -> list[Path]:
    """The folder's requests, oldest first."""
    return sorted((folder / "requests").glob("*.pt"))


def build_request(request_path: Path) -> None:
    """Build every package of one request that is not on disk (or fails its check). A request
    from other code (minispec's source or torch changed since) is dropped: its packages' names
    would not say what they hold."""
    with packages.quiet_treespecs():
        request = torch.load(request_path, weights_only=False)  # written by a run, for us
    if (request["source"], request["torch"]) != (packages.source_hash(), torch.__version__):
        print(f"dropped {request_path.name}: written by other code", flush=True)
        return
    torch.set_num_threads(request["threads"])
    fn, models = request["fn"], request["models"]
    options, dynamic = request["options"], request["dynamic"]
    buffers = dict(models.named_buffers())  # the packages' first inputs, as in the run
    leaves, spec = tree_flatten(request["args"])
    for path, kwargs in map(lambda item: (Path(item[0]), item[1]), request["todo"]):
        if path.exists() and packages.check_package(path) is None:
            continue  # built meanwhile, by another run's builder or a foreground compile
        packages.remove_package(path)
        start = time.perf_counter()
        try:
            export.build_package(fn, models, options, dynamic, path, buffers, leaves, spec, kwargs)
        except Exception as error:  # a full disk, a compiler error: said once, not retried
            first = (str(error).strip().splitlines() or [type(error).__name__])[0][:200]
            line = packages.no_space(error) or first  # not the zip writer's own words
            with suppress(OSError):  # on a full disk even this may not be written
                packages.failed_marker(path).write_text(line + "\n")
            raise
        print(f"built {path.name} in {time.perf_counter() - start:.0f} s", flush=True)


def build_queue(folder: Path) -> bool:
    """Build the queued requests, oldest first, each removed once done. A request that fails
    is logged and removed: the next run that needs its packages asks again. False if a request
    cannot be removed: the builder then stops rather than take it again and again."""
    while requests := queued(folder):
        try:
            build_request(requests[0])
        except Exception:  # logged; the builder goes on with the next request
            traceback.print_exc()
        packages.clear(requests[0])  # a folder in a request's place too
        if packages.present(requests[0]):
            print(f"stopped: {requests[0]} cannot be removed", flush=True)
            return False
    return True


def main(argv: list[str]) -> int:
    """Build the folder's queue under its lock; exit at once if another builder holds it."""
    folder = Path(argv[0])
    with open(folder / "builder.lock", "a") as lock:
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return 0
            emptied = build_queue(folder)
            fcntl.flock(lock, fcntl.LOCK_UN)
            if not emptied or not queued(folder):  # else a request came as the lock was let go
                return 0


def builder_niceness() -> int:
    """The niceness the builder runs at: $MINISPEC_BUILDER_NICENESS (the test suite builds at 0,
    since its tests wait for the build), else NICENESS. ValueError, naming the variable, for
    anything but a whole number from 0 to 19."""
    text = os.environ.get("MINISPEC_BUILDER_NICENESS", str(NICENESS))
    digits = text.strip()
    # isdigit alone takes "²" and "①", which int() refuses with a message naming nothing.
    if not (digits.isascii() and digits.isdigit()) or not 0 <= int(digits) <= 19:
        raise ValueError(f"MINISPEC_BUILDER_NICENESS={text!r} is not a whole number from 0 to 19")
    return int(text)


if __name__ == "__main__":
    os.nice(builder_niceness())
    sys.exit(main(sys.argv[1:]))
