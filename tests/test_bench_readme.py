"""The README's results are the harness's: its block between the markers is exactly what
benchmarks/tables.py makes from results/bench.json, the raw counts of the run it names. A hand
edit of either, or a new bench.json without its README block, fails here."""

from __future__ import annotations

import json
from pathlib import Path

from benchmarks import tables

ROOT = Path(__file__).resolve().parent.parent


def test_the_readme_headline_is_made_from_results_bench_json() -> None:
    readme = (ROOT / "README.md").read_text()
    start = readme.index(tables.README_BEGIN)
    end = readme.index(tables.README_END, start) + len(tables.README_END)
    report = json.loads((ROOT / "results" / "bench.json").read_text())
    assert readme[start:end] == tables.readme_block(report)
    assert report["command"] in readme[start:end] and report["settings"]["batch_size"] == 1
