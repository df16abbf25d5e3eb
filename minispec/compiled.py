"""torch.compile with a voice: announce each graph as it compiles, so a cold start never looks hung.

Every distinct input shape of a compiled callable is its own graph (we compile with
dynamic=False so that each decode-step shape gets a static, fully specialised kernel). The
first call with a new shape is where Inductor spends seconds to a minute generating and
building C++ (or Triton); this wrapper prints a line before it and the time after it.
"""
from __future__ import annotations

import sys
import time
from typing import Callable

import torch

# A model forward sees T = 1, 2 and K+1 for every K a benchmark sweeps, plus prefill lengths:
# more than dynamo's default of 8 graphs per function.
if hasattr(torch._dynamo.config, "recompile_limit"):
    torch._dynamo.config.recompile_limit = 64
else:  # older torch
    torch._dynamo.config.cache_size_limit = 64


class Announced:
    """Call `fn` (compiled or not); when `announce` is set, report the first call of each shape."""

    seen: set[tuple] = set()  # shared: a graph compiled for one decoder serves the next
    # Said once, just before the first graph compiles: after the input was validated, so that
    # bad input stays a single error line.
    header = "warming up: compiling the decode graphs (cached on disk after the first run)"
    header_shown = False

    def __init__(self, fn: Callable, name: str, announce: bool) -> None:
        self.fn, self.name, self.announce = fn, name, announce

    def __call__(self, *args, **kwargs):
        if not self.announce:
            return self.fn(*args, **kwargs)
        key = (id(self.fn), self.name, *(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
        if key in Announced.seen:
            return self.fn(*args, **kwargs)
        if not Announced.header_shown:
            print(Announced.header, file=sys.stderr, flush=True)
            Announced.header_shown = True
        shapes = " ".join("x".join(map(str, k)) for k in key[2:])
        print(f"  compiling {self.name} [{shapes}] ...", end="", file=sys.stderr, flush=True)
        start = time.perf_counter()
        out = self.fn(*args, **kwargs)
        print(f" {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
        Announced.seen.add(key)
        return out


def compile_fn(fn: Callable, name: str, enabled: bool, mode: str | None = None) -> Announced:
    """fullgraph, static shapes; mode="reduce-overhead" (CUDA graphs) is chosen by the caller on GPU."""
    compiled = torch.compile(fn, fullgraph=True, dynamic=False, mode=mode) if enabled else fn
    return Announced(compiled, name, announce=enabled)
