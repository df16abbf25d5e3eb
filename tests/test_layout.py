"""The house a reader walks through: one-way layers, no pointers to files outside the
repository, and a README map whose every name exists.

- Layers: no library module imports minispec.commands (the command line sits on top of the
  library, never under it), and sampling/ imports neither model nor minispec (logits in, tokens
  out: it knows nothing of models or of the loop).
- No file of the repository points at a guide or a shared folder that only exists beside it.
- README.md's reading path and its "From the paper to the code" map name only files, modules and
  functions that exist; the README is a guide of at most 300 lines with its parts in order.

Static reads of the source (ast): nothing is imported but the modules the README
names.
"""

from __future__ import annotations

import ast
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# Written in pieces, so that this file does not mention what it looks for.
FORBIDDEN_MENTIONS = ("GUIDE" + ".md", ".." + "/shared")
LIBRARY = ("minispec", "model", "sampling")  # the packages a reader reads


def library_files(*, commands_entry: bool = True) -> list[Path]:
    """The library's modules: the loop (minispec/*.py, minispec/policies/ and
    minispec/proposers/), model/ and sampling/. minispec/commands/ is the command line, not the
    library. `commands_entry` False leaves out minispec/__main__.py, `python -m minispec`'s
    entry, which is the command line's front door and so imports it."""
    files = [
        *(ROOT / "minispec").glob("*.py"),
        *(ROOT / "minispec" / "policies").glob("*.py"),
        *(ROOT / "minispec" / "proposers").glob("*.py"),
        *(ROOT / "model").rglob("*.py"),
        *(ROOT / "sampling").rglob("*.py"),
    ]
    if not commands_entry:
        files = [f for f in files if f != ROOT / "minispec" / "__main__.py"]
    return sorted(files)


def imported_modules(path: Path) -> set[str]:
    """Every module `path` imports, at the top or inside a function: `import a.b` and
    `from a.b import c` give a.b, and a.b.c too (c may be a module)."""
    modules = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            modules.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            modules.add(node.module)
            modules.update(f"{node.module}.{alias.name}" for alias in node.names)
    return modules


def is_within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def test_the_library_does_not_import_the_command_line() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in library_files(commands_entry=False)
        for module in sorted(imported_modules(path))
        if is_within(module, "minispec.commands")
    ]
    assert not offenders, "\n".join(offenders)


def test_sampling_imports_neither_model_nor_the_loop() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {module}"
        for path in sorted((ROOT / "sampling").rglob("*.py"))
        for module in sorted(imported_modules(path))
        if is_within(module, "model") or is_within(module, "minispec")
    ]
    assert not offenders, "\n".join(offenders)


def repository_texts() -> list[Path]:
    """The repository's Python, Markdown and TOML files and Makefiles, outside hidden folders
    (the virtual environment, caches) and __pycache__."""
    return sorted(
        path
        for path in ROOT.rglob("*")
        if path.is_file()
        and (path.suffix in (".py", ".md", ".toml") or path.name == "Makefile")
        and not any(
            part.startswith(".") or part == "__pycache__"
            for part in path.relative_to(ROOT).parts[:-1]
        )
    )


def test_no_file_points_outside_the_repository() -> None:
    offenders = [
        f"{path.relative_to(ROOT)}:{number} mentions {mention}"
        for path in repository_texts()
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1)
        for mention in FORBIDDEN_MENTIONS
        if mention in line
    ]
    assert not offenders, "\n".join(offenders)


# The README sections whose backquoted names must exist: a reader follows them file by file.
CHECKED_SECTIONS = ("## A first hour: the reading path", "## From the paper to the code")


def readme_units(heading: str) -> list[str]:
    """One README section, from `heading` to the next heading of its level, cut into units: a
    table row each, and a paragraph each for the prose."""
    lines = (ROOT / "README.md").read_text().splitlines()
    start = lines.index(heading)
    level = heading.split()[0] + " "
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith(level)), len(lines))
    units, paragraph = [], []
    for line in lines[start:end] + [""]:
        if line.startswith("|"):
            units.append(line)
        elif line.strip() and not line.startswith("#"):
            paragraph.append(line)
        elif paragraph:
            units.append(" ".join(paragraph))
            paragraph = []
    return units


def definitions(path: Path) -> set[str]:
    """What a module defines: its functions and classes at any depth, `Class.method` for the
    methods, and its module-level names."""
    names = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            names.add(node.name)
        if isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}.{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            names.update(t.id for t in targets if isinstance(t, ast.Name))
    return names


def resolves(dotted: str) -> bool:
    """Whether `package.module.attr...` imports: the longest module prefix, then attributes."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ImportError:
            continue
        try:
            for attr in parts[cut:]:
                obj = getattr(obj, attr)
        except AttributeError:
            return False
        return True
    return False


@pytest.mark.parametrize("heading", CHECKED_SECTIONS)
def test_the_readme_map_names_only_what_exists(heading: str) -> None:
    """Each backquoted name in the section exists: a path (`a/b.py`) as a
    file, a dotted module path (`sampling.sample`, `torch.Tensor.scatter_`) as an import, and
    a bare name (`verify`, `SpeculativeDecoder.generate`) as a definition in a file named in
    the same table row or paragraph (or, if it names none, in the last one before it)."""
    missing, files = [], []
    for unit in readme_units(heading):
        quoted = re.findall(r"`([^`]+)`", unit)
        paths = [q for q in quoted if q.endswith(".py")]
        missing += [p for p in paths if not (ROOT / p).is_file()]
        files = [ROOT / p for p in paths if (ROOT / p).is_file()] or files
        defined = set().union(*(definitions(f) for f in files))
        for name in quoted:
            if not re.fullmatch(r"[A-Za-z_]\w*(\.[A-Za-z_]\w*)*", name):
                continue  # code, not a name: `p(x) ≥ u·q(x)`, `compiled=False, ...`
            if name.split(".")[0] in ("minispec", "model", "sampling", "torch"):
                ok = resolves(name)
            else:
                ok = name in defined
            if not ok:
                where = ", ".join(str(f.relative_to(ROOT)) for f in files)
                missing.append(f"{name} (looked in {where or 'no file'})")
    assert not missing, "README names what does not exist:\n" + "\n".join(missing)


README_MAX_LINES = 300
# The guide's parts, in reading order: what a newcomer needs in the first hour. The design of
# each part lives in docs/, so the README stays short enough to read at once.
README_SECTIONS = (
    "## Two commands",
    "## A first hour: the reading path",
    "## From the paper to the code",
    "## How to fork",
    "## Results",
    "## Limitations",
)


def test_the_readme_is_a_short_guide() -> None:
    lines = (ROOT / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines"
    found = [line for line in lines if line in README_SECTIONS]
    assert found == list(README_SECTIONS), f"README sections out of place: {found}"


def reading_path_rows() -> list[tuple[str, list[str], str, int]]:
    """(step, files, what to read, their lines) of each row of the README's reading path."""
    text = (ROOT / "README.md").read_text()
    rows = re.findall(r"^\| (\d+) \| (`[^|]+`) \| (.*) \| (\d+) \|$", text, re.M)
    return [
        (step, re.findall(r"`([^`]+\.py)`", files), read, int(lines))
        for step, files, read, lines in rows
    ]


def reading_path() -> list[str]:
    """The reading path's files, in order."""
    return [path for _, files, _, _ in reading_path_rows() for path in files]


def test_the_reading_path_gives_each_step_its_length() -> None:
    """The reading path's last column is the step's lines, within a few a file."""
    rows = reading_path_rows()
    assert len(rows) >= 10
    for step, files, _, lines in rows:
        actual = sum(len((ROOT / path).read_text().splitlines()) for path in files)
        assert abs(actual - lines) <= 5 * len(files), f"step {step} has {actual} lines, not {lines}"


def defining_file(module: str, name: str) -> Path | None:
    """The library file that defines `name` as `from module import name` reaches it: a
    submodule, a definition, or, through a package's re-export, the file re-exported from."""
    base = ROOT.joinpath(*module.split("."))
    for candidate in (base / name / "__init__.py", base / f"{name}.py"):
        if candidate.is_file():
            return candidate
    path = base.with_suffix(".py") if base.with_suffix(".py").is_file() else base / "__init__.py"
    if not path.is_file():
        return None
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if any((a.asname or a.name) == name for a in node.names):
                if node.module.split(".")[0] in LIBRARY:
                    return defining_file(node.module, name)
    return path


def needed_files(path: Path) -> set[str]:
    """The library files whose names `path` imports at module level (what a reader of it
    needs), as paths from the root."""
    needed = set()
    for node in ast.parse(path.read_text()).body:
        if isinstance(node, ast.ImportFrom) and node.module:
            if node.module.split(".")[0] in LIBRARY:
                for alias in node.names:
                    found = defining_file(node.module, alias.name)
                    if found is not None:
                        needed.add(str(found.relative_to(ROOT)))
        elif isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name.split(".")[0] in LIBRARY:
                    found = defining_file(*alias.name.rsplit(".", 1))
                    if found is not None:
                        needed.add(str(found.relative_to(ROOT)))
    return needed - {str(path.relative_to(ROOT))}


def test_the_reading_path_reads_in_dependency_order() -> None:
    """Each file on the path needs, of the path's files, only those above it: a reader going
    down never needs one further down. (That no file the plain decode runs is missing from the
    path, tests/test_core_size.py checks.)"""
    path = reading_path()
    assert len(path) == len(set(path)), "a file twice on the path"
    late = [
        f"{path[i]} needs {needed} (step below it)"
        for i in range(len(path))
        for needed in sorted(needed_files(ROOT / path[i]) & set(path[i + 1 :]))
    ]
    assert not late, "\n".join(late)


# Keyings the code rejects (sampling/noise.py says why): the standard and block rules key a
# round's numbers by its first position, never by the position each number is used at.
REJECTED_KEYINGS = ("hash of (seed, position)", "hash of (seed, absolute position)")


def test_the_docs_teach_the_noise_keying_the_code_uses() -> None:
    """README and docs/ describe the randomness as noise.py draws it: the reading path's step on
    noise.py names the round's first position, noise.py keys round_noise's streams by `start`,
    and no document teaches a per-position keying."""
    (row,) = [read for _, files, read, _ in reading_path_rows() if "sampling/noise.py" in files]
    assert "round's first position" in row
    source = (ROOT / "sampling" / "noise.py").read_text()
    assert "round_keys(seeds, start, STREAM_UNIFORM" in source
    for path in [ROOT / "README.md", *(ROOT / "docs").glob("*.md")]:
        text = " ".join(path.read_text().split())
        for phrase in REJECTED_KEYINGS:
            assert phrase not in text, f"{path.name} teaches '{phrase}'"
