"""compile="aot": the rounds as AOTInductor packages (minispec/compiled.py's AheadOfTime) decode
token for token as the eager rounds do, write the models' KV caches in place, and a second
decoder loads the packages from disk instead of exporting and compiling them again, unless its
weights differ (a package carries its weights, frozen).

Compiling a package costs a minute or more even for these tiny models, so the test compiles
one graph once ("auto" with one width; one batch with a greedy and a random row) and checks
everything on it.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _enumerate import (
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
)

import minispec.compiled
from minispec.adaptive import AdaptiveConfig
from minispec.compiled import Announced
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig

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


def decode_all(decoder: SpeculativeDecoder) -> tuple[list, list[torch.Tensor]]:
    """Each spec's output, from zeroed caches, and the caches it leaves."""
    outputs, left = [], []
    for spec in SPECS:
        for model in (decoder.target, decoder.draft):
            for cache in caches(model):
                cache.zero_()
        outputs.append(decoder.generate(PROMPTS, params(), spec).token_ids)
        left += [c.clone() for m in (decoder.target, decoder.draft) for c in caches(m)]
    return outputs, left


def exports(decoder: SpeculativeDecoder) -> int:
    return sum(announced.fn.exports for _, _, announced in decoder.rounds.values())


def test_aot_rounds_equal_eager_and_load_from_disk(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setattr(minispec.compiled, "aot_folder", lambda: tmp_path)
    # The package's C++ wrapper unoptimised: what is tested is the bookkeeping, not its speed.
    monkeypatch.setattr(torch._inductor.config.aot_inductor, "compile_wrapper_opt_level", "O0")
    target = random_gpt(16, 3, scale=1.5, dtype=torch.float64, max_seq_len=16)
    draft = perturbed_copy(target, 4, mix=0.3)
    eager, eager_caches = decode_all(SpeculativeDecoder(target, draft, compile=False))

    first = SpeculativeDecoder(target, draft, compile="aot")
    out, aot_caches = decode_all(first)
    assert out == eager
    packages = len(list(tmp_path.glob("*.pt2")))
    assert exports(first) == packages == 1  # one per graph
    # The packages wrote the live caches, in place, as the eager rounds did.
    for a, e in zip(aot_caches, eager_caches, strict=True):
        torch.testing.assert_close(a, e)

    monkeypatch.setattr(Announced, "seen", set())  # as in a fresh process
    second = SpeculativeDecoder(target, draft, compile="aot")
    assert decode_all(second)[0] == eager
    assert exports(second) == 0  # loaded from tmp_path
    assert len(list(tmp_path.glob("*.pt2"))) == packages

    # A package carries its weights: other weights of the same shapes never load it.
    other = perturbed_copy(target, 5, mix=0.5)
    other_eager, _ = decode_all(SpeculativeDecoder(other, draft, compile=False))
    monkeypatch.setattr(Announced, "seen", set())
    third = SpeculativeDecoder(other, draft, compile="aot")
    assert decode_all(third)[0] == other_eager != eager
    assert exports(third) == 1
