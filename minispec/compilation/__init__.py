"""The compile machinery: how a round function becomes the code that runs it, behind one call.

    compiled = compile_round(fn, "round[draft_model]", compile, device, models, identity,
                             dynamic="key_positions")
    out = compiled(*args, **kwargs)

fn takes its inputs by position (pytrees of tensors and Nones) and its static settings by
keyword; `dynamic` names the one input whose length changes from call to call. What
compile_round returns is Compiled: it runs fn and says whether its last call compiled (its
time is not a round's) and whether it ran compiled code. A compiled call says, in one line,
when it compiles a graph and how long that took, so a cold start never looks hung. What runs
behind it depends on the device and on `compile`:

- On the CPU, "aot": each graph an ahead-of-time AOTInductor package on disk (aot.py), built in
  the foreground on its first call and loaded by later processes in milliseconds. export.py
  builds one package; packages.py keeps the files (names, checksums, pruning).
- On the CPU, "auto": the same packages, built by a background process (builder.py) while the
  calls run eagerly; each package takes over at a round boundary once it is on disk.
- On the CPU, True: plain torch.compile, fullgraph, static shapes but the dynamic length
  (announce.py's Announced says when a graph compiles).
- On CUDA (any of True, "aot", "auto"): Inductor's Triton kernels, each round captured once as
  a CUDA graph and replayed (cuda_graphs.py).
- False: eager (Eager).

Within this package a module imports its siblings as modules and calls `packages.load_runner`,
`builder.start_builder` and the like through them: a name is looked up where it is defined, at
call time, so one monkeypatch of the defining module reaches every caller.
"""

from __future__ import annotations

from functools import partial
from typing import Callable, Protocol

import torch

from minispec.compilation import announce, aot, cuda_graphs, packages
from minispec.compilation.announce import Announced
from sampling.constraints import jit

__all__ = ["Announced", "Compiled", "Eager", "compile_round"]


class Compiled(Protocol):
    """What compile_round returns: fn, run as compiled, and what its last call did."""

    compiled_last: bool  # the last call compiled (or loaded) a graph: its time is not a round's
    ran_compiled: bool  # the last call ran compiled code (one guard check), not eager code

    def __call__(self, *args, **kwargs): ...


class Eager(partial):
    """fn as compile_round returns it when compiling is off: a partial that binds nothing, so a
    call goes straight to fn (no Python frame between the caller and fn), and none compiles."""

    compiled_last = False
    ran_compiled = False


def compile_round(
    fn: Callable,
    name: str,
    enabled: bool | str,
    device: torch.device,
    models: torch.nn.Module | None = None,
    identity: str = "",
    dynamic: str | None = None,
) -> Compiled:
    """fn compiled as `enabled` says on `device` (see above), with sampling/'s Inductor
    options. `models` holds every module fn runs and `identity` names what else fn bakes in (a
    package's name hashes both, see AheadOfTime). `dynamic`: the name of fn's argument, a 1-D
    tensor whose length changes from call to call, compiled as a dynamic size (every other
    size static): one graph serves every length (under CUDA graphs, where the round passes
    None, there is none)."""
    if not enabled:
        return Eager(fn)
    cuda = device.type == "cuda"
    if enabled in ("aot", "auto") and not cuda:
        folder, background = packages.aot_folder(), enabled == "auto"
        return aot.AheadOfTime(fn, models, f"{name} {identity}", folder, name, background, dynamic)
    # Importing Dynamo makes Inductor's cache folder: one under a file is the user's to fix.
    if (problem := packages.compile_cache_problem(OSError())) is not None:
        raise OSError(problem)
    if cuda:
        version = lambda: tuple(m.cache_version for m in models)  # noqa: E731
        graphs = cuda_graphs.CudaGraphs(fn, jit, buffers_version=version)
        return announce.Announced(graphs, name)
    return announce.Announced(jit(fn), name, dynamic=dynamic)
