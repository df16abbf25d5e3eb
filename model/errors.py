"""The error of a checkpoint or model folder that cannot be used, and the helpers that keep its
message to one line that names the file. No torch here: the tokenizer files use it too, and the
command line imports those before torch.
"""

from __future__ import annotations

import json
from pathlib import Path


class CheckpointError(ValueError):
    """A checkpoint that cannot be used; the message names the file and the problem."""


def read_json(path: Path) -> object:
    """The JSON value in file `path`, or a CheckpointError naming the file."""
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError) as exc:  # JSONDecodeError and UnicodeDecodeError: ValueErrors
        raise CheckpointError(f"{path} does not load ({exc})") from None
    except RecursionError:
        raise CheckpointError(f"{path} does not load (nested too deeply)") from None


def listed(names: list[str], limit: int = 4) -> str:
    """`names` for a message, cut after `limit`: a config that asks for 1,000 layers misses
    thousands of tensors, which one line cannot list."""
    shown = ", ".join(repr(n) for n in names[:limit])
    return f"[{shown}{f', ... ({len(names):,} in all)' if len(names) > limit else ''}]"
