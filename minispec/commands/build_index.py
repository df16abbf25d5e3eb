"""`python -m minispec build-index [--out PATH]`: the suffix index over the training corpus.

The index (about 60 MB on disk: the corpus bytes and a 4-byte suffix array entry per byte) is
too large to ship beside the checkpoints, so it is built on first use (about 10 s on one core)
into a cache directory, one file per Python version, since the corpus is that interpreter's
standard library. A cached index that does not load (cut short by a full disk, overwritten) is
built again, with one line saying so. `--out` is checked before the corpus is read, and the
file is written atomically (a temporary file, then a rename): a build killed half-way leaves no
index, its temporary file is removed by the next write to the same folder, and an index already
there is replaced whole.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from minispec.commands.args import OneLineParser, writable_file
from minispec.commands.corpus import load_corpus


def default_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "minispec"
    return cache / f"suffix-index-py{sys.version_info.major}.{sys.version_info.minor}.npz"


def cached_index(path: Path | None = None):
    """Load the index (a SuffixIndex), building and saving it first if it is not there or does
    not load."""
    from minispec.proposers.suffix import SuffixIndex  # deferred: it imports torch

    path = path or default_path()
    if path.exists():
        try:
            return SuffixIndex.load(path)
        except ValueError as exc:
            print(f"rebuilding the suffix index: {exc}", file=sys.stderr, flush=True)
    index = SuffixIndex.build(load_corpus().train.numpy())
    try:
        index.save(path)
    except OSError as exc:  # "Permission denied" alone says neither where nor what to do
        raise OSError(
            f"cannot write the suffix index cache {path}: {exc.strerror or exc}; set "
            "XDG_CACHE_HOME to a folder you can write, or make this one writable"
        ) from None
    return SuffixIndex.load(path)


def main(argv: list[str]) -> int:
    parser = OneLineParser(prog="minispec build-index", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--out",
        type=writable_file,
        default=str(default_path()),
        help="where to write the index (default: the cache that decode --proposer suffix reads)",
    )
    out = Path(parser.parse_args(argv).out)
    from minispec.proposers.suffix import SuffixIndex  # deferred: it imports torch

    start = time.perf_counter()
    corpus = load_corpus().train.numpy()
    loaded = time.perf_counter()
    index = SuffixIndex.build(corpus)
    built = time.perf_counter()
    index.save(out)  # atomically: an index already at `out` is replaced whole
    print(
        f"{len(corpus):,} tokens: corpus read in {loaded - start:.1f} s, index built in "
        f"{built - loaded:.1f} s, {out.stat().st_size / 1e6:.1f} MB on disk at {out}"
    )
    return 0


if __name__ == "__main__":  # the module run directly goes through the same front door
    from minispec.commands.front_door import run

    raise SystemExit(run(main))
