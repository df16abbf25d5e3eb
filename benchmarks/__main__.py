"""`python -m benchmarks`: what `minispec bench` runs (`make bench`), from the repository root."""

from benchmarks.cli import bench
from minispec.commands.front_door import run

raise SystemExit(run(bench))
