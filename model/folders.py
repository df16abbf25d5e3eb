"""Folders that minispec writes whole (an exported model): replaced atomically, and only when
minispec wrote them; and folders it writes files into one by one (train's --out-dir, which may
hold the user's own files): a file there is replaced only when minispec wrote it.

A written folder holds MARKER, which lists its files. A folder without it, or holding a file it
does not list (a user's weights, a `.git`), is never replaced: that is one ValueError naming it.
A folder is built beside its destination as `.<name>.tmp-<pid>`, and the one it replaces is moved
to `.<name>.old-<pid>` for the moment of the swap; a process killed in between leaves these
behind, and the next write to the same destination removes them (or, when the kill came between
the two renames, moves the old folder back).

A folder written file by file holds MARKER too, listing the files minispec wrote there;
`unlisted` names those of a write's files that are there but not listed (`check_replaceable`
does not fit: it refuses a folder for any file it does not list, a user's notes beside the
models included). The names are listed before the files are written, so that a run killed in
between has not made its own files look like a user's.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import Iterable

from model.storage import TEMPORARY, atomic_write, process_alive

MARKER = "minispec-export.json"
ASIDE = re.compile(r"\.(.+)\.(tmp|old)-(\d+)")  # `.<name>.tmp-<pid>`, `.<name>.old-<pid>`


def written_files(folder: Path) -> set[str] | None:
    """The files MARKER says minispec wrote into `folder`, or None without a readable MARKER."""
    try:
        files = json.loads((folder / MARKER).read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError, RecursionError):
        return None
    if not isinstance(files, list) or not all(isinstance(f, str) for f in files):
        return None
    return {*files, MARKER}


def check_replaceable(out: Path) -> None:
    """ValueError unless `out` is missing, empty, or a folder minispec wrote and nobody added to."""
    if not out.exists():
        return
    if not out.is_dir():
        raise ValueError(f"{out} is a file, not a folder: refusing to replace it")
    found = {p.name for p in out.iterdir()}
    if not found:
        return
    written = written_files(out)
    if written is None:
        raise ValueError(
            f"{out} exists and was not written by minispec (it has no {MARKER}): refusing to "
            f"replace it; choose another folder, or remove it yourself"
        )
    if extra := sorted(found - written):
        raise ValueError(
            f"{out} holds files that minispec did not write ({', '.join(extra[:3])}"
            f"{', ...' if len(extra) > 3 else ''}): refusing to replace it"
        )


def unlisted(folder: Path, names: Iterable[str]) -> list[Path]:
    """The files among `names` that `folder` holds and its MARKER does not list: files that
    minispec did not write, and so must not replace unless told to."""
    written = written_files(folder) or set()
    paths = [folder / name for name in names if name not in written]
    return [p for p in paths if p.exists() or p.is_symlink()]


def list_written(folder: Path, names: Iterable[str]) -> None:
    """Add `names` to the files `folder`'s MARKER lists, before minispec writes them."""
    files = sorted((written_files(folder) or set()) - {MARKER} | set(names))
    atomic_write(folder / MARKER, json.dumps({"written_by": "minispec", "files": files}).encode())


def only_written_files(folder: Path, names: set[str]) -> bool:
    """Whether `folder` holds nothing but files named in `names`, or their atomic writes'
    temporaries: what a killed write leaves, and so safe to remove."""
    for p in folder.iterdir():
        m = TEMPORARY.fullmatch(p.name)
        base = p.name[1 : p.name.rindex(".tmp-")] if m else p.name
        if not p.is_file() or p.is_symlink() or base not in names:
            return False
    return True


def remove_stale_asides(out: Path, names: set[str]) -> None:
    """Remove the `.tmp-<pid>`/`.old-<pid>` folders that killed writes to `out` left (their
    process has died, and they hold only files named in `names`); an old folder whose swap was
    cut short goes back to `out` when `out` is missing."""
    if os.name != "posix" or not out.parent.is_dir():
        return
    for aside in out.parent.iterdir():
        m = ASIDE.fullmatch(aside.name)
        if not m or m[1] != out.name or not aside.is_dir() or aside.is_symlink():
            continue
        if process_alive(int(m[3])) or not only_written_files(aside, names):
            continue
        if m[2] == "old" and not out.exists():
            os.replace(aside, out)
        else:
            shutil.rmtree(aside)


def replace_folder(out: Path, files: dict[str, bytes], names: set[str]) -> None:
    """Make `out` a folder holding exactly `files` and MARKER: built aside, fsynced, then renamed
    in, so that a reader sees the old folder or the whole new one. `names`: every file name such
    a folder can hold (what a killed write's leftovers may be)."""
    names = {*names, MARKER}
    remove_stale_asides(out, names)
    check_replaceable(out)
    marker = json.dumps({"written_by": "minispec", "files": sorted(files)}, indent=1)
    files = {**files, MARKER: marker.encode()}
    tmp, old = (out.with_name(f".{out.name}.{kind}-{os.getpid()}") for kind in ("tmp", "old"))
    shutil.rmtree(tmp, ignore_errors=True)
    try:
        for name, data in files.items():
            atomic_write(tmp / name, data)
        if out.exists():
            os.replace(out, old)
        try:
            os.replace(tmp, out)
        except BaseException:
            if old.exists():  # the swap failed half-way: the folder that was there goes back
                os.replace(old, out)
            raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
        shutil.rmtree(old, ignore_errors=True)
