"""The core a reader follows through one plain decode stays small: the library code
`minispec decode --no-compile -k 4 --temperature 1` runs, the files it lies in, and the frames
from the command line's entry to the rejection sampler, as benchmarks/core_path.py counts them.

A bound is what the core measured when it was set, a little over for lines: a change that grows
the core past it should say why, and move the bound with it.
"""

from __future__ import annotations

import pytest
from test_layout import reading_path

from benchmarks.core_path import measure
from minispec.api import cached_decoder

MAX_LINES = 1620  # 1,573 when set, +3 %
MAX_FILES = 19
MAX_FRAMES = 7  # main, run, run_decode, generate x2, the round, the sampler


@pytest.fixture(scope="module")
def core():
    cached_decoder.cache_clear()  # load the pair in the decode, as a fresh process does
    return measure(max_new_tokens=8)


def test_the_core_stays_within_its_lines(core) -> None:
    biggest = sorted(core.per_function.items(), key=lambda item: -item[1])[:5]
    assert core.lines <= MAX_LINES, f"{core.lines} code lines; the largest: {biggest}"


def test_the_core_stays_within_its_files(core) -> None:
    files = sorted({key.split(":")[0] for key in core.per_function})
    assert core.files <= MAX_FILES, files


def test_the_sampler_is_few_frames_below_the_command_line(core) -> None:
    assert core.frames <= MAX_FRAMES


def test_the_reading_path_names_every_file_the_core_runs(core) -> None:
    """The README's reading path is the core: a file the plain decode runs and the path leaves
    out is one a reader would need and not find."""
    files = {key.split(":")[0] for key in core.per_function}
    assert not files - set(reading_path()), sorted(files - set(reading_path()))
