"""What checkpoint files (model/checkpoint.py) and model folders (model/hf.py, model/folders.py)
share: where the shipped ones lie, atomic writes, a checkpoint's header read alone, and the checks
of loaded weights against their config. torch is imported by those checks only: the commands
check their output paths and read headers (model/folders.py, header_metadata) before torch's
second of start-up.
"""

from __future__ import annotations

import json
import os
import re
import struct
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Iterator

from model.errors import CheckpointError

if TYPE_CHECKING:
    import torch

    from model.gpt import GPTConfig

# The shipped pair and feature head: checkpoints/ beside minispec/, in the repository and in
# site-packages alike (the wheel installs it there).
CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
DEFAULT_TARGET = CHECKPOINTS / "target.safetensors"
DEFAULT_DRAFT = CHECKPOINTS / "draft.safetensors"
# The draft fine-tuned to draft K tokens in one forward (minispec train-parallel)
DEFAULT_PARALLEL_DRAFT = CHECKPOINTS / "parallel.safetensors"
DEFAULT_HEAD = CHECKPOINTS / "head.safetensors"  # trained on DEFAULT_TARGET's states
FORMAT = "minispec-gpt-v1"  # a model checkpoint's "format" metadata
HEAD_FORMAT = "minispec-head-v1"  # a feature head's
TIED_KEY = "lm_head.weight"  # if tied, it is embed.weight: stored once, re-tied on load
TEMPORARY = re.compile(r"\..+\.tmp-(\d+)")  # atomic_write's `.<name>.tmp-<pid>`


def default_head(target: str | Path) -> Path | None:
    """The feature head that goes with `target` when none is named: the shipped one, which
    reads the shipped target's states only; None for any other target."""
    shipped = Path(target).resolve() == DEFAULT_TARGET and DEFAULT_HEAD.is_file()
    return DEFAULT_HEAD if shipped else None


def process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)  # signal 0: asks whether the process exists, sends nothing
    except ProcessLookupError:
        return False
    except PermissionError:
        return True  # it exists, under another user
    except OverflowError:
        return False  # no process has such an id
    return True


def remove_stale_temporaries(folder: Path) -> list[Path]:
    """Delete the temporaries of atomic writes whose process has died (killed mid-save: a kill
    skips the clean-up below), and return their paths. A live process's temporary is a write in
    progress and stays. The pid in the name is what tells them apart, so this is POSIX only (on
    Windows, os.kill ends the process it is given)."""
    if os.name != "posix" or not folder.is_dir():
        return []
    stale = [
        p
        for p in folder.glob(".*.tmp-*")
        if (m := TEMPORARY.fullmatch(p.name)) and p.is_file() and not process_alive(int(m[1]))
    ]
    for p in stale:
        p.unlink(missing_ok=True)
    return stale


@contextmanager
def naming(path: Path) -> Iterator[None]:
    """An OSError inside names `path`: a write to a full disk names no file, and a temporary's
    failure names the temporary, where the user needs the file they asked for."""
    try:
        yield
    except OSError as exc:
        raise OSError(exc.errno, exc.strerror or str(exc), str(path)) from None


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that `path` is either the old file or the complete new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
        with naming(path):
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def cast_finite(
    path: str | Path, weights: dict[str, torch.Tensor], dtype: torch.dtype
) -> dict[str, torch.Tensor]:
    """`weights` cast to `dtype`. NaN or inf weights, in the file or made by the cast, decode
    to garbage (only NUL bytes) with exit code 0: they are an error that names the tensor."""
    import torch  # deferred: see the module docstring

    cast = {k: v.to(dtype) for k, v in weights.items()}
    for k, v in cast.items():
        if not torch.isfinite(v).all():
            overflow = bool(torch.isfinite(weights[k]).all())
            found = f"values beyond {dtype}'s range" if overflow else "NaN or inf"
            raise CheckpointError(f"{path}: tensor {k} has {found}")
    return cast


def config_shapes(config: GPTConfig) -> dict[str, torch.Size]:
    """The shape of each tensor a model of `config` holds, from a model on the meta device (no
    memory): a file that disagrees with its config is reported before it can ask for terabytes."""
    import torch  # deferred: see the module docstring

    from model.gpt import GPT

    with torch.device("meta"):
        return {k: v.shape for k, v in GPT(config, init_weights=False).state_dict().items()}


def header_metadata(path: Path) -> dict[str, str]:
    """A checkpoint's metadata, from its header alone: no torch, no tensor read."""
    return read_header(path)[0].get("__metadata__") or {}


def check_whole(path: Path) -> None:
    """CheckpointError if `path` ends before its header says its tensors do: a file cut inside
    its tensors, found without reading them."""
    header, start = read_header(path)
    try:
        ends = [entry["data_offsets"][1] for key, entry in header.items() if key != "__metadata__"]
        needed = start + max(ends, default=0)
    except (KeyError, TypeError, IndexError):
        raise CheckpointError(f"{path}: not a safetensors file") from None
    if needed > path.stat().st_size:
        raise CheckpointError(
            f"{path}: truncated safetensors file ({path.stat().st_size} bytes, but its "
            f"tensors end at byte {needed})"
        )


def read_header(path: Path) -> tuple[dict, int]:
    """A safetensors file's header (its tensors' entries and __metadata__) and the byte where
    their data starts, without torch."""
    try:
        with open(path, "rb") as f:
            (size,) = struct.unpack("<Q", f.read(8))
            if size > path.stat().st_size:  # a size no header has: not a safetensors file
                raise ValueError
            header = json.loads(f.read(size))
        if not isinstance(header, dict) or not isinstance(header.get("__metadata__") or {}, dict):
            raise ValueError
    except (struct.error, ValueError, RecursionError):
        raise CheckpointError(f"{path}: not a safetensors file") from None
    return header, 8 + size
