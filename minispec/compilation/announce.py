"""Compiling with a voice: announce each graph as it compiles, so a cold start never looks hung.

Every distinct input shape (and static argument: K, the methods) of a compiled callable is its
own graph: we compile with dynamic=False so that each shape gets a static, fully specialised
kernel. The one exception is the argument a callable names `dynamic`, a 1-D tensor whose
length changes from call to call (the round's key_positions, the KV cache slots attention
reads): its length is a dynamic size, so one graph serves every length. The first call with a
new shape is where Inductor spends seconds to a minute generating and building C++ (or
Triton); Announced prints a line before it and the time after it, and each call of a compiled
function is one guard check.
"""

from __future__ import annotations

import inspect
import sys
import time
from contextlib import contextmanager
from typing import Callable, Iterator

import torch
from torch.utils._pytree import tree_leaves

from minispec.compilation import packages
from minispec.compilation.cuda_graphs import CudaGraphs
from sampling.rules import DEFAULT_METHOD


def describe(args: tuple, kwargs: dict) -> tuple:
    """The distinct shapes of the tensors in args and the other kwargs' values: a graph's key."""
    shapes = tuple(
        dict.fromkeys(
            "x".join(map(str, t.shape)) for t in tree_leaves(args) if isinstance(t, torch.Tensor)
        )
    )  # distinct, in order
    statics = tuple(
        f"{k}={v}" for k, v in sorted(kwargs.items()) if not isinstance(v, torch.Tensor)
    )
    return shapes + statics


def position_of(fn: Callable, name: str | None) -> int | None:
    """Where a call passes fn's argument `name` by position (inspect.signature's order, which
    leaves out what a partial binds), None for no name: how each back end finds the dynamic
    argument by its name, once."""
    if name is None:
        return None
    names = list(inspect.signature(fn).parameters)
    if name not in names:
        raise ValueError(f"{fn!r} takes no argument {name!r}")
    return names.index(name)


def without_dynamic(args: tuple, position: int | None) -> tuple:
    """args with the dynamic one (if any) left out: what tells one graph from another."""
    if position is None or position >= len(args):
        return args
    return args[:position] + (None,) + args[position + 1 :]


def the_dynamic(args: tuple, position: int | None) -> torch.Tensor | None:
    """The dynamic argument, a 1-D tensor, or None (no dynamic argument, or not passed)."""
    return args[position] if position is not None and position < len(args) else None


class Announced:
    """Call `fn` (compiled); when `announce` is set, say in one line when a call compiles a
    graph, and how long it took. fn's argument `dynamic` (if any) is marked with a dynamic
    length (mark_dynamic): one graph, and one announcement, for every length."""

    seen: set[tuple] = set()  # shared: a graph compiled for one decoder serves the next

    def __init__(
        self, fn: Callable, name: str, announce: bool = True, dynamic: str | None = None
    ) -> None:
        self.fn, self.name, self.announce = fn, name, announce
        self.dynamic_at = position_of(fn, dynamic)
        # Whether the last call compiled a graph: its time is not a round's.
        self.compiled_last = False
        # Whether a call runs compiled code, one guard check: announced code does.
        self.ran_compiled = announce

    def __call__(self, *args, **kwargs):
        key = (self.name, *describe(without_dynamic(args, self.dynamic_at), kwargs))
        self.compiled_last = self.announce and key not in Announced.seen
        if (dynamic := the_dynamic(args, self.dynamic_at)) is not None:
            # Marked on every call: a call that compiles (a new K) must see the mark too.
            torch._dynamo.mark_dynamic(dynamic, 0)
        if not self.compiled_last:
            # The plain call inline: one frame less between the loop and the round.
            out = self.fn(*args, **kwargs)
        else:
            what = in_words(self.name, args, kwargs)
            try:
                with compiling(what):
                    out = self.fn(*args, **kwargs)
            except Exception as error:  # Inductor's, wrapping what its cache's writes raised
                if (problem := packages.compile_cache_problem(error)) is None:
                    raise
                # The user's to fix, so one line (an OSError, as the front door prints it),
                # not the compiler's traceback.
                raise OSError(f"compiling {what}: {problem}") from None
            Announced.seen.add(key)
        if isinstance(self.fn, CudaGraphs):  # a new decoder captures its own graphs
            self.compiled_last = self.fn.compiled_last
        return out


@contextmanager
def compiling(what: str) -> Iterator[None]:
    """The one line a foreground compile prints: what, then how long it took, or that it
    stopped (the line ends, so whatever is said next has a line of its own)."""
    print(f"  compiling {what} ...", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    try:
        yield
    except BaseException:
        print(" stopped", file=sys.stderr, flush=True)
        raise
    print(f" {time.perf_counter() - start:.0f} s", file=sys.stderr, flush=True)


def in_words(name: str, args: tuple, kwargs: dict, widths: tuple[int, ...] = ()) -> str:
    """A graph as a user knows it, e.g. "round, B = 1, K = 4, draft model, greedy drafts";
    `widths`: several graphs that differ only in K ("K = 0, 2, 4, 8")."""
    kind, _, proposer = name.partition("[")
    words = [kind]
    tensors = [t for t in tree_leaves(args) if isinstance(t, torch.Tensor) and t.dim()]
    if tensors:
        words.append(f"B = {tensors[0].shape[0]}")
    if "num_speculative_tokens" in kwargs:
        k = ", ".join(map(str, widths or (kwargs["num_speculative_tokens"],)))
        words.append(f"K = {k}")
    if proposer and max(widths or (kwargs.get("num_speculative_tokens", 1),)):
        words.append(proposer.rstrip("]").replace("_", " "))
        settings = kwargs.get("settings")
        if settings is not None:
            words.append(f"{settings.draft_sample_method} drafts")
        method = getattr(settings, "rejection_sample_method", DEFAULT_METHOD)
        if method != DEFAULT_METHOD:
            words.append(f"{method} verification")
    return ", ".join(words)
