"""The core path: how much library code a reader follows through one plain decode.

`python -m benchmarks.core_path` runs `minispec decode --no-compile -k 4 --temperature 1` in
this process under sys.setprofile and reports, for the library (minispec/, model/, sampling/;
minispec/commands/ left out, as the command line's own), the code lines of every function the
decode called (lines that are not blank, not comments, not docstrings; a function counts once,
however often it ran), the files they lie in, and the call frames from the CLI's entry
(`cli.main`, counted) to the first `rejection_sample` (counted), and the library's code lines in
all, run or not. tests/test_core_size.py holds the first three below their bounds.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import json
import sys
from collections import Counter
from pathlib import Path
from typing import NamedTuple

ROOT = Path(__file__).resolve().parent.parent
LIBRARY = ("minispec", "model", "sampling")
COMMAND = ["decode", "--no-compile", "-k", "4", "--temperature", "1"]


class CorePath(NamedTuple):
    lines: int  # code lines of the called library functions
    files: int  # the files they lie in
    frames: int  # frames from cli.main to rejection_sample, both counted
    per_function: dict[str, int]  # "file:line name" -> its code lines


def in_library(filename: str) -> bool:
    path = Path(filename)
    if not path.is_absolute() or ROOT not in path.parents:
        return False
    parts = path.relative_to(ROOT).parts
    return parts[0] in LIBRARY and parts[:2] != ("minispec", "commands")


def docstring_lines(tree: ast.Module) -> set[int]:
    """The lines of every module, class and function docstring in `tree`."""
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            first = node.body[0] if node.body else None
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                if isinstance(first.value.value, str):
                    lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def is_code(text: list[str], docstrings: set[int], line: int) -> bool:
    """Line `line` (1-based) holds code: not blank, not a comment, not a docstring."""
    return line not in docstrings and text[line - 1].strip()[:1] not in ("", "#")


def code_lines(source: str) -> tuple[int, dict[int, tuple[str, int]]]:
    """The code lines of `source`, and per function: the first line of its `def` and of each
    decorator (what a code object's co_firstlineno may be) -> (its name, its code lines)."""
    tree = ast.parse(source)
    docstrings, text = docstring_lines(tree), source.splitlines()

    def count(first: int, last: int) -> int:
        return sum(is_code(text, docstrings, i) for i in range(first, last + 1))

    functions = {}
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            lines = count(node.lineno, node.end_lineno)
            for start in [node.lineno] + [d.lineno for d in node.decorator_list]:
                functions[start] = (node.name, lines)
    return count(1, len(text)), functions


def library_lines() -> int:
    """Code lines in every library file (minispec/commands/ left out), run or not."""
    paths = [path for package in LIBRARY for path in sorted((ROOT / package).rglob("*.py"))]
    return sum(code_lines(p.read_text(encoding="utf-8"))[0] for p in paths if in_library(str(p)))


def measure(max_new_tokens: int = 24) -> CorePath:
    """Profile one decode (its output discarded) and count what it called. The decode sets
    torch's thread count (--threads): the caller's is back afterwards."""
    import torch

    from minispec.commands import cli

    called: set[tuple[str, int]] = set()
    frames: list[int] = []

    def profile(frame, event, arg) -> None:
        if event != "call" or not in_library(frame.f_code.co_filename):
            return
        called.add((frame.f_code.co_filename, frame.f_code.co_firstlineno))
        if not frames and frame.f_code.co_name == "rejection_sample":
            depth, f = 0, frame
            while f is not None and f.f_code is not cli.main.__code__:
                depth += Path(f.f_code.co_filename).is_relative_to(ROOT)
                f = f.f_back
            frames.append(depth + 1)

    argv = COMMAND + ["--max-new-tokens", str(max_new_tokens)]
    threads = torch.get_num_threads()
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        sys.setprofile(profile)
        try:
            code = cli.main(argv)
        finally:
            sys.setprofile(None)
            torch.set_num_threads(threads)
    if code != 0 or not frames:
        raise RuntimeError(f"the decode failed (exit code {code}) or never sampled")
    per_function = {}
    for filename in sorted({f for f, _ in called}):
        _, functions = code_lines(Path(filename).read_text(encoding="utf-8"))
        relative = Path(filename).relative_to(ROOT).as_posix()
        for first in sorted({line for f, line in called if f == filename}):
            if first in functions:  # a lambda, a comprehension or a class body is not counted
                name, count = functions[first]
                per_function[f"{relative}:{first} {name}"] = count
    files = {key.split(":")[0] for key in per_function}
    return CorePath(sum(per_function.values()), len(files), frames[0], per_function)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.core_path", description=__doc__)
    parser.add_argument("--max-new-tokens", type=int, default=24)
    parser.add_argument("--functions", action="store_true", help="list each called function")
    parser.add_argument("--json", action="store_true", help="print one JSON object")
    args = parser.parse_args(argv)
    core = measure(args.max_new_tokens)
    if args.json:
        print(json.dumps(core._asdict()))
        return 0
    per_file = Counter()
    for key, count in core.per_function.items():
        per_file[key.split(":")[0]] += count
    for name, count in per_file.most_common():
        print(f"{count:6d}  {name}")
        if args.functions:
            for key, lines in core.per_function.items():
                if key.startswith(name + ":"):
                    print(f"{lines:14d}  {key.split(':', 1)[1]}")
    print(
        f"core: {core.lines} code lines in {len(core.per_function)} functions, {core.files} "
        f"files; frames from cli.main to rejection_sample: {core.frames}; the library: "
        f"{library_lines()} code lines in all"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
