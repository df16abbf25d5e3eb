"""The compile machinery: how a round function becomes the code that runs it, behind one call.

    announced = compile_round(fn, "round[draft_model]", compile, device, models, identity)
    out = announced(*args, **kwargs)

compile_round returns an Announced callable (announce.py): it runs the round and says, in one
line, when a call compiles a graph and how long it took, so a cold start never looks hung; it
also tells the loop whether the last call compiled (its time is not a round's) and whether it
ran compiled code. What runs behind it depends on the device and on `compile`:

- On the CPU, "aot": each graph an ahead-of-time AOTInductor package on disk (aot.py), built in
  the foreground on its first call and loaded by later processes in milliseconds. export.py
  builds one package; packages.py keeps the files (names, checksums, pruning).
- On the CPU, "auto": the same packages, built by a background process (builder.py) while the
  calls run eagerly; each package takes over at a round boundary once it is on disk.
- On the CPU, True: plain torch.compile, fullgraph, static shapes but one dynamic length.
- On CUDA (any of True, "aot", "auto"): Inductor's Triton kernels, each round captured once as
  a CUDA graph and replayed (cuda_graphs.py).
- False: eager.

Within this package a module imports its siblings as modules and calls `packages.load_runner`,
`builder.start_builder` and the like through them: a name is looked up where it is defined, at
call time, so one monkeypatch of the defining module reaches every caller.
"""

from __future__ import annotations

from typing import Callable

import torch

from minispec.compilation import announce, aot, cuda_graphs, packages
from minispec.compilation.announce import Announced  # re-exported: what the core holds
from sampling.constraints import jit

__all__ = ["Announced", "compile_round"]


def compile_round(
    fn: Callable,
    name: str,
    enabled: bool | str,
    device: torch.device,
    models: torch.nn.Module | None = None,
    identity: str = "",
    dynamic_arg: int | None = None,
) -> Announced:
    """fn compiled as `enabled` says on `device` (see above), with sampling/'s Inductor
    options, and announced. `models` holds every module fn runs and `identity` names what else
    fn bakes in (a package's name hashes both, see AheadOfTime). `dynamic_arg`: the index of a
    positional argument, a 1-D tensor whose length changes from call to call, compiled as a
    dynamic size (every other size static): one graph serves every length (under CUDA graphs,
    one recording per length)."""
    if not enabled:
        return announce.Announced(fn, name, announce=False)
    cuda = device.type == "cuda"
    if enabled in ("aot", "auto") and not cuda:
        folder = packages.aot_folder()
        background = enabled == "auto"
        ahead = aot.AheadOfTime(
            fn, models, f"{name} {identity}", folder, name, background, dynamic_arg
        )
        return announce.Announced(ahead, name, announce=True)
    if cuda:
        version = lambda: tuple(m.cache_version for m in models)  # noqa: E731
        graphs = cuda_graphs.CudaGraphs(fn, jit, buffers_version=version)
        return announce.Announced(graphs, name, announce=True)
    return announce.Announced(jit(fn), name, announce=True, dynamic_arg=dynamic_arg)
