"""Decoders that share model objects: the KV caches live on the models (and on a feature head
two decoders share), so a model runs one generation at a time, whichever decoder calls it; a
call that would wait for a generation inside its on_tokens callback raises at once, from the
callback's thread or one it started (it would wait forever for a callback waiting for it)."""

from __future__ import annotations

import copy
import threading
import time
from functools import partial

import pytest
from _enumerate import one_thread, perturbed_copy, random_gpt, random_head  # noqa: F401

from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from model.head import FeatureHead

pytestmark = pytest.mark.usefixtures("one_thread")

PROMPTS = [[[1, 2, 3]], [[4, 5, 6, 7, 1]], [[2, 9]], [[7, 7, 3, 1]]]


def pair():
    target = random_gpt(32, seed=0, scale=1.5, max_seq_len=64)
    return target, perturbed_copy(target, 1, 0.15)


def run(decoder: SpeculativeDecoder, prompt: list[list[int]], on_tokens=None) -> list[int]:
    params = [SamplingParams(temperature=0.0, max_new_tokens=40)]
    return decoder.generate(prompt, params, SpeculativeConfig(4), on_tokens).token_ids[0]


def test_two_decoders_on_one_model_in_threads_give_the_sequential_text() -> None:
    target, draft = pair()
    decoders = [SpeculativeDecoder(target, draft, compile=False) for _ in range(2)]
    expected = [run(decoders[0], p) for p in PROMPTS]
    got: dict[int, list[int]] = {}

    def work(i: int) -> None:
        for _ in range(3):  # several calls each, so that rounds of different calls interleave
            got[i] = run(decoders[i % 2], PROMPTS[i])

    threads = [threading.Thread(target=work, args=(i,)) for i in range(len(PROMPTS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    assert [got.get(i) for i in range(len(PROMPTS))] == expected


@pytest.mark.parametrize("same_decoder", [True, False])
def test_generate_from_inside_on_tokens_on_a_model_in_use_raises(same_decoder: bool) -> None:
    target, draft = pair()
    outer = SpeculativeDecoder(target, draft, compile=False)
    inner = outer if same_decoder else SpeculativeDecoder(target, draft, compile=False)
    errors: list[BaseException] = []

    def callback(row, ids, origins) -> None:
        if not errors:
            try:
                run(inner, PROMPTS[1])
            except RuntimeError as exc:
                errors.append(exc)

    finished = threading.Event()

    def outer_call() -> None:
        run(outer, PROMPTS[0], callback)
        finished.set()

    thread = threading.Thread(target=outer_call, daemon=True)
    thread.start()
    assert finished.wait(timeout=60), "the nested call hung"
    assert errors and "on_tokens" in str(errors[0]) and "\n" not in str(errors[0])
    # Afterwards the models are free again: the same call runs.
    assert run(inner, PROMPTS[1]) == run(outer, PROMPTS[1])


@pytest.mark.parametrize("same_decoder", [True, False])
def test_generate_from_a_thread_that_on_tokens_joins_raises_instead_of_hanging(
    same_decoder: bool,
) -> None:
    """The callback waits for a thread whose call waits for the callback's generation: that
    call is refused at once, so both end."""
    target, draft = pair()
    outer = SpeculativeDecoder(target, draft, compile=False)
    inner = outer if same_decoder else SpeculativeDecoder(target, draft, compile=False)
    errors: list[BaseException] = []
    alive: list[bool] = []

    def inner_call() -> None:
        try:
            run(inner, PROMPTS[1])
        except RuntimeError as exc:
            errors.append(exc)

    def callback(row, ids, origins) -> None:
        if not alive:
            thread = threading.Thread(target=inner_call, daemon=True)
            thread.start()
            thread.join(timeout=10)  # the bug, back, would wait here and let it run after
            alive.append(thread.is_alive())

    run(outer, PROMPTS[0], callback)
    assert alive == [False], "the call from the callback's thread waited for the callback"
    assert errors and "on_tokens" in str(errors[0]) and "\n" not in str(errors[0])


def shared_head_decoders(loads: list[int]) -> list[SpeculativeDecoder]:
    """Two decoders on two copies of one target whose loaders give one head (counted in
    `loads`), read by their first call that drafts with it."""
    target = pair()[0]
    head = random_head(target, seed=3, scale=2.0)

    def load() -> FeatureHead:
        loads.append(1)
        time.sleep(0.05)  # a slow file: a second thread arrives while the first reads it
        return head

    return [
        SpeculativeDecoder(t, compile=False, head=load) for t in (target, copy.deepcopy(target))
    ]


def head_run(decoder: SpeculativeDecoder, prompt: list[list[int]]) -> list[int]:
    params = [SamplingParams(temperature=1.0, seed=5, max_new_tokens=40)]
    spec = SpeculativeConfig(4, proposer="feature_head")
    return decoder.generate(prompt, params, spec).token_ids[0]


def at_once(calls: list) -> list:
    """Each call's result, the calls started together, one thread each."""
    barrier, results = threading.Barrier(len(calls)), [None] * len(calls)

    def work(i: int) -> None:
        barrier.wait()
        results[i] = calls[i]()

    threads = [threading.Thread(target=work, args=(i,), daemon=True) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
        assert not t.is_alive()
    return results


def test_two_decoders_sharing_a_loaded_head_in_threads_give_the_sequential_tokens() -> None:
    """The head's cache is a call's working memory as the models' are: it is locked with them."""
    prompts = PROMPTS[0], [[4, 5, 6, 7, 1, 3, 2]]
    expected = [head_run(d, p) for d, p in zip(shared_head_decoders([]), prompts)]
    for _ in range(2):  # without the head's lock, each trial differed
        decoders = shared_head_decoders([])
        got = at_once([partial(head_run, d, p) for d, p in zip(decoders, prompts)])
        assert got == expected


def test_a_head_asked_for_by_two_threads_at_once_is_loaded_once() -> None:
    loads: list[int] = []
    decoder = shared_head_decoders(loads)[0]
    first, second = at_once([partial(head_run, decoder, PROMPTS[0])] * 2)
    assert loads == [1] and first == second
