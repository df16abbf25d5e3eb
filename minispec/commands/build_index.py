"""`python -m minispec build-index [--out PATH]`: the suffix index over the training corpus.

The index (about 60 MB on disk: the corpus bytes and a 4-byte suffix array entry per byte) is
too large to ship beside the checkpoints, so it is built on first use (about 10 s on one core)
into a cache directory, one file per Python version, since the corpus is that interpreter's
standard library. A cached index that does not load (cut short by a full disk, overwritten) is
built again, with one line saying so. `--out` is checked before the corpus is read, and the
file is written atomically: a build killed half-way leaves no index, and its temporary file is
removed by the next write to the same folder.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

from minispec.commands.args import OneLineParser, writable_file
from minispec.commands.corpus import load_corpus
from minispec.proposers.suffix import SuffixIndex


def default_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "minispec"
    return cache / f"suffix-index-py{sys.version_info.major}.{sys.version_info.minor}.npz"


def cached_index(path: Path | None = None) -> SuffixIndex:
    """Load the index, building and saving it first if it is not there or does not load."""
    path = path or default_path()
    if path.exists():
        try:
            return SuffixIndex.load(path)
        except ValueError as exc:
            print(f"rebuilding the suffix index: {exc}", file=sys.stderr, flush=True)
    path.parent.mkdir(parents=True, exist_ok=True)
    SuffixIndex.build(load_corpus().train.numpy()).save(path)
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
    start = time.perf_counter()
    corpus = load_corpus().train.numpy()
    loaded = time.perf_counter()
    index = SuffixIndex.build(corpus)
    built = time.perf_counter()
    out.parent.mkdir(parents=True, exist_ok=True)
    index.save(out)
    print(
        f"{len(corpus):,} tokens: corpus read in {loaded - start:.1f} s, index built in "
        f"{built - loaded:.1f} s, {out.stat().st_size / 1e6:.1f} MB on disk at {out}"
    )
    return 0


if __name__ == "__main__":  # the module run directly goes through the same front door
    from minispec.commands.cli import main as front_door

    raise SystemExit(front_door(["build-index", *sys.argv[1:]]))
