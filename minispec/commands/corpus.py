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
from typing import TYPE_CHECKING

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


def stdlib_files(root: Path | None = None) -> list[Path]:
    root = Path(root or sysconfig.get_paths()["stdlib"])
    files = []
    for path in sorted(root.rglob("*.py")):
        rel = path.relative_to(root)
        if EXCLUDED_DIRS & set(rel.parts[:-1]) or rel.name.startswith("test_"):
            continue
        files.append(path)
    return files


def load_corpus(root: Path | None = None) -> Corpus:
    import torch  # deferred: importing this module stays light

    root = Path(root or sysconfig.get_paths()["stdlib"])
    digest = hashlib.sha256()
    train, held_out = [], []
    files = stdlib_files(root)
    for path in files:
        rel = path.relative_to(root).as_posix()
        data = path.read_bytes()
        digest.update(rel.encode() + b"\0" + data)
        doc = [BOS_TOKEN_ID, *data, EOS_TOKEN_ID]
        split = (
            held_out
            if int(hashlib.md5(rel.encode()).hexdigest(), 16) % HELD_OUT_EVERY == 0
            else train
        )
        split.extend(doc)
    as_tensor = lambda ids: torch.tensor(ids, dtype=torch.int16)  # noqa: E731
    return Corpus(as_tensor(train), as_tensor(held_out), digest.hexdigest(), len(files))
