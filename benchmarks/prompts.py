"""The harness's prompts: five categories, none of them from the training corpus.

The corpus is the standard library's sources minus its held-out files
(minispec/commands/corpus.py), so every category is text the pair never trained on: stdlib
(cuts of the held-out files), packages (cuts of installed third-party sources, PACKAGES),
edits (a function, then its first line renamed: continuing means copying, where the lookup
proposers should win), docstrings (cuts that end in prose) and non-ASCII (non_ascii.txt,
written for this benchmark). docs/benchmarks.md describes each. The picks are deterministic:
sorted files, spread evenly, round robin over the packages.
"""

from __future__ import annotations

import ast
import functools
import importlib.util
from pathlib import Path

from minispec.commands.prompts import held_out_prompts

CATEGORIES = ("stdlib", "packages", "edits", "docstrings", "non-ASCII")
# Not pip: looking it up (find_spec) switches off setuptools' distutils shim for the process
# (_distutils_hack's spec_for_pip), and Inductor's later import of setuptools then fails.
PACKAGES = ("torch", "numpy", "_pytest", "safetensors", "sympy", "jinja2")
LENGTH = 300  # bytes of a cut
EDIT_MAX = 240  # characters of an edit's function, so that the prompt stays under 2 LENGTHs
NON_ASCII = Path(__file__).with_name("non_ascii.txt")


@functools.cache
def package_files(names: tuple[str, ...] = PACKAGES) -> list[list[Path]]:
    """Per installed package, its .py sources of at least 4 KB, tests left out, sorted."""
    found = []
    for name in names:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.submodule_search_locations:
            continue
        root = Path(next(iter(spec.submodule_search_locations)))
        files = [
            path
            for path in sorted(root.rglob("*.py"))
            if not {"tests", "test", "testing"} & set(path.relative_to(root).parts)
            and path.stat().st_size >= 4096
        ]
        if files:
            found.append(files)
    return found


def spread_files(packages: list[list[Path]], count: int, offset: int) -> list[Path]:
    """`count` files, round robin over the packages, each package's files spread evenly;
    `offset` moves every pick, so that each category reads other files."""
    picks = []
    for i in range(count):
        files = packages[i % len(packages)]
        step = max(len(files) // (count // len(packages) + 1), 1)
        picks.append(files[(offset + (i // len(packages)) * step) % len(files)])
    return picks


def package_cut(text: str) -> str | None:
    """LENGTH characters from the first line start a third of the way in."""
    start = text.find("\n", len(text) // 3) + 1
    cut = text[start : start + LENGTH]
    return cut if len(cut) == LENGTH else None


def parsed(text: str) -> ast.Module:
    try:
        return ast.parse(text)
    except SyntaxError:  # a source for another Python version: nothing to find in it
        return ast.Module(body=[], type_ignores=[])


def edit(text: str) -> str | None:
    """The first function of 3+ lines and at most EDIT_MAX characters, a blank line, and its
    `def` line again with the name changed."""
    for node in ast.walk(parsed(text)):
        if isinstance(node, ast.FunctionDef) and node.end_lineno - node.lineno >= 2:
            source = ast.get_source_segment(text, node, padded=True)
            if source and len(source) <= EDIT_MAX and not node.decorator_list:
                first = source.split("\n")[0].replace(node.name, node.name + "_v2", 1)
                return f"{source}\n\n{first}\n"
    return None


def prose_starts(text: str) -> list[int]:
    """The first line (0-based) of every docstring and comment block of 3+ lines."""
    lines = text.splitlines()
    starts = [
        i
        for i in range(len(lines) - 2)
        if all(line.strip().startswith("#") for line in lines[i : i + 3])
        and not lines[i - 1].strip().startswith("#")
    ]
    for node in ast.walk(parsed(text)):
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            value = body[0].value
            if isinstance(value, ast.Constant) and isinstance(value.value, str):
                if value.end_lineno - value.lineno >= 2:
                    starts.append(value.lineno - 1)
    return sorted(starts)


def prose(text: str) -> str | None:
    """The LENGTH characters, from a line start, that end two lines into the first docstring or
    comment block of 3+ lines past a third of the file."""
    lines = text.splitlines(keepends=True)
    first = next((i for i in prose_starts(text) if i >= len(lines) // 3), None)
    if first is None:
        return None
    before = "".join(lines[: first + 2])[-LENGTH:]
    return before[before.find("\n") + 1 :] if len(before) == LENGTH else before


def from_packages(make, count: int, offset: int) -> list[str]:
    """`count` prompts made by `make(text)` from package files, trying further files where
    one gives none (in a bounded number of tries)."""
    packages, prompts = package_files(), []
    if not packages:
        return prompts
    for path in spread_files(packages, 8 * count, offset):
        if len(prompts) == count:
            break
        prompt = make(path.read_text(encoding="utf-8", errors="replace"))
        if prompt and prompt not in prompts:
            prompts.append(prompt)
    return prompts


def non_ascii(count: int) -> list[str]:
    return NON_ASCII.read_text(encoding="utf-8").split("\n---\n")[:count]


def categories(count: int) -> dict[str, list[str]]:
    """Up to `count` prompts of each category (packages' categories are empty when no package
    of PACKAGES is installed)."""
    return {
        "stdlib": held_out_prompts(count, LENGTH),
        "packages": from_packages(package_cut, count, 0),
        "edits": from_packages(edit, count, 1),
        "docstrings": from_packages(prose, count, 2),
        "non-ASCII": non_ascii(count),
    }
