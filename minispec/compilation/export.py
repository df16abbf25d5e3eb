"""The build of one package: a function exported by torch.export for one set of inputs, then
compiled by AOTInductor into a package on disk, with its outputs' structure and its manifest.

Both sides build with this: a decoder in the foreground (AheadOfTime, compile="aot") and the
background builder (builder.py, compile="auto"), which has no decoder, only the request's
function, models and example inputs.
"""

from __future__ import annotations

import os
import pickle
import time
from pathlib import Path
from typing import Callable

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from minispec.compilation import announce, packages


class Flattened(torch.nn.Module):
    """fn as torch.export wants it: flat tensors in and out. The models' buffers come first, as
    inputs rather than constants, so that the package writes the live KV cache in place (the
    one eager prefill fills). Their parameters are read as attributes, so export lifts them as
    constants: the package carries its own copy of the weights, which Inductor's freezing
    prepacks. `leaves`: the arguments' pytree leaves; the tensors among them are inputs, the
    others (None: an absent host proposal) are static. fn returns its outputs flattened."""

    def __init__(
        self, fn: Callable, models: torch.nn.Module, names: list[str], leaves: list, spec: TreeSpec
    ) -> None:
        super().__init__()
        self.fn, self.names, self.leaves, self.spec = fn, names, leaves, spec
        # In a tuple, not as a submodule: export would lift a submodule's tensors as constants.
        self.models = (models,)

    def forward(self, *flat: torch.Tensor) -> tuple[torch.Tensor, ...]:
        buffers = dict(zip(self.names, flat))
        inputs = iter(flat[len(buffers) :])
        leaves = [next(inputs) if isinstance(x, torch.Tensor) else x for x in self.leaves]
        # tie_weights: a buffer shared by two modules (or by target and draft) is listed once.
        with torch.nn.utils.stateless._reparametrize_module(
            self.models[0], buffers, tie_weights=True
        ):
            return tuple(self.fn(*tree_unflatten(leaves, self.spec)))


def build_package(
    fn: Callable,
    models: torch.nn.Module,
    options: dict,
    dynamic: str | None,
    path: Path,
    buffers: dict[str, torch.Tensor],
    leaves: list,
    spec: TreeSpec,
    kwargs: dict,
) -> None:
    """Export fn(*args, **kwargs) (args: `leaves` unflattened by `spec`) with the models'
    `buffers` as its first inputs, compile it with Inductor's `options` into the package
    `path`, and write its .spec (the outputs' structure) and its manifest (checksum, build
    time) beside it. fn's argument `dynamic` (if any) is exported with a dynamic length. Then
    prune the folder."""
    start, cpu_start = time.perf_counter(), packages.cpu_seconds()
    out_specs = []  # the outputs' structure, known once traced

    def flat_fn(*args) -> list[torch.Tensor]:
        # Kept in a closure: export restores the module's attributes after tracing.
        out, out_spec = tree_flatten(fn(*args, **kwargs))
        out_specs.append(out_spec)
        return out

    flattened = Flattened(flat_fn, models, list(buffers), leaves, spec)
    tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
    position = announce.position_of(fn, dynamic)
    varying = announce.the_dynamic(tree_unflatten(leaves, spec), position)
    sizes = (None,) * len(buffers) + tuple(
        {0: torch.export.Dim.DYNAMIC} if x is varying else None for x in tensors
    )
    with packages.quiet_treespecs():
        program = torch.export.export(
            flattened, (*buffers.values(), *tensors), strict=False, dynamic_shapes=(sizes,)
        )
    path.parent.mkdir(parents=True, exist_ok=True)
    # Written under temporary names, then renamed: a process that stops half-way, or one that
    # compiles the same graph at the same time, never leaves a torn package. The package is
    # renamed last, so that its presence means its .spec and manifest are there.
    temp = path.with_suffix(f".{os.getpid()}.tmp")
    try:
        packages.compile_package(program, Path(f"{temp}.pt2"), options)
        Path(f"{temp}.spec").write_bytes(pickle.dumps(out_specs[-1]))
        times = time.perf_counter() - start, packages.cpu_seconds() - cpu_start
        packages.write_manifest(Path(f"{temp}.pt2"), Path(f"{temp}.spec"), path.stem, *times)
        for suffix in (".spec", ".json", ".pt2"):
            os.replace(f"{temp}{suffix}", path.with_suffix(suffix))
    finally:
        for suffix in (".spec", ".json", ".pt2"):
            Path(f"{temp}{suffix}").unlink(missing_ok=True)
    packages.prune(path.parent)
