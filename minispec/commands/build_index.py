"""python -m minispec.commands.build_index: the suffix index over the training corpus.

The index (about 60 MB on disk: the corpus bytes and a 4-byte suffix array entry per byte) is
too large to ship beside the checkpoints, so it is built on first use (about 10 s on one core)
into a cache directory, one file per Python version, since the corpus is that interpreter's
standard library.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from minispec.commands.corpus import load_corpus
from minispec.proposers.suffix import SuffixIndex


def default_path() -> Path:
    cache = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "minispec"
    return cache / f"suffix-index-py{sys.version_info.major}.{sys.version_info.minor}.npz"


def cached_index(path: Path | None = None) -> SuffixIndex:
    """Load the index, building and saving it first if it is not there."""
    path = path or default_path()
    if not path.exists():
        path.parent.mkdir(parents=True, exist_ok=True)
        SuffixIndex.build(load_corpus().train.numpy()).save(path)
    return SuffixIndex.load(path)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=default_path(), help="where to write the index")
    args = parser.parse_args(argv)
    start = time.perf_counter()
    corpus = load_corpus().train.numpy()
    loaded = time.perf_counter()
    index = SuffixIndex.build(corpus)
    built = time.perf_counter()
    args.out.parent.mkdir(parents=True, exist_ok=True)
    index.save(args.out)
    print(
        f"{len(corpus):,} tokens: corpus read in {loaded - start:.1f} s, index built in "
        f"{built - loaded:.1f} s, {args.out.stat().st_size / 1e6:.1f} MB on disk at {args.out}"
    )


if __name__ == "__main__":
    main()
