"""Tiers (minispec/compilation/builder.py): with compile="auto" a round runs eagerly while its
package is built elsewhere, and the package takes over at a round boundary.

The switch is forced in-process: the builder's own queue runner (builder.build_queue) is called
after a set number of rounds, with the AOTInductor compile replaced by torch.export's saved
program (run by torch's interpreter: a second tier that costs seconds, not minutes). What is
tested is the loop and the handover - the request's serialisation, the package's inputs and
outputs, the KV caches it writes in place - through everything but the C++ compile, which
tests/test_aot.py runs in a real builder process.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from _enumerate import (
    law_fit,
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
    sequence_law,
)

import minispec.compilation.builder
import minispec.compilation.packages
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.policies import FixedK

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[1, 2], [3, 4, 5]]


@pytest.fixture
def exported_tier(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    """Packages in tmp_path, "compiled" by torch.export.save and run by torch.export.load; the
    builder process is not started, only counted; and each package's calls are counted."""
    monkeypatch.setattr(minispec.compilation.packages, "aot_folder", lambda: tmp_path)
    seen = {"builders": 0, "package_calls": 0, "folder": tmp_path}

    def save(program, package_path: Path, options: dict) -> None:
        torch.export.save(program, str(package_path))

    def load(path: Path):
        module = torch.export.load(str(path)).module()

        def run(flat: list[torch.Tensor]) -> list[torch.Tensor]:
            seen["package_calls"] += 1
            return list(module(*flat))

        return run

    def start_builder(folder: Path) -> None:
        seen["builders"] += 1

    monkeypatch.setattr(minispec.compilation.packages, "compile_package", save)
    monkeypatch.setattr(minispec.compilation.packages, "load_runner", load)
    monkeypatch.setattr(minispec.compilation.builder, "start_builder", start_builder)
    return seen


def build_after(monkeypatch: pytest.MonkeyPatch, rounds: int, folder: Path) -> list[int]:
    """Run the builder's queue (in this process) after `rounds` rounds of the next generate:
    the packages then take over from the next round on. Returns the round count, kept."""
    done = []
    observe = FixedK.observe  # called once at the end of each round (the tests fix K)

    def counted(self, snapshot, seconds) -> bool:
        done.append(1)
        if len(done) == rounds:
            minispec.compilation.builder.build_queue(folder)
        return observe(self, snapshot, seconds)

    monkeypatch.setattr(FixedK, "observe", counted)
    return done


def float64_pair():
    target = random_gpt(16, 3, scale=1.5, dtype=torch.float64)
    return target, perturbed_copy(target, 4, mix=0.3)


def kv_caches(decoder: SpeculativeDecoder) -> list[torch.Tensor]:
    models = (decoder.target, decoder.draft)
    return [b.clone() for m in models for n, b in m.named_buffers() if "kv_cache" in n]


def params(seed: int = 5) -> list[SamplingParams]:
    """A greedy row and a sampled one, seeded."""
    return [SamplingParams(temperature=t, seed=seed, max_new_tokens=9) for t in (0.0, 1.0)]


# A fixed K: one graph, and tokens that depend on the seed alone (with "auto", K follows
# measured round times, and a sampled row's tokens follow K).
SPEC = SpeculativeConfig(2, "probabilistic")


def test_a_switch_mid_request_keeps_every_token(exported_tier: dict, monkeypatch, capsys) -> None:
    """In float64 the two tiers compute the same numbers, so a run that switches after two
    rounds must give the eager run's tokens and leave the same KV caches: a handover that
    dropped a round, fed the package stale buffers or lost the state would change them."""
    target, draft = float64_pair()
    eager_decoder = SpeculativeDecoder(target, draft, compile=False)
    eager = eager_decoder.generate(PROMPTS, params(), SPEC).token_ids
    eager_caches = kv_caches(eager_decoder)

    rounds = build_after(monkeypatch, 2, exported_tier["folder"])
    decoder = SpeculativeDecoder(target, draft, compile="auto")
    assert decoder.generate(PROMPTS, params(), SPEC).token_ids == eager
    for a, e in zip(kv_caches(decoder), eager_caches, strict=True):
        torch.testing.assert_close(a, e)
    # Two eager rounds, then the package ran every later round.
    assert exported_tier["package_calls"] == len(rounds) - 2 > 0
    assert exported_tier["builders"] == 1
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 2, lines
    assert "in the background" in lines[0] and "B = 2, K = 2, draft model" in lines[0]
    assert "now in use" in lines[1]


def test_same_seed_same_tokens_in_each_tier(exported_tier: dict, monkeypatch) -> None:
    """The reproducibility rule: the same seed and settings give the same tokens in the same
    tier (here eager twice, and the package tier twice, from new decoders), and another seed
    gives other tokens (the comparison can fail)."""
    target, draft = float64_pair()
    prompts = PROMPTS * 4
    rows = lambda seed: params(seed) * 4  # noqa: E731

    def run(compile, seed: int = 5):
        return SpeculativeDecoder(target, draft, compile=compile).generate(
            prompts, rows(seed), SPEC
        )

    eager = run(False).token_ids
    assert run(False).token_ids == eager
    assert run(False, seed=6).token_ids != eager
    build_after(monkeypatch, 1, exported_tier["folder"])
    run("auto")  # builds the package after its first round
    packaged = run("auto").token_ids
    calls = exported_tier["package_calls"]
    assert run("auto").token_ids == packaged
    assert exported_tier["package_calls"] > calls  # both runs were the package's


# The whole-sequence law through a switch: tests/test_decode_exactness.py's set-up (V = 8, four
# new tokens, a peaky target and a close draft), every row switching after its first round.
VOCAB, NEW_TOKENS, ROWS = 8, 4, 6000
LAW_PROMPTS = ((3, 5), (1, 6, 2, 7, 0))
FALSE_ALARM = 1e-6


def test_the_law_holds_through_a_switch(exported_tier: dict, monkeypatch) -> None:
    target = random_gpt(VOCAB, seed=1, scale=1.5)
    draft = perturbed_copy(target, seed=2, mix=0.15)
    prompts = [list(LAW_PROMPTS[i % 2]) for i in range(2 * ROWS)]
    rows = [
        SamplingParams(1.0, seed=70_000_000 + i, max_new_tokens=NEW_TOKENS)
        for i in range(len(prompts))
    ]
    build_after(monkeypatch, 1, exported_tier["folder"])
    decoder = SpeculativeDecoder(target, draft, compile="auto")
    out = decoder.generate(prompts, rows, SpeculativeConfig(1, "probabilistic")).token_ids
    assert exported_tier["package_calls"] >= 2  # the package ran the later rounds
    laws = [sequence_law(target, list(prompt), NEW_TOKENS) for prompt in LAW_PROMPTS]
    assert law_fit(out, [i % 2 for i in range(len(out))], laws)[0] > FALSE_ALARM
