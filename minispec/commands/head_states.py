"""`minispec train-head`'s cached target states on disk, and what made them.

`states.f16` holds the target's final states, float16 [windows, window, width]; `states.json`
records what decides every one of them (the target's tensor digest, the corpus's fingerprint
and root, --seed, --window, --windows), the file's size in bytes, and a SHA-256 per chunk of
CHUNK windows written so far. A run reuses the states only when every setting is the one it asks
for, the file has its recorded size and each written chunk its digest: states of another run, or
a file cut short, zero-filled or changed, are one line naming what differs and what to do, never
trained on. The training state, train.pt, records its settings the same way (`difference`).

The file is allocated whole before the first chunk, so that a disk without room for it fails at
the start, and is written with pwrite and read with pread, never through a memory map: a write
the disk refuses is an OSError naming the file, where a mapped page would kill the process with
SIGBUS. A chunk's digest is recorded only once its bytes are synced, so a run killed or stopped
by a full disk resumes at the first chunk without one. No torch here: train_head.py checks the
record before torch is imported.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

from model.storage import atomic_write, naming

# train-head's files in --state-dir: the states and their record, the training state, the log.
STATES, RECORD, TRAINING_STATE, LOG = "states.f16", "states.json", "train.pt", "head.log.jsonl"
CHUNK = 8  # windows per target forward, and per digest
STATE_BYTES = 2  # float16
# The flag that sets each recorded setting, for the one line that names a difference.
FLAGS = {
    "target_sha256": "--target",
    "corpus_fingerprint": "--corpus-root",
    "seed": "--seed",
    "window": "--window",
    "windows": "--windows",
    "width": "--width",
    "heads": "--heads",
    "mlp_hidden": "--mlp-hidden",
    "depth": "--depth",
    "lr": "--lr",
    "steps": "--steps",
    "batch_size": "--batch-size",
}


def difference(recorded: dict, requested: dict, made: str) -> str | None:
    """The first setting of `requested` that `recorded` does not hold, in words ending
    "but `made` <the recorded value>"; None when every one agrees."""
    for key, value in requested.items():
        if recorded.get(key) != value:
            asked, held = (shown(key, v) for v in (value, recorded.get(key)))
            return f"{FLAGS[key]}: this run asks for {asked}, but {made} {held}"
    return None


def shown(key: str, value: object) -> str:
    """A setting's value for a message: a digest by its first 16 hex digits, and what it is."""
    if key == "target_sha256":
        return f"a target of tensor sha256 {str(value)[:16]}"
    if key == "corpus_fingerprint":
        return f"a corpus of fingerprint {str(value)[:16]}"
    return str(value)


def in_words(size: int) -> str:
    """A byte count for a message, in GB or, below 0.1 GB, in MB."""
    return f"{size / 1e9:,.1f} GB" if size >= 10**8 else f"{size / 1e6:,.1f} MB"


def digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


@dataclass
class States:
    """The states of `settings` in `folder`, shaped [windows, window, width]. Checked in two
    steps, so that the corpus is read only once every cheaper check has passed: `check` (the
    record's other settings, the file's size, room for a new file), then `check_corpus`.
    `digests`: one per chunk written so far, in order."""

    folder: Path
    settings: dict
    shape: tuple[int, int, int]
    corpus_root: str = ""
    digests: list[str] = field(default_factory=list)
    recorded: dict | None = None  # the settings states.json holds, once read

    @property
    def path(self) -> Path:
        return self.folder / STATES

    @property
    def record_path(self) -> Path:
        return self.folder / RECORD

    @property
    def size(self) -> int:
        n, t, c = self.shape
        return n * t * c * STATE_BYTES

    @property
    def done(self) -> int:
        """Windows written."""
        return min(len(self.digests) * CHUNK, self.shape[0])

    def chunk_span(self, index: int) -> tuple[int, int]:
        """(byte offset, byte count) of chunk `index` in the file."""
        n, t, c = self.shape
        row = t * c * STATE_BYTES
        first = index * CHUNK
        return first * row, (min(first + CHUNK, n) - first) * row

    def refusal(self, problem: str) -> ValueError:
        return ValueError(
            f"{problem}: use a fresh --state-dir, or remove {self.path} and {self.record_path} "
            f"to compute the states again"
        )

    def check(self) -> None:
        """ValueError unless the states already in the folder were made with these settings
        and have their recorded size; without any, unless the disk has room for them."""
        if self.record_path.exists():
            self.read_record()
        elif self.path.exists():
            raise self.refusal(
                f"{self.path} has no {RECORD} to say what made it (an earlier minispec's, or "
                f"not train-head's)"
            )
        if self.digests:
            self.check_size()
        else:  # nothing to keep: allocate starts the file afresh
            self.check_room()

    def read_record(self) -> None:
        with naming(self.record_path):
            data = self.record_path.read_bytes()
        try:
            record = json.loads(data)
            settings, size, digests = record["settings"], record["bytes"], record["digests"]
        except (ValueError, TypeError, KeyError, RecursionError):
            settings = None  # not JSON, or not an object with these keys
        if not isinstance(settings, dict):
            raise self.refusal(f"{self.record_path} is not train-head's record")
        if problem := difference(settings, self.settings, self.made):
            raise self.refusal(problem)
        chunks = -(-self.shape[0] // CHUNK)
        if size != self.size or not isinstance(digests, list) or len(digests) > chunks:
            raise self.refusal(f"{self.record_path} does not describe these states")
        self.recorded, self.digests = settings, digests

    @property
    def made(self) -> str:
        return f"the states in {self.folder} were made with"

    def check_size(self) -> None:
        found = self.path.stat().st_size if self.path.exists() else 0
        if found != self.size:
            raise self.refusal(
                f"{self.path} is {found:,} bytes, but {RECORD} records {self.size:,} (cut short, "
                f"or replaced)"
            )

    def check_corpus(self, root: Path, fingerprint: str) -> None:
        """Add the corpus to the settings. ValueError unless the states were made on it and each
        written chunk still has its recorded digest (a file zero-filled or changed)."""
        self.corpus_root = str(root)
        corpus = {"corpus_fingerprint": fingerprint}
        if self.recorded and (problem := difference(self.recorded, corpus, self.made)):
            raise self.refusal(problem)
        self.settings.update(corpus)
        if self.digests:
            self.check_digests()

    def check_digests(self) -> None:
        with naming(self.path), open(self.path, "rb") as f:
            for index, expected in enumerate(self.digests):
                offset, count = self.chunk_span(index)
                if digest(os.pread(f.fileno(), count, offset)) != expected:
                    first, last = index * CHUNK, min((index + 1) * CHUNK, self.shape[0]) - 1
                    raise self.refusal(
                        f"{self.path}: windows {first}-{last} are not the bytes {RECORD} "
                        f"records (the file was changed or damaged)"
                    )

    def check_room(self) -> None:
        """ValueError when the folder's disk cannot hold the states (the blocks of a file there,
        which allocate frees first, count as room)."""
        folder = next(p for p in (self.folder, *self.folder.parents) if p.exists())
        allocated = self.path.stat().st_blocks * 512 if self.path.exists() else 0
        needed, free = self.size - allocated, shutil.disk_usage(folder).free
        if needed > free:
            raise ValueError(
                f"--windows {self.shape[0]:,} of --window {self.shape[1]} need {in_words(needed)} "
                f"for the target's states in {self.folder}, which has {in_words(free)} free: "
                f"fewer --windows, or a --state-dir with room"
            )

    def record(self) -> None:
        record = {
            "made_by": "minispec train-head",
            "settings": self.settings,
            "corpus_root": self.corpus_root,
            "shape": list(self.shape),
            "bytes": self.size,
            "digests": self.digests,
        }
        atomic_write(self.record_path, json.dumps(record, indent=1).encode())

    def allocate(self) -> None:
        """Start the states afresh: the record, then the whole file's blocks, so that a disk
        without room fails here and no later write finds it full."""
        self.folder.mkdir(parents=True, exist_ok=True)
        self.digests = []
        self.record()
        with naming(self.path):
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_TRUNC, 0o644)
            try:
                if hasattr(os, "posix_fallocate"):  # not on macOS: its writes still say ENOSPC
                    os.posix_fallocate(fd, 0, self.size)
                else:
                    os.ftruncate(fd, self.size)
            finally:
                os.close(fd)

    def write(self, index: int, data: bytes) -> None:
        """Chunk `index`'s bytes (the next one to write), synced, then its digest recorded."""
        offset, count = self.chunk_span(index)
        with naming(self.path):
            fd = os.open(self.path, os.O_WRONLY)
            try:
                view = memoryview(data)
                while view:
                    view = view[os.pwrite(fd, view, offset + count - len(view)) :]
                os.fsync(fd)
            finally:
                os.close(fd)
        self.digests.append(digest(data))
        self.record()

    def rows(self, indices: list[int]) -> bytes:
        """The states of windows `indices`, float16 [len(indices), window, width]."""
        _, t, c = self.shape
        row = t * c * STATE_BYTES
        with naming(self.path), open(self.path, "rb") as f:
            return b"".join(os.pread(f.fileno(), row, i * row) for i in indices)
