"""make bench-auto's prompts: code the pair never trained on (its corpus is the standard
library), cut the same way on every run."""

from __future__ import annotations

from benchmarks.bench_auto import outside_prompts
from minispec.commands.corpus import stdlib_files


def test_outside_prompts_are_distinct_cuts_of_code_off_the_corpus() -> None:
    prompts = outside_prompts(4)
    assert len(prompts) == 4 and len(set(prompts)) == 4
    assert all(len(p) == 300 for p in prompts)
    assert prompts == outside_prompts(4)  # the same prompts every run
    corpus = "".join(path.read_text(errors="replace") for path in stdlib_files())
    assert not any(p in corpus for p in prompts)  # the training corpus holds none of them
