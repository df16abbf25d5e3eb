"""The harness's prompts from outside the corpus (benchmarks/prompts.py): enough of each
category, the same on every run, none in the training corpus, each short enough for the
harness's longest setting, and a missing package skipped rather than fatal."""

from __future__ import annotations

from benchmarks import prompts
from minispec.commands.corpus import stdlib_files

COUNT = 8  # the harness's default per category


def test_the_outside_categories_are_full_fixed_and_off_the_corpus() -> None:
    made = {
        "packages": prompts.from_packages(prompts.package_cut, COUNT, 0),
        "edits": prompts.from_packages(prompts.edit, COUNT, 1),
        "docstrings": prompts.from_packages(prompts.prose, COUNT, 2),
        "non-ASCII": prompts.non_ascii(COUNT),
    }
    assert {name: len(set(texts)) for name, texts in made.items()} == dict.fromkeys(made, COUNT)
    assert made["edits"] == prompts.from_packages(prompts.edit, COUNT, 1)  # the same every run
    assert all(any(ord(ch) > 127 for ch in text) for text in made["non-ASCII"])
    # room in the 512-token context for BOS, 128 new tokens and the widest round's 9
    assert max(len(t.encode()) for texts in made.values() for t in texts) <= 512 - 1 - 128 - 9
    corpus = "".join(path.read_text(errors="replace") for path in stdlib_files())
    assert not [t for texts in made.values() for t in texts if t in corpus]


def test_an_edit_repeats_its_function_with_the_name_changed() -> None:
    source = "import os\n\n\ndef join(a, b):\n    x = a + b\n    return x\n"
    assert prompts.edit(source) == (
        "def join(a, b):\n    x = a + b\n    return x\n\ndef join_v2(a, b):\n"
    )


def test_a_missing_package_is_skipped() -> None:
    found = prompts.package_files(("no_such_package_here", "numpy"))
    assert len(found) == 1 and all("numpy" in path.parts for path in found[0])
