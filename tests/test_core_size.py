"""The core a reader follows through one plain decode stays small: the library code
`minispec decode --no-compile -k 4 --temperature 1` runs, the files it lies in, and the frames
from the command line's entry to the rejection sampler, as benchmarks/core_path.py counts them.

A bound is what the core measured when it was set, a little over for lines: a change that grows
the core past it should say why, and move the bound with it.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest
from test_layout import reading_path

from benchmarks.core_path import LIBRARY, ROOT, docstring_lines, in_library, is_code, measure
from minispec.api import cached_decoder

MAX_LINES = 1620  # 1,573 when set, +3 %
MAX_FILES = 19
MAX_FRAMES = 7  # main, run, run_decode, generate x2, the round, the sampler


@pytest.fixture(scope="module")
def core():
    cached_decoder.cache_clear()  # load the pair in the decode, as a fresh process does
    return measure(max_new_tokens=8)


def test_the_core_stays_within_its_lines(core) -> None:
    biggest = sorted(core.per_function.items(), key=lambda item: -item[1])[:5]
    assert core.lines <= MAX_LINES, f"{core.lines} code lines; the largest: {biggest}"


def test_the_core_stays_within_its_files(core) -> None:
    files = sorted({key.split(":")[0] for key in core.per_function})
    assert core.files <= MAX_FILES, files


def test_the_sampler_is_few_frames_below_the_command_line(core) -> None:
    assert core.frames <= MAX_FRAMES


def test_the_reading_path_names_every_file_the_core_runs(core) -> None:
    """The README's reading path is the core: a file the plain decode runs and the path leaves
    out is one a reader would need and not find."""
    files = {key.split(":")[0] for key in core.per_function}
    assert not files - set(reading_path()), sorted(files - set(reading_path()))


def docstring_over_body(path: Path) -> list[str]:
    """The functions in `path` whose docstring has more lines than the code after it, as
    benchmarks/core_path.py tells code (an interface's stub, whose body is `...`, is its
    docstring)."""
    source = path.read_text(encoding="utf-8")
    tree, text, found = ast.parse(source), source.splitlines(), []
    docstrings = docstring_lines(tree)
    for node in ast.walk(tree):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        first = node.body[0]
        if not (isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant)):
            continue
        rest = node.body[1:]
        if all(isinstance(s, ast.Expr) and getattr(s.value, "value", None) is ... for s in rest):
            continue
        body = range(first.end_lineno + 1, node.end_lineno + 1)
        if first.end_lineno - first.lineno + 1 > sum(is_code(text, docstrings, i) for i in body):
            found.append(f"{path}:{node.lineno} {node.name}")
    return found


def test_no_library_docstring_is_longer_than_its_function(tmp_path: Path) -> None:
    """A function's docstring says what it does and needs; the long why lives once, in docs/.
    Power: the check finds a function whose four-line docstring sits over one line of code."""
    library = [
        path
        for package in LIBRARY
        for path in sorted((ROOT / package).rglob("*.py"))
        if in_library(str(path))
    ]
    assert len(library) > 40  # the walk found the library
    assert [f for path in library for f in docstring_over_body(path)] == []
    wordy = tmp_path / "wordy.py"
    wordy.write_text('def f():\n    """One.\n\n    Two.\n    Three."""\n    return 1\n')
    assert docstring_over_body(wordy) == [f"{wordy}:1 f"]
