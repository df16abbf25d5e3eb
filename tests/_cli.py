"""`python -m minispec` started as a child process, as a user starts it from a terminal."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def start_minispec(argv: list[str], **kwargs) -> subprocess.Popen:
    """Popen of `python -m minispec *argv` with stderr piped (kwargs: e.g. stdout)."""
    # A warning would be a second stderr line: show every one. One thread each: they run at once.
    env = {**os.environ, "PYTHONWARNINGS": "default", "OMP_NUM_THREADS": "1"}
    # A session of its own: Ctrl-C in a terminal signals the whole process group, workers too.
    return subprocess.Popen(
        [sys.executable, "-m", "minispec", *argv],
        cwd=ROOT,
        env=env,
        text=True,
        stderr=subprocess.PIPE,
        start_new_session=True,
        **kwargs,
    )
