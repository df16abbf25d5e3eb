"""Decoders that share model objects: the KV caches live on the models, so a model runs one
generation at a time, whichever decoder calls it; a call from inside an on_tokens callback on a
model in use raises at once (it would wait for itself forever)."""

from __future__ import annotations

import threading

import pytest
from _enumerate import one_thread, perturbed_copy, random_gpt  # noqa: F401 (a fixture)

from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig

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
