"""torch.compile with a voice: announce each graph as it compiles, so a cold start never looks hung.

Every distinct input shape (and static argument: K, the methods) of a compiled callable is its
own graph: we compile with dynamic=False so that each shape gets a static, fully specialised
kernel. The first call with a new shape is where Inductor spends seconds to a minute generating
and building C++ (or Triton); this wrapper prints a line before it and the time after it, and
each call of a compiled function is one guard check.
"""

from __future__ import annotations

import sys
import time
from typing import Callable

import torch
from torch.utils._pytree import tree_leaves, tree_map

from sampling.constraints import COMPILE_OPTIONS


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


class Announced:
    """Call `fn` (compiled or not); when `announce` is set, report the first call of each key."""

    seen: set[tuple] = set()  # shared: a graph compiled for one decoder serves the next
    # Said once, just before the first graph compiles: after the input was validated, so that
    # bad input stays a single error line.
    header = "warming up: compiling the decode graphs (cached on disk after the first run)"
    header_shown = False

    def __init__(self, fn: Callable, name: str, announce: bool, cuda_graphs: bool = False) -> None:
        self.fn, self.name, self.announce, self.cuda_graphs = fn, name, announce, cuda_graphs
        # Whether the last call compiled a new graph: its time is compile time, not a round's.
        self.compiled_last = False

    @property
    def compiled(self) -> bool:
        return self.announce  # compiled graphs are announced; eager code is not

    def __call__(self, *args, **kwargs):
        key = (self.name, *describe(args, kwargs))
        self.compiled_last = self.announce and key not in Announced.seen
        if not self.compiled_last:
            return self.run(*args, **kwargs)
        if not Announced.header_shown:
            print(Announced.header, file=sys.stderr, flush=True)
            Announced.header_shown = True
        print(
            f"  compiling {self.name} [{' '.join(key[1:])}] ...",
            end="",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        out = self.run(*args, **kwargs)
        print(f" {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
        Announced.seen.add(key)
        return out

    def run(self, *args, **kwargs):
        if not self.cuda_graphs:
            return self.fn(*args, **kwargs)
        # Under CUDA graphs an output lives in the graph's memory pool and the next replay
        # overwrites it: keep copies.
        torch.compiler.cudagraph_mark_step_begin()
        return tree_map(
            lambda t: t.clone() if isinstance(t, torch.Tensor) else t, self.fn(*args, **kwargs)
        )


def compile_fn(fn: Callable, name: str, enabled: bool, device: torch.device) -> Announced:
    """fullgraph, static shapes, sampling/'s Inductor options; on CUDA, CUDA graphs (one replay
    per call, as mode="reduce-overhead")."""
    if not enabled:
        return Announced(fn, name, announce=False)
    cuda = device.type == "cuda"
    options = {**COMPILE_OPTIONS["options"], **({"triton.cudagraphs": True} if cuda else {})}
    compiled = torch.compile(fn, **{**COMPILE_OPTIONS, "options": options})
    return Announced(compiled, name, announce=True, cuda_graphs=cuda)
