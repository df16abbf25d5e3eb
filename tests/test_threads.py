"""The prefill runs on every core this process may use and the rounds on the caller's thread
count, which is back after the prefill, also when the prefill raises (minispec/machine.py)."""

from __future__ import annotations

import os

import pytest
import torch
from _enumerate import (
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
)

from minispec.decode import SpeculativeDecoder
from minispec.machine import prefill_threads, usable_cores
from minispec.params import SamplingParams, SpeculativeConfig

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def two_cores(monkeypatch):
    """This process may use two CPUs, whatever the machine has."""
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 1}, raising=False)


def decoder() -> SpeculativeDecoder:
    target = random_gpt(32, seed=0, scale=1.5, max_seq_len=32)
    return SpeculativeDecoder(target, perturbed_copy(target, 1, 0.15), compile=False)


def first_product(model: torch.nn.Module) -> torch.nn.Module:
    """The first matrix product of every call of the model, its prefill (GPT.prefill) included."""
    return model.blocks[0].attn.wqkv


def thread_counts_seen(model: torch.nn.Module) -> list[int]:
    """torch's thread count at each call of `model`, in order."""
    seen: list[int] = []
    first_product(model).register_forward_hook(lambda *_: seen.append(torch.get_num_threads()))
    return seen


def generate(d: SpeculativeDecoder, k: int) -> None:
    params = [SamplingParams(temperature=1.0, seed=i, max_new_tokens=6) for i in range(2)]
    d.generate([[1, 2, 3], [4, 5]], params, SpeculativeConfig(k))


@pytest.mark.parametrize("k", [0, 2])
def test_the_prefill_runs_on_every_core_and_the_rounds_on_the_callers_count(two_cores, k):
    d = decoder()
    target, draft = thread_counts_seen(d.target), thread_counts_seen(d.draft)
    generate(d, k)
    # the first call of each model is its prefill; every later one is in a round
    assert target[0] == 2 and len(target) > 1 and set(target[1:]) == {1}
    if k:
        assert draft[0] == 2 and len(draft) > 1 and set(draft[1:]) == {1}
    else:
        assert draft == []  # K = 0 leaves the draft alone
    assert torch.get_num_threads() == 1


def test_the_callers_thread_count_is_back_after_a_prefill_that_raises(two_cores):
    d = decoder()
    seen = []

    def fail(*_):
        seen.append(torch.get_num_threads())
        raise RuntimeError("a forward failed")

    first_product(d.target).register_forward_hook(fail)
    with pytest.raises(RuntimeError, match="a forward failed"):
        generate(d, 0)
    assert seen == [2]  # it failed inside the prefill, on both cores
    assert torch.get_num_threads() == 1


def test_usable_cores_is_the_affinity_where_there_is_one(monkeypatch):
    monkeypatch.setattr(os, "sched_getaffinity", lambda pid: {0, 2, 5}, raising=False)
    assert usable_cores() == 3
    monkeypatch.delattr(os, "sched_getaffinity", raising=False)
    monkeypatch.setattr(os, "cpu_count", lambda: 7)
    assert usable_cores() == 7


def test_prefill_threads_leaves_the_thread_count_alone_off_the_cpu(two_cores):
    with prefill_threads(torch.device("cuda"), None):  # a device object needs no GPU
        assert torch.get_num_threads() == 1
    with prefill_threads(torch.device("cpu"), None):
        assert torch.get_num_threads() == 2
    assert torch.get_num_threads() == 1


def test_a_decoder_told_one_prefill_thread_keeps_its_prefill_on_one_core(two_cores):
    """The setting for a shared machine, where a busy second core stalls every parallel step."""
    d = decoder()
    d.prefill_threads = 1
    target = thread_counts_seen(d.target)
    generate(d, 2)
    assert set(target) == {1}


@pytest.mark.parametrize("bad", [0, -1, 1.5, True, "2"])
def test_a_bad_prefill_thread_count_is_refused(bad):
    target = random_gpt(32, seed=0, max_seq_len=32)
    with pytest.raises(ValueError, match="prefill_threads must be an int >= 1 or None"):
        SpeculativeDecoder(target, compile=False, prefill_threads=bad)


def test_the_prefill_computes_the_same_bits_on_one_core_and_on_two(monkeypatch):
    """On the shipped pair, so that the products are large enough to run on both threads: the
    KV caches the prefill writes are bitwise equal, and so a seeded request's tokens are the
    same whatever the core count. This holds for this torch build's BLAS, which splits a product
    by rows; one that splits the inner dimension would round differently and fail here."""
    import minispec.machine
    from minispec.api import load_decoder
    from model import tokenizer

    d = load_decoder(compile=False)
    text = "def add(a, b):\n    return a + b\n\n\nclass Point:\n    x: int = 0\n" * 6
    prompts = [tokenizer.encode(text[:n]) for n in (190, 250, 300, 120)]
    params = [SamplingParams(temperature=1.0, seed=i, max_new_tokens=12) for i in range(4)]
    caches, outputs = [], []
    for cores in (1, 2):
        monkeypatch.setattr(minispec.machine, "usable_cores", lambda: cores)
        d.prefill(prompts, params, 2)
        written = max(map(len, prompts)) - 1  # the slots the prefill writes; later ones are stale
        caches.append(
            [
                kv[:, :, :written].clone()
                for m in (d.target, d.draft)
                for block in m.blocks
                for kv in (block.attn.kv_cache.k, block.attn.kv_cache.v)
            ]
        )
        outputs.append(d.generate(prompts, params, SpeculativeConfig(0)).token_ids)
    assert all(torch.equal(a, b) for a, b in zip(*caches))
    assert outputs[0] == outputs[1] and all(len(row) == 12 for row in outputs[0])
