"""The CUDA-graph back end (minispec/compilation/cuda_graphs.py), driven on the CPU with a
stand-in capture that counts captures and replays the recorded step eagerly: the flat boundary,
one capture per (B, width) over a run whose lengths change every round, and the whole-cache
masked attention CUDA uses giving the logits of the live-slot attention the CPU uses."""

from __future__ import annotations

from typing import NamedTuple

import torch
from _enumerate import one_thread, perturbed_copy, random_gpt  # noqa: F401

from minispec.compilation import Announced
from minispec.compilation.cuda_graphs import CudaGraphs
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig


class CountingCapture:
    """A capture without a GPU: warm up as the real one does, then 'record' the step; a replay
    reruns it and writes into the recorded outputs, as a CUDA graph writes its static ones."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, warm_up, step):
        self.count += 1
        warm_up()
        outputs = step()

        def replay() -> None:
            for static, new in zip(outputs, step()):
                static.copy_(new)

        return replay, outputs


class Pair(NamedTuple):
    a: torch.Tensor
    b: torch.Tensor


def test_flat_boundary_carries_a_namedtuple_in_place() -> None:
    """The compiled function sees and returns plain tensors; the carry comes back as the same
    NamedTuple type, held in the graph's own buffers, and the next call copies nothing in."""
    seen = []

    def fn(carry: Pair, step: torch.Tensor, *, scale: int):
        seen.append(all(isinstance(t, torch.Tensor) for t in (carry.a, carry.b, step)))
        return Pair(carry.a + step, carry.b * scale), carry.a.sum()[None]

    capture = CountingCapture()
    graphs = CudaGraphs(fn, compile=lambda f: f, capture=capture)
    carry = Pair(torch.zeros(3), torch.ones(3))
    for i in range(5):
        carry, total = graphs(carry, torch.ones(3), scale=2)
        assert isinstance(carry, Pair)
        assert total.item() == 3 * i  # the sum before this round's step
    assert carry.a.tolist() == [5.0] * 3 and carry.b.tolist() == [32.0] * 3
    assert capture.count == 1 and all(seen)
    graphs(carry, torch.ones(3), scale=3)  # a new static argument is a new graph
    graphs(Pair(torch.zeros(4), torch.ones(4)), torch.ones(4), scale=3)  # a new shape too
    assert capture.count == sum(graphs.captures.values()) == 3


def test_reallocated_buffers_are_recaptured() -> None:
    """A graph recorded the addresses of the buffers it reads (the KV caches): when they are
    reallocated (a new batch size) every graph is dropped and recaptured on its next call."""
    version = [0]
    capture = CountingCapture()
    graphs = CudaGraphs(
        lambda c, *, s: (c * s, c.sum()[None]), lambda f: f, capture, lambda: version[0]
    )
    graphs(torch.ones(2), s=2)
    graphs(torch.ones(2), s=2)
    version[0] += 1
    graphs(torch.ones(2), s=2)
    assert capture.count == 2 and len(graphs.graphs) == 1


def captured_decoder(target, draft, capture) -> SpeculativeDecoder:
    """A CPU decoder whose rounds run as the CUDA back end runs them: static shapes (the whole
    cache, masked) and CudaGraphs with the stand-in capture."""
    decoder = SpeculativeDecoder(target, draft, compile=False)
    decoder.static_shapes = True
    proposer, eager = decoder.compiled_round("draft_model")
    (key,) = decoder.rounds
    version = lambda: (target.cache_version, draft.cache_version)  # noqa: E731
    graphs = CudaGraphs(eager, lambda f: f, capture, version)  # the round, models bound
    decoder.rounds[key] = (proposer, Announced(graphs, "round", announce=False))
    return decoder


def test_one_capture_per_batch_and_width_over_a_long_run() -> None:
    """100+ rounds whose rows grow every round: at most one capture per (B, width) and the same
    tokens as the eager live-slot loop, at T = 0 and T = 1, fixed K and adaptive K. (Adaptive
    K picks widths from measured round times, so its T = 1 tokens differ from run to run: there
    only the captures are compared. At T = 0 every K gives the target's greedy tokens.)"""
    target = random_gpt(24, 0, scale=1.5, max_seq_len=256)
    draft = perturbed_copy(target, 1, 0.3)
    eager = SpeculativeDecoder(target, draft, compile=False)
    for temperature, k, batch in ((0.0, 3, 1), (1.0, 3, 2), (0.0, "auto", 2), (1.0, "auto", 2)):
        capture = CountingCapture()
        decoder = captured_decoder(target, draft, capture)
        prompts = [[1, 2, 3]] * batch
        params = [
            SamplingParams(temperature=temperature, seed=s, max_new_tokens=200)
            for s in range(batch)
        ]
        spec = SpeculativeConfig(k, "probabilistic" if temperature else "greedy")
        out = decoder.generate(prompts, params, spec)
        assert out.stats.rounds >= 40
        widths = len(spec.widths)
        assert capture.count <= widths, (k, capture.count)
        if k != "auto" or temperature == 0:
            assert out.token_ids == eager.generate(prompts, params, spec).token_ids


def test_whole_cache_masked_attention_equals_live_slots() -> None:
    """The logits of a verify forward over the whole cache (CUDA's static shapes) equal those
    over the live slots (the CPU's), for rows of different lengths."""
    model = random_gpt(24, 3, scale=1.5, max_seq_len=128)
    model.setup_cache(2)
    prompt = torch.randint(1, 24, (2, 40))
    model.prefill(prompt[:, :30])
    positions = torch.tensor([[29, 30, 31], [25, 26, 27]])
    tokens = prompt.gather(1, positions)
    live = model(tokens, positions, torch.arange(64))
    whole = model(tokens, positions, None)
    torch.testing.assert_close(live, whole, rtol=1e-5, atol=1e-5)


def test_graphs_depend_on_the_setting_not_on_call_history() -> None:
    """K = 0, then K = 4, then K = 0 on one decoder: two graphs, not three (a K = 0 round
    captured before the draft had a KV cache must not be captured again once it has one)."""
    target = random_gpt(24, 5, scale=1.5, max_seq_len=64)
    capture = CountingCapture()
    decoder = captured_decoder(target, perturbed_copy(target, 6, 0.3), capture)
    params = [SamplingParams(temperature=1.0, seed=0, max_new_tokens=8)]
    for k in (0, 4, 0):
        decoder.generate([[1, 2, 3]], params, SpeculativeConfig(k, "probabilistic"))
    assert capture.count == 2
