"""compile="aot": the rounds as AOTInductor packages (minispec/compilation/aot.py's
AheadOfTime) decode token for token as the eager rounds do, write the models' KV caches in
place, and a second decoder loads the packages from disk instead of exporting and compiling
them again, unless its weights differ (a package carries its weights, frozen).

Compiling a package costs a minute or more even for these tiny models, so the test compiles
one graph once, in a builder process (compile="auto"), which a decoder with compile="aot" then
loads; "auto" with one width, one batch with a greedy and a random row. That other weights get
a package of their own is checked on the package name, with a stand-in that builds nothing.
"""

from __future__ import annotations

import copy
import os
import time
from pathlib import Path
from typing import Callable

import pytest
import torch
from _enumerate import (
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
)
from torch.utils._pytree import tree_flatten

import minispec.compilation.aot
import minispec.compilation.builder
import minispec.compilation.packages
from minispec.compilation.aot import AheadOfTime
from minispec.decode import SpeculativeDecoder
from minispec.params import AdaptiveConfig, SamplingParams, SpeculativeConfig
from minispec.stats import DecodeStats

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2], [3, 4, 5]]
SPECS = [
    # One width: "auto" then compiles one graph, the round that also chooses the next K (its
    # inputs include the round times, a tensor, and the absent host proposal, a None).
    SpeculativeConfig("auto", "probabilistic", adaptive=AdaptiveConfig(widths=(2,))),
]


def params() -> list[SamplingParams]:
    """A greedy row and a random one: T = 0 and T = 1 in the same graph."""
    return [SamplingParams(temperature=t, seed=5, max_new_tokens=8) for t in (0.0, 1.0)]


def caches(model: torch.nn.Module) -> list[torch.Tensor]:
    return [b for name, b in model.named_buffers() if "kv_cache" in name]


def decode_all(decoder: SpeculativeDecoder) -> tuple[list, list[torch.Tensor], list[DecodeStats]]:
    """Each spec's output, from zeroed caches, the caches it leaves, and each call's stats."""
    outputs, left, stats = [], [], []
    for spec in SPECS:
        for model in (decoder.target, decoder.draft):
            for cache in caches(model):
                cache.zero_()
        out = decoder.generate(PROMPTS, params(), spec)
        outputs.append(out.token_ids)
        stats.append(out.stats)
        left += [c.clone() for m in (decoder.target, decoder.draft) for c in caches(m)]
    return outputs, left, stats


def exports(decoder: SpeculativeDecoder) -> int:
    return sum(compiled.exports for _, compiled in decoder.rounds.values())


def wait_for_packages(folder: Path, count: int, timeout: float = 1200) -> None:
    """Until the builder process has written `count` packages and gone (its lock let go)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        built = len(list(folder.glob("*.pt2")))
        if built >= count and not minispec.compilation.builder.builder_running(folder):
            return
        time.sleep(1)
    log = folder / "builder.log"
    raise AssertionError(log.read_text()[-2000:] if log.exists() else "no builder log")


def naming_stand_in(built: list[Path], run: Callable) -> Callable:
    """An AheadOfTime.foreground_package that builds nothing: it appends the path the package
    would have to `built` and returns `run` (flat inputs -> flat outputs) as the package."""

    def stand_in(self, key, buffers, leaves, spec, kwargs):
        built.append(self.paths([*buffers.values(), *leaves], spec, kwargs)[0])
        return run, tree_flatten(torch.zeros(1))[1]

    return stand_in


def test_aot_rounds_equal_eager_and_load_from_disk(tmp_path: Path, monkeypatch) -> None:
    """compile="auto" decodes eagerly and starts a builder process, which compiles the package
    (the real C++ compile, once); a decoder with compile="aot" then loads it and decodes as
    the eager rounds do."""
    monkeypatch.setattr(minispec.compilation.packages, "aot_folder", lambda: tmp_path)
    # The test waits for the builder: it must not yield the CPU to the other test worker.
    monkeypatch.setenv("MINISPEC_BUILDER_NICENESS", "0")
    # The package's C++ wrapper unoptimised: what is tested is the bookkeeping, not its speed.
    # Set in the options the request carries, so that the builder process uses it too.
    monkeypatch.setitem(
        minispec.compilation.aot.PACKAGE_OPTIONS, "aot_inductor.compile_wrapper_opt_level", "O0"
    )
    target = random_gpt(16, 3, scale=1.5, dtype=torch.float64, max_seq_len=16)
    draft = perturbed_copy(target, 4, mix=0.3)
    eager, eager_caches, _ = decode_all(SpeculativeDecoder(target, draft, compile=False))

    tiered = SpeculativeDecoder(target, draft, compile="auto")
    out, _, stats = decode_all(tiered)
    assert out == eager  # eager rounds, while the builder compiles
    assert exports(tiered) == 0
    assert all(s.compiled_calls == 0 for s in stats)  # no eager round counts a guard check
    wait_for_packages(tmp_path, 1)
    assert len(list(tmp_path.glob("*.pt2"))) == 1  # one per graph
    assert not list((tmp_path / "requests").iterdir())  # the request is done and gone

    first = SpeculativeDecoder(target, draft, compile="aot")
    out, aot_caches, stats = decode_all(first)
    assert out == eager
    assert exports(first) == 0  # loaded from tmp_path
    assert all(s.compiled_calls == s.batch_rounds > 0 for s in stats)
    # The package wrote the live caches, in place, as the eager rounds did.
    for a, e in zip(aot_caches, eager_caches, strict=True):
        torch.testing.assert_close(a, e)


def test_other_weights_of_the_same_shapes_get_a_package_of_their_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A package carries its weights, frozen: a model with other weights of the same shapes
    must never load it, while an equal copy of the weights does. (A stand-in builds nothing;
    the package name is what decides.)"""
    built: list[Path] = []
    stand_in = naming_stand_in(built, lambda flat: [flat[-1] * 2])
    monkeypatch.setattr(AheadOfTime, "foreground_package", stand_in)
    target = random_gpt(16, 3, scale=1.5, dtype=torch.float64, max_seq_len=16)
    for model in (target, copy.deepcopy(target), perturbed_copy(target, 5, mix=0.5)):
        aot = AheadOfTime(lambda x: x * 2, torch.nn.ModuleList([model]), "test", tmp_path)
        aot(torch.ones(2))
    assert built[0] == built[1] != built[2]


def test_a_module_that_gained_a_buffer_gets_a_new_package(tmp_path: Path, monkeypatch) -> None:
    """The buffers are package inputs, so a round first run before the draft had its KV cache
    must not reuse that package once the cache exists (a run on the shipped pair failed with
    "expected inputs vector size to be 31, but got 35"). Bookkeeping only: the package is a
    stand-in that checks its input count, so nothing compiles."""
    built = []

    def stand_in(self, key, buffers, leaves, spec, kwargs):
        count = len(buffers) + sum(isinstance(x, torch.Tensor) for x in leaves)
        built.append(count)

        def run(flat: list[torch.Tensor]) -> list[torch.Tensor]:
            assert len(flat) == count, (len(flat), count)
            return [flat[-1] * 2]

        return run, tree_flatten(torch.zeros(1))[1]

    monkeypatch.setattr(AheadOfTime, "foreground_package", stand_in)
    models = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    aot = AheadOfTime(lambda x: x * 2, models, "test", tmp_path)
    x = torch.ones(2)
    assert torch.equal(aot(x), 2 * x)
    models[0].register_buffer("cache", torch.zeros(3))
    assert torch.equal(aot(x), 2 * x)
    assert built == [1, 2]


def test_only_a_call_that_ran_the_package_counts_as_compiled(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """In the background tier a round runs eagerly until its package is on disk: those calls
    are no calls into compiled code (the stats' guard checks per round), the package's are.
    (A stand-in: the package is missing at the first call and there at the second.)"""
    on_disk = [None, (lambda flat: [flat[-1] * 3], tree_flatten(torch.zeros(1))[1])]
    monkeypatch.setattr(AheadOfTime, "background_package", lambda self, *_: on_disk.pop(0))
    models = torch.nn.ModuleList([torch.nn.Linear(2, 2)])
    aot = AheadOfTime(lambda x: x * 2, models, "test", tmp_path, background=True)
    x = torch.ones(2)
    assert torch.equal(aot(x), 2 * x) and not aot.ran_compiled  # the eager tier
    assert torch.equal(aot(x), 3 * x) and aot.ran_compiled  # the package
    assert torch.equal(aot(x), 3 * x) and aot.ran_compiled


def test_prune_keeps_the_packages_used_last(tmp_path: Path) -> None:
    """Each code change makes new packages and strands the old ones: the folder keeps the ones
    used last (by mtime, which a load refreshes), with their .spec and manifest files, never
    touches a package still being written, and removes the temporary files of a build that
    died (older than an hour)."""
    for age, name in enumerate(["new", "mid", "old", "older"]):
        for suffix in (".pt2", ".spec", ".json"):
            path = tmp_path / f"{name}{suffix}"
            path.write_bytes(b"x")
            os.utime(path, (1e9 - age, 1e9 - age))
    writing = tmp_path / "oldest.123.tmp.pt2"
    writing.write_bytes(b"x")
    dead = tmp_path / "oldest.456.tmp.pt2"
    dead.write_bytes(b"x")
    os.utime(dead, (0, 0))
    minispec.compilation.packages.prune(tmp_path, keep=2)
    kept = [f"{name}{suffix}" for name in ("new", "mid") for suffix in (".pt2", ".spec", ".json")]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([*kept, writing.name])


def test_one_package_serves_every_length_of_the_dynamic_argument(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The argument named `dynamic` (the round's key_positions, exported with a dynamic
    length) is keyed and named by its dtype alone: calls with other lengths reuse its one
    package, while another size of any other argument is another package. Without `dynamic`
    every length is a package of its own. (A stand-in builds nothing.)"""
    built: list[Path] = []
    stand_in = naming_stand_in(built, lambda flat: [flat[-2] + flat[-1].sum()])
    monkeypatch.setattr(AheadOfTime, "foreground_package", stand_in)
    models = torch.nn.ModuleList([torch.nn.Linear(2, 2)])

    def fn(x: torch.Tensor, slots: torch.Tensor) -> torch.Tensor:
        return x + slots.sum()

    aot = AheadOfTime(fn, models, "test", tmp_path, dynamic="slots")
    for length in (64, 128, 192):
        assert torch.equal(
            aot(torch.ones(2), torch.arange(length)), fn(torch.ones(2), torch.arange(length))
        )
    assert len(built) == 1
    aot(torch.ones(3), torch.arange(64))
    assert len(built) == 2 and built[0] != built[1]
    built.clear()
    static = AheadOfTime(fn, models, "test", tmp_path)
    for length in (64, 128, 192):
        static(torch.ones(2), torch.arange(length))
    assert len(set(built)) == 3
