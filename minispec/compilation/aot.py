"""Ahead of time, on the CPU: each graph of a function as an AOTInductor package on disk, which a
later process loads in milliseconds where torch.compile would trace the function again with
Dynamo (seconds per graph, even with Inductor's cache warm).

compile="aot" compiles a graph's package in the foreground on its first call; compile="auto"
runs the call eagerly while the background builder (builder.py) compiles it, and the package
takes over once it is on disk. export.py builds a package, packages.py keeps the files.
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
from contextlib import suppress
from pathlib import Path
from typing import Callable

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_unflatten

from minispec.compilation import announce, export, packages
from sampling.constraints import COMPILE_OPTIONS

# Freezing prepacks the weights for the CPU's GEMM (docs/benchmarks.md: what that saves a round).
PACKAGE_OPTIONS = {**COMPILE_OPTIONS["options"], "freezing": True}


class AheadOfTime:
    """fn as one AOTInductor package per graph, kept in `folder` and loaded by later processes.
    A package's file name hashes everything its code depends on (see package_name), so a
    changed model, option or source file makes a new package rather than loading a stale one.
    Positional arguments are pytrees of tensors (and Nones); keyword arguments are static,
    baked into the graph. fn's argument `dynamic` (if any), a 1-D tensor, is exported with a
    dynamic length (a torch.export Dim): one package serves every length.

    In the foreground (background=False) a graph's first call exports and compiles its package
    and then runs it. In the background, a graph whose package is not on disk runs eagerly
    while a separate process builds the package (builder.py); each later call checks for it
    (one stat) and the package takes over once it is there. A package that fails its check
    (check_package) is removed, rebuilt, and said so in one line; an unwritable folder is said
    in one line too, and the calls then run eagerly. A full disk met while building a package
    is such a folder in both modes, compile="aot" included: one line saying "no space left on
    device", then eager calls (uncompiled, so not the bitwise-repeatable tier "aot" promises),
    rather than an error that stops a decode the eager tier can finish. It announces its own
    compiles: it knows whether a call built, loaded or ran eagerly."""

    def __init__(
        self,
        fn: Callable,
        models: torch.nn.Module,
        identity: str,
        folder: Path,
        name: str = "",
        background: bool = False,
        dynamic: str | None = None,
    ) -> None:
        self.fn, self.models, self.identity, self.folder = fn, models, identity, folder
        self.name, self.background, self.options = name, background, dict(PACKAGE_OPTIONS)
        self.dynamic, self.dynamic_at = dynamic, announce.position_of(fn, dynamic)
        self.packages: dict[tuple, tuple[Callable, TreeSpec]] = {}  # per graph key
        self.exports = 0  # packages this object exported and compiled (loaded ones not counted)
        self.waiting: dict[tuple, Path] = {}  # background: each graph's package, once asked
        self.requested: set[Path] = set()  # background: the packages asked of a builder
        self.compiled_last = False  # whether the last call compiled or loaded its package
        self.ran_compiled = False  # whether the last call ran a package (else, eagerly)
        self.unwritable: str | None = None  # why the folder cannot be written; then eager
        self.digest: str | None = None  # weights_digest, once taken
        self.current_buffers: dict[str, torch.Tensor] = {}
        self.buffer_shapes: tuple = ()  # (name, shape) of each of current_buffers
        self.buffers_version: tuple | None = None  # the models' cache_version when last read
        self.widths: tuple[int, ...] = ()  # the Ks the coming calls may run (expect)

    def expect(self, widths: tuple[int, ...]) -> None:
        # A graph asked of the builder brings these widths' graphs with it, in one process.
        self.widths = widths

    def __call__(self, *args, **kwargs):
        buffers = self.buffers()
        leaves, spec = tree_flatten(args)
        key = self.key_of(leaves, kwargs, announce.the_dynamic(args, self.dynamic_at))
        self.compiled_last = self.ran_compiled = False
        if key not in self.packages and self.unwritable is None:
            find = self.background_package if self.background else self.foreground_package
            with packages.quiet_treespecs():
                package = find(key, buffers, leaves, spec, kwargs)
            if package is None:
                return self.fn(*args, **kwargs)  # the eager tier
            self.packages[key] = package
            self.compiled_last = True
        if key not in self.packages:
            return self.fn(*args, **kwargs)
        run, out_spec = self.packages[key]
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        self.ran_compiled = True
        return tree_unflatten(run([*buffers.values(), *tensors]), out_spec)

    def foreground_package(
        self, key: tuple, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict
    ) -> tuple[Callable, TreeSpec] | None:
        """The graph's package, loaded, or else compiled here and now (announced, timed)."""
        path = self.paths([*buffers.values(), *leaves], spec, kwargs)[0]
        if packages.present(path) and (package := self.load(path)) is not None:
            return package
        if self.cannot_write():
            return None
        what = announce.in_words(self.name, tree_unflatten(leaves, spec), kwargs)
        try:
            with announce.compiling(what):
                self.build(path, buffers, leaves, spec, kwargs)
        except Exception as error:  # Inductor wraps what its writer raised in its own error
            if packages.no_space(error) is None:
                raise
            self.cache_off(packages.write_problem(error))
            return None
        return self.load(path)

    def background_package(
        self, key: tuple, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict
    ) -> tuple[Callable, TreeSpec] | None:
        """The graph's package once it is on disk, else None (the call runs eagerly). The first
        call of a graph whose package is missing asks a builder for it and for its siblings
        (the other widths of an adaptive round), in the order the run needs them."""
        path = self.waiting.get(key)
        if path is None:
            path = self.waiting[key] = self.paths([*buffers.values(), *leaves], spec, kwargs)[0]
        if packages.present(path):
            package = self.load(path)
            if package is not None:
                self.announce_ready(path, leaves, spec, kwargs)
                return package
            self.requested.discard(path)  # removed: build it again
        if path not in self.requested and self.failed_before(path, leaves, spec, kwargs):
            self.requested.add(path)  # said once; the calls stay eager
        if path not in self.requested and not self.cannot_write():
            self.request(buffers, leaves, spec, kwargs)
        return None

    def failed_before(self, path: Path, leaves: list, spec: TreeSpec, kwargs: dict) -> bool:
        """Whether a builder already failed to build this package (the same name is the same
        code, so it would fail again): then one line says so and how to retry."""
        reason = self.failure_noted(path)
        if reason is None:
            return False
        what = announce.in_words(self.name, tree_unflatten(leaves, spec), kwargs)
        print(
            f"  compiling {what} failed in the background ({reason[:100]}; the folder's "
            f"builder.log has the rest): running eagerly; delete "
            f"{packages.failed_marker(path)} to try again",
            file=sys.stderr,
            flush=True,
        )
        return True

    def failure_noted(self, path: Path) -> str | None:
        """The builder's note that building `path` failed, or None. A marker the builder did
        not write is said in one line and removed: its package is asked for again rather than
        kept eager for good on the word of a file that says nothing."""
        try:
            return packages.read_marker(path)
        except ValueError as error:
            packages.clear(packages.failed_marker(path))
            print(f"  {error}: removed, building its package again", file=sys.stderr, flush=True)
            return None

    def request(self, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict) -> None:
        """Queue this graph and its siblings not yet on disk for the builder, with one line
        saying so; an unwritable folder is said instead, and the calls stay eager."""
        # Imported on first use, not at the top: `python -m minispec.compilation.builder`
        # imports this package first, and the builder must not be imported by then (runpy
        # would run a second copy of it as __main__, with a warning).
        from minispec.compilation import builder

        flat = [*buffers.values(), *leaves]
        siblings = [
            (self.paths(flat, spec, kw)[0], kw) for kw in sibling_kwargs(kwargs, self.widths)
        ]
        todo = [
            (p, kw)
            for p, kw in siblings
            if not packages.present(p) and p not in self.requested and not self.failure_noted(p)
        ]
        if not todo:
            return
        widths = tuple(sorted(kw["num_speculative_tokens"] for _, kw in todo if len(todo) > 1))
        args = tree_unflatten(leaves, spec)
        try:
            builder.request_build(
                self.folder, self.fn, self.models, self.options, self.dynamic, args, todo
            )
        except OSError as error:
            self.cache_off(packages.write_problem(error))
            return
        except ValueError as error:  # the builder's settings: no background compile, said once
            self.unwritable = str(error)
            print(f"  {error}: running eagerly", file=sys.stderr, flush=True)
            return
        self.requested.update(p for p, _ in todo)
        what = announce.in_words(self.name, args, todo[0][1], widths)
        print(f"  compiling {what} in the background (eager until ready)", file=sys.stderr)

    def announce_ready(self, path: Path, leaves: list, spec: TreeSpec, kwargs: dict) -> None:
        """One line when a package this object asked for takes over: what, and how long the
        builder took."""
        if path in self.requested:
            seconds = packages.read_manifest(path).get("seconds")
            # Read again after the check: another process may have replaced the manifest since.
            took = f" in {seconds:.0f} s" if isinstance(seconds, (int, float)) else ""
            what = announce.in_words(self.name, tree_unflatten(leaves, spec), kwargs)
            print(f"  {what}: compiled{took}, now in use", file=sys.stderr)

    def cannot_write(self) -> bool:
        """Whether the folder cannot be written (said once, in one line naming it)."""
        if self.unwritable is None and (reason := packages.unwritable(self.folder)) is not None:
            self.cache_off(reason)
        return self.unwritable is not None

    def cache_off(self, reason: str) -> None:
        """The folder cannot be written (`reason`): said in one line; every call runs eagerly
        from now on."""
        self.unwritable = reason
        print(packages.cache_off_line(self.folder, reason), file=sys.stderr, flush=True)

    def buffers(self) -> dict[str, torch.Tensor]:
        """The models' buffers, the packages' first inputs. setup_cache replaces the KV cache
        buffers (a new batch size) and counts it in the model's cache_version, so they are read
        again only then; a model without that counter is read on every call."""
        version = tuple(getattr(m, "cache_version", None) for m in self.models.children())
        if version != self.buffers_version or None in version:
            self.current_buffers = dict(self.models.named_buffers())
            self.buffer_shapes = tuple((n, b.shape) for n, b in self.current_buffers.items())
            self.buffers_version = version
        return self.current_buffers

    def key_of(self, leaves: list, kwargs: dict, dynamic: torch.Tensor | None) -> tuple:
        """What tells this graph's package from another's: every input's shape (but the
        `dynamic` one's length) and dtype (or value), the static arguments, and the models'
        buffers. The buffers matter: a K = 0 round may first run before the draft has a KV
        cache, and once it has one, the same round takes four more inputs. Built on every round,
        so plain tuples, not describe's strings. buffer_shapes must be current: call buffers()
        first."""
        inputs = tuple(
            (x.shape if x is not dynamic else "dynamic", x.dtype)
            if isinstance(x, torch.Tensor)
            else repr(x)
            for x in leaves
        )
        statics = tuple(
            (k, v) for k, v in sorted(kwargs.items()) if not isinstance(v, torch.Tensor)
        )
        return inputs, statics, self.buffer_shapes

    def paths(self, flat: list, spec: TreeSpec, kwargs: dict) -> tuple[Path, Path]:
        """The graph's package and its outputs' structure, named by package_name."""
        name = self.package_name(flat, spec, kwargs)
        return self.folder / f"{name}.pt2", self.folder / f"{name}.spec"

    def package_name(self, flat: list, spec: TreeSpec, kwargs: dict) -> str:
        """The hash of what the compiled code depends on: the function and the models (identity,
        configs), every input's shape (but the dynamic one's length) and dtype (or value, if not
        a tensor), the static arguments, Inductor's options, the thread count (which Inductor
        bakes into its parallel loops), torch's version and minispec's source, and the weights
        it carries. `flat`: the buffers, then the arguments' leaves (`spec`)."""
        configs = [repr(getattr(m, "config", None)) for m in self.models.children()]
        args = tree_unflatten(flat[len(flat) - spec.num_leaves :], spec)
        dynamic = announce.the_dynamic(args, self.dynamic_at)
        inputs = [
            (tuple(x.shape) if x is not dynamic else "dynamic", str(x.dtype), str(x.device))
            if isinstance(x, torch.Tensor)
            else x
            for x in flat
        ]
        text = repr(
            (self.identity, configs, self.weights_digest(), inputs, str(spec))
            + (sorted(kwargs.items()), sorted(self.options.items()), torch.get_num_threads())
            + (torch.__version__, packages.source_hash())
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def weights_digest(self) -> str:
        """A hash of the models' parameters, which every package carries: another checkpoint
        of the same shapes gets packages of its own. Taken once: weights changed in place later
        are not seen."""
        if self.digest is None:
            digest = hashlib.sha256()
            for name, p in self.models.named_parameters():
                digest.update(name.encode())
                digest.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
            self.digest = digest.hexdigest()
        return self.digest

    def build(self, path: Path, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict) -> None:
        """Export and compile this graph's package at `path` (export.build_package), counted."""
        fn, models, options, dynamic = self.fn, self.models, self.options, self.dynamic
        export.build_package(fn, models, options, dynamic, path, buffers, leaves, spec, kwargs)
        self.exports += 1

    def load(self, path: Path) -> tuple[Callable, TreeSpec] | None:
        """The package at `path` as a function of the flat input tensors, and its outputs'
        structure; None, with the package removed and one line saying so, if it fails its
        check or does not load."""
        reason = packages.check_package(path)
        if reason is None:
            try:
                run = packages.load_runner(path)
                out_spec = pickle.loads(path.with_suffix(".spec").read_bytes())
            except Exception as error:  # whatever a foreign file makes the loader raise
                reason = f"does not load ({str(error).strip().splitlines()[0][:80]})"
        if reason is not None:
            packages.remove_package(path)
            print(f"  package {path} {reason}: removed, rebuilding it", file=sys.stderr)
            return None
        with suppress(OSError):  # a read-only folder still loads
            os.utime(path)  # used now: prune keeps the packages used last
        return run, out_spec


def sibling_kwargs(kwargs: dict, widths: tuple[int, ...]) -> list[dict]:
    """The static arguments of the graphs a round with `kwargs` comes with: one per expected
    width, this K first and then the nearest; `kwargs` alone when one K or none is expected."""
    k = kwargs.get("num_speculative_tokens")
    if len(widths) < 2 or k not in widths:
        return [kwargs]
    widths = sorted(widths, key=lambda w: (abs(w - k), w))
    return [{**kwargs, "num_speculative_tokens": w} for w in widths]
