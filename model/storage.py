"""What checkpoint files (model/checkpoint.py) and model folders (model/hf.py, model/folders.py)
share: atomic writes, and the checks of loaded weights against their config.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import torch

from model.errors import CheckpointError
from model.gpt import GPT, GPTConfig

TIED_KEY = "lm_head.weight"  # if tied, it is embed.weight: stored once, re-tied on load
TEMPORARY = re.compile(r"\..+\.tmp-(\d+)")  # atomic_write's `.<name>.tmp-<pid>`


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


def atomic_write(path: Path, data: bytes) -> None:
    """Write bytes so that `path` is either the old file or the complete new one, never a part."""
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temporaries(path.parent)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    try:
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
    with torch.device("meta"):
        return {k: v.shape for k, v in GPT(config, init_weights=False).state_dict().items()}
