"""The GPU back end: each round graph compiled by Inductor (Triton kernels), then captured once
as a CUDA graph per static shape and replayed every round.

A small model's round on a large GPU is launch-bound: a few hundred kernels of microseconds
each, where launching them from Python costs more than running them. A CUDA graph launches the
whole round at once. A graph replays fixed addresses and shapes, so:

- Shapes are static on CUDA: the round attends over the whole KV cache with a mask (the
  decoder passes no key positions), so one capture serves every round of a (B, K, methods)
  setting, whatever the rows' lengths.
- The round's inputs live in buffers the graph owns. A call copies its arguments in, unless an
  argument already is that buffer: the round's carried state (its first argument) is written
  back into those buffers inside the graph, so consecutive rounds of one graph copy nothing.
- Outputs other than the carried state live in the graph's memory and the next replay
  overwrites them: the caller reads them (the snapshot) before its next call.

The capture is by hand (torch.cuda.graph around the compiled function) rather than
torch.compile's mode="reduce-overhead", so that a capture happens exactly once per key and the
count is ours to report and to test; `capture` is a parameter so that the CPU tests drive this
code with a stand-in that counts captures.
"""

from __future__ import annotations

from collections import Counter
from typing import Callable

import torch
from torch.utils._pytree import tree_flatten, tree_leaves, tree_unflatten

Capture = Callable[[Callable[[], tuple], Callable[[], tuple]], tuple[Callable[[], None], tuple]]


def capture_cuda_graph(
    warm_up: Callable[[], tuple], step: Callable[[], tuple], pool=None
) -> tuple[Callable[[], None], tuple]:
    """Run `warm_up` twice on a side stream (the first call compiles; Inductor's autotuning and
    the allocator settle), then record `step` into a CUDA graph. Returns the replay and the
    graph's output tensors (static: each replay rewrites them)."""
    stream = torch.cuda.Stream()
    stream.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(stream):
        for _ in range(2):
            warm_up()
    torch.cuda.current_stream().wait_stream(stream)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        outputs = step()
    return graph.replay, outputs


class Captured:
    """One graph: its own input buffers, its recorded step, its static outputs."""

    def __init__(self, flat_fn: Callable, leaves: list, num_carried: int, capture: Capture):
        # Leaves that are not tensors are static, part of the key, never copied.
        self.inputs = [x.clone() if isinstance(x, torch.Tensor) else x for x in leaves]
        self.num_carried = num_carried

        def compute() -> tuple:
            return flat_fn(*self.inputs)

        def step() -> tuple:
            outputs = compute()
            for buffer, new in zip(self.inputs[:num_carried], outputs[:num_carried]):
                buffer.copy_(new)  # the next round's state, in place, inside the graph
            return tuple(outputs[num_carried:])

        # Warm-up calls compute the round without writing its state back: each recomputes the
        # same round from the same inputs, so the KV cache entries it writes are the very ones
        # the first replay writes again (the cache is addressed by position).
        self.replay, self.outputs = capture(compute, step)

    def __call__(self, leaves: list) -> list:
        for buffer, x in zip(self.inputs, leaves):
            if isinstance(x, torch.Tensor) and x is not buffer:
                buffer.copy_(x)
        self.replay()
        return [*self.inputs[: self.num_carried], *self.outputs]


class CudaGraphs:
    """`fn(carry, *rest, **statics) -> (new_carry, *tensors)` run as captured CUDA graphs, one
    per key: the shapes, dtypes and Nones of the arguments and the static keyword arguments.
    `new_carry` has the structure of `carry` (a NamedTuple of tensors: the round's state).
    `compile` turns the flat function into the kernels to capture (torch.compile on CUDA; the
    identity in tests). The compiled function sees plain tensors in and returns a flat tuple:
    the NamedTuples are taken apart and rebuilt here, outside compiled code."""

    def __init__(
        self,
        fn: Callable,
        compile: Callable[[Callable], Callable],
        capture: Capture = capture_cuda_graph,
        buffers_version: Callable[[], object] = lambda: None,
    ) -> None:
        """`buffers_version()` changes whenever the buffers fn reads outside its arguments (the
        models' KV caches) are reallocated: a graph recorded their old addresses, so every
        graph is then dropped and recaptured on its next call."""
        self.fn, self.compile, self.capture = fn, compile, capture
        self.buffers_version, self.version = buffers_version, buffers_version()
        self.graphs: dict[tuple, Captured] = {}  # the graphs of the current buffers
        self.captures: Counter = Counter()  # captures per key, over this object's life
        self.compiled_last = False  # whether the last call captured (and compiled) a graph

    def __call__(self, *args, **statics):
        leaves, in_spec = tree_flatten(args)
        carry_spec = tree_flatten(args[0])[1]
        key = graph_key(in_spec, leaves, statics)
        if (version := self.buffers_version()) != self.version:
            self.graphs.clear()  # their memory goes back to the allocator
            self.version = version
        self.compiled_last = key not in self.graphs
        if self.compiled_last:
            self.graphs[key] = self.build(in_spec, carry_spec.num_leaves, leaves, statics)
            self.captures[key] += 1
        outputs = self.graphs[key](leaves)
        num_carried = carry_spec.num_leaves
        return (tree_unflatten(outputs[:num_carried], carry_spec), *outputs[num_carried:])

    def build(self, in_spec, num_carried: int, leaves: list, statics: dict) -> Captured:
        fn = self.fn

        def flat_fn(*flat: torch.Tensor | None) -> tuple[torch.Tensor, ...]:
            new_carry, *tensors = fn(*tree_unflatten(list(flat), in_spec), **statics)
            return (*tree_leaves(new_carry), *tensors)

        return Captured(self.compile(flat_fn), leaves, num_carried, self.capture)


def graph_key(in_spec, leaves: list, statics: dict) -> tuple:
    """What makes a new graph: the arguments' structure (which are None), each tensor's shape
    and dtype, and the static arguments; never values, which a call copies into its buffers."""
    shapes = tuple((tuple(x.shape), x.dtype) if isinstance(x, torch.Tensor) else x for x in leaves)
    return in_spec, shapes, tuple(sorted((k, repr(v)) for k, v in statics.items()))
