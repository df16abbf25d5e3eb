"""What every command's argument parsing shares: one-line errors and checked argument types.

A bad flag is one line on stderr that names the flag, and exit code 2, in every command. Values
are checked where they are parsed, by the `type=` of their flag: a number that cannot be
represented (an int past torch's int64, a thread count no machine has) or makes no sense (NaN,
a negative draw count) is reported against the flag, not as an overflow deep inside torch.

The library's rules for a request's values (K, temperature, top-k, top-p, seed, the tree's
size, the method names) are written once, in minispec/rules.py, which imports no torch: the API
checks them there, and `minispec decode` by them while parsing its flags (`in_range`).

Nothing here imports torch, and a command imports it only after parsing: a bad flag is one line
at once, not after a second of start-up. The one check that needs torch (is this device here?)
is `check_device`, which a command calls after parse_args, so that it comes after every other.
"""

from __future__ import annotations

import argparse
import math
import os
import re
import sys
from pathlib import Path
from typing import Callable

from minispec.rules import check_range

INT64_MAX = 2**63 - 1  # torch's widest integer: larger Python ints overflow when they reach it

# Decode steps at B = 1 are latency-bound: each of a forward's kernels is microseconds of work,
# and an OpenMP team's barrier per kernel costs more than a second core saves. When another
# process holds that core the barrier waits for it to be scheduled (docs/benchmarks.md).
THREADS_HELP = (
    "CPU threads for the decode rounds (default 1: faster for B = 1 decoding); the prefill "
    "runs on every core"
)


def fail(message: str) -> int:
    """Report one problem as one line on stderr; the exit code for bad input."""
    print(f"error: {' '.join(message.split())}", file=sys.stderr)  # newlines would make it two
    return 2


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit code 2 (argparse prints usage too)."""

    def error(self, message: str) -> None:
        raise SystemExit(fail(f"{self.prog}: {message}"))


def integer(low: int = -INT64_MAX - 1, high: int = INT64_MAX) -> Callable[[str], int]:
    """An argparse type: an int in [low, high] (by default, any int that torch can hold)."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected an integer, got {text!r}") from None
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low}, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high}, got {text}")
        return value

    return parse


def real(
    low: float = -math.inf, positive: bool = False, high: float = math.inf
) -> Callable[[str], float]:
    """An argparse type: a finite float in [low, high], or > 0 when `positive`; never NaN or
    inf."""

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
        if not math.isfinite(value):
            raise argparse.ArgumentTypeError(f"must be a finite number, got {text}")
        if positive and value <= 0:
            raise argparse.ArgumentTypeError(f"must be > 0, got {text}")
        if value < low:
            raise argparse.ArgumentTypeError(f"must be >= {low:g}, got {text}")
        if value > high:
            raise argparse.ArgumentTypeError(f"must be <= {high:g}, got {text}")
        return value

    return parse


def thread_count(text: str) -> int:
    """An argparse type: a CPU thread count; more threads than CPUs only wait on each other."""
    return integer(1, os.cpu_count() or 1)(text)


def comma_list(item: Callable[[str], object]) -> Callable[[str], str]:
    """An argparse type: a comma-separated list whose every item parses with `item`.

    The text is returned as given (the commands split it themselves); checking it here is what
    turns `--ks 1,x` into an error that names the flag before any work starts.
    """

    def parse(text: str) -> str:
        for part in text.split(","):
            item(part.strip())
        return text

    return parse


def choice_list(choices: tuple[str, ...]) -> Callable[[str], str]:
    """An argparse type: a comma-separated subset of `choices` (empty items are ignored)."""

    def check(part: str) -> str:
        if part and part not in choices:
            raise argparse.ArgumentTypeError(
                f"unknown item {part!r}; choose from {', '.join(choices)}"
            )
        return part

    return comma_list(check)


DEVICE = re.compile(r"[a-z][a-z0-9_]*(:\d+)?")  # the shape of torch's names: cuda, cuda:1, ...


def device_name(text: str) -> str:
    """An argparse type: text shaped like a device name (`cpu`, `cuda:1`). Whether torch knows
    it and this machine has it is `check_device`'s question, asked after parsing."""
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"expected a device such as cpu or cuda:0, got {text!r}")
    return text


def check_device(parser: argparse.ArgumentParser, device: str, flag: str = "--device") -> None:
    """Report `device` against its flag, in one line, unless torch knows it and this machine has
    it. It imports torch: call it after parse_args, once every other flag has passed."""
    from minispec.machine import device_problem  # deferred: it imports torch

    if (problem := device_problem(device)) is not None:
        parser.error(f"argument {flag}: {problem}")


def path_problem(text: str, folder: bool) -> str | None:
    """Why `text` cannot be written as a folder (`folder`) or a file, or None: checked where
    the flag is parsed, so that a path that cannot be written fails before any work, not as
    "File exists" or "Not a directory" from deep inside it."""
    if not text:
        return "expected a path, got ''"
    path = Path(text)
    if path.exists() and folder != path.is_dir():
        return f"{path} is {'a file, not a folder' if folder else 'a folder, not a file'}"
    # The nearest folder that exists: a file is written into its parent (a file already there is
    # replaced, by a rename), a folder is made in it or is that folder itself.
    start = (path,) if folder else ()
    existing = next(p for p in (*start, *path.parents) if p.exists() or p == Path(p.anchor))
    if not existing.is_dir():
        return f"{existing} is a file, not a folder"
    if not os.access(existing, os.W_OK | os.X_OK):
        return f"{existing}: permission denied"
    return None


def writable_folder(text: str) -> str:
    """An argparse type: a folder that is there or can be made, and can be written into."""
    if (problem := path_problem(text, folder=True)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def writable_file(text: str) -> str:
    """An argparse type: a file path (not a folder) that can be written."""
    if (problem := path_problem(text, folder=False)) is not None:
        raise argparse.ArgumentTypeError(problem)
    return text


def checkpoint_path(folder_ok: bool) -> Callable[[str], str]:
    """An argparse type: a checkpoint file that is there, or (`folder_ok`) a Hugging Face model
    folder, which holds config.json. Checked where the flag is parsed, so that a misspelt path
    or /dev/null is one line at once, not after torch's start-up."""

    def parse(text: str) -> str:
        path = Path(text)
        if not path.exists():
            raise argparse.ArgumentTypeError(f"not found: {text}")
        if folder_ok and path.is_dir() and (path / "config.json").is_file():
            return text
        if not path.is_file():  # a folder without a model, a device, a pipe
            folder = " or a model folder (with config.json)" if folder_ok else ""
            raise argparse.ArgumentTypeError(f"{text} is not a regular file{folder}")
        return text

    return parse


def in_range(name: str, parse: Callable[[str], float]) -> Callable[[str], float]:
    """An argparse type: the value `parse` reads, refused unless it keeps the library's rule
    for `name` (minispec/rules.py's RANGES)."""

    def check(text: str) -> float:
        value = parse(text)
        try:
            check_range(name, value)
        except ValueError as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
        return value

    return check
