"""The training corpus: this interpreter's own standard-library .py sources.

No network, fully deterministic (sorted file order), and Python code is a domain where a small
draft predicts a large target well (indentation, keywords, repeated identifiers). Test suites
are left out, and held-out data is split by file, so the held-out loss measures generalisation
to unseen files rather than to unseen windows of seen ones.
"""

from __future__ import annotations

import hashlib
import sysconfig
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Iterable, Iterator

from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID

EXCLUDED_DIRS = {"test", "tests", "idle_test", "site-packages", "__pycache__"}
if TYPE_CHECKING:  # torch is imported where the tensors are made: the commands parse first
    import torch

HELD_OUT_EVERY = 50  # every 50th file (by a hash of its path) is held out: about 2% of the data


@dataclass(frozen=True, slots=True)
class Corpus:
    train: torch.Tensor  # uint8-range token ids with BOS/EOS between files, int16 to fit 258 ids
    held_out: torch.Tensor
    fingerprint: str  # sha256 over (relative path, bytes) of every file, in order
    num_files: int


def corpus_root(root: Path | None = None) -> Path:
    """The folder the corpus is read from: `root`, or this interpreter's standard library."""
    return Path(root or sysconfig.get_paths()["stdlib"])


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = corpus_root(root)
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        # A folder named *.py, or a link that leads nowhere or to itself, has no bytes to read.
        if path.is_file():
            files.append(path)
    return files


def is_held_out(rel: str) -> bool:
    """Whether the file at `rel` (its path below the root) is held out."""
    return int(hashlib.md5(rel.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0


def documents(root: Path | None = None) -> Iterator[tuple[str, bytes]]:
    """(relative path, bytes) of every corpus file, in order."""
    root = corpus_root(root)
    for path in stdlib_files(root):
        yield path.relative_to(root).as_posix(), path.read_bytes()


def fingerprint(docs: Iterable[tuple[str, bytes]]) -> str:
    """What tells one corpus from another: a resumed run must continue on the same one."""
    digest = hashlib.sha256()
    for rel, data in docs:
        digest.update(rel.encode() + b"\0" + data)
    return digest.hexdigest()


def split_sizes(root: Path | None = None) -> tuple[int, int, int]:
    """(files, training tokens, held-out tokens) of the corpus, from the files' sizes: what
    load_corpus would make, found without reading the files."""
    root = corpus_root(root)
    files, tokens = stdlib_files(root), [0, 0]
    for path in files:
        tokens[is_held_out(path.relative_to(root).as_posix())] += path.stat().st_size + 2
    return len(files), *tokens


def size_problem(num_files: int, train: int, held_out: int, seq_len: int) -> str | None:
    """Why a corpus of these sizes cannot train windows of `seq_len` tokens, or None. A batch
    draws windows of seq_len + 1 tokens at starts below train - seq_len - 1, and the held-out
    loss needs one whole window."""
    if not num_files:
        return "no .py files (test files and folders are left out)"
    if train < seq_len + 2:
        return f"too small: {train:,} training bytes, a window needs {seq_len + 2:,}"
    if held_out < seq_len + 1:
        return (
            f"too small: {held_out:,} held-out bytes (one file in {HELD_OUT_EVERY}, chosen by a "
            f"hash of its path, is held out), the held-out loss needs {seq_len + 1:,}"
        )
    return None


def load_corpus(root: Path | None = None) -> Corpus:
    import torch  # deferred: importing this module stays light

    docs = list(documents(root))
    train, held_out = [], []
    for rel, data in docs:
        (held_out if is_held_out(rel) else train).extend([BOS_TOKEN_ID, *data, EOS_TOKEN_ID])
    as_tensor = lambda ids: torch.tensor(ids, dtype=torch.int16)  # noqa: E731
    return Corpus(as_tensor(train), as_tensor(held_out), fingerprint(docs), len(docs))
