"""make bench-auto's prompts: code the pair never trained on (its corpus is the standard
library), cut the same way on every run."""

from __future__ import annotations

import sysconfig
from pathlib import Path

from benchmarks.bench_auto import outside_prompts


def test_outside_prompts_are_distinct_cuts_of_code_off_the_corpus() -> None:
    prompts = outside_prompts(4)
    assert len(prompts) == 4 and len(set(prompts)) == 4
    assert all(len(p) == 300 for p in prompts)
    assert prompts == outside_prompts(4)  # the same prompts every run
    stdlib = Path(sysconfig.get_paths()["stdlib"])
    corpus = "".join(p.read_text(errors="replace") for p in sorted(stdlib.glob("*.py"))[:200])
    assert not any(p in corpus for p in prompts)
