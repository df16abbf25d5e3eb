"""torch.compile with a voice: announce each graph as it compiles, so a cold start never looks hung.

Every distinct input shape (and static argument: K, the methods) of a compiled callable is its
own graph: we compile with dynamic=False so that each shape gets a static, fully specialised
kernel. The first call with a new shape is where Inductor spends seconds to a minute generating
and building C++ (or Triton); this wrapper prints a line before it and the time after it, and
each call of a compiled function is one guard check.

On the CPU, compile="aot" builds each graph ahead of time instead (AheadOfTime): an AOTInductor
package per graph, kept on disk, which a later process loads in milliseconds where torch.compile
would trace the function again with Dynamo (seconds per graph, even with Inductor's cache warm).
"""

from __future__ import annotations

import hashlib
import os
import pickle
import sys
import time
import warnings
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_leaves, tree_map, tree_unflatten

from sampling.constraints import COMPILE_OPTIONS, jit


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

    def __init__(
        self,
        fn: Callable,
        name: str,
        announce: bool,
        cuda_graphs: bool = False,
        seen: set[tuple] | None = None,
    ) -> None:
        self.fn, self.name, self.announce, self.cuda_graphs = fn, name, announce, cuda_graphs
        # Whether the last call compiled a new graph: its time is compile time, not a round's.
        self.compiled_last = False
        # The keys already compiled. An AheadOfTime callable brings its own, empty set: each one
        # exports or loads its packages on its first call per key, whatever other decoders did.
        self.seen = Announced.seen if seen is None else seen

    @property
    def compiled(self) -> bool:
        return self.announce  # compiled graphs are announced; eager code is not

    def __call__(self, *args, **kwargs):
        # The wrapped callable may say what makes a graph (AheadOfTime: the models' buffers too).
        key = (self.name, *getattr(self.fn, "graph_key", describe)(args, kwargs))
        self.compiled_last = self.announce and key not in self.seen
        if not self.compiled_last:
            return self.run(*args, **kwargs)
        if not Announced.header_shown:
            print(Announced.header, file=sys.stderr, flush=True)
            Announced.header_shown = True
        on_disk = getattr(self.fn, "on_disk", lambda *_: False)(args, kwargs)
        verb = "loading" if on_disk else "compiling"
        print(
            f"  {verb} {self.name} [{' '.join(describe(args, kwargs))}] ...",
            end="",
            file=sys.stderr,
            flush=True,
        )
        start = time.perf_counter()
        out = self.run(*args, **kwargs)
        print(f" {time.perf_counter() - start:.1f}s", file=sys.stderr, flush=True)
        self.seen.add(key)
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


def compile_fn(
    fn: Callable,
    name: str,
    enabled: bool | str,
    device: torch.device,
    models: torch.nn.Module | None = None,
    identity: str = "",
) -> Announced:
    """fullgraph, static shapes, sampling/'s Inductor options; on CUDA, CUDA graphs (one replay
    per call, as mode="reduce-overhead"). enabled="aot" on the CPU: AheadOfTime packages, where
    `models` holds every module fn runs and `identity` names what else fn bakes in (see
    AheadOfTime); on CUDA, "aot" compiles as True does."""
    if not enabled:
        return Announced(fn, name, announce=False)
    cuda = device.type == "cuda"
    if enabled == "aot" and not cuda:
        aot = AheadOfTime(fn, models, f"{name} {identity}", aot_folder())
        return Announced(aot, name, announce=True, seen=set())
    compiled = jit(fn, **({"triton.cudagraphs": True} if cuda else {}))
    return Announced(compiled, name, announce=True, cuda_graphs=cuda)


SOURCE_FOLDERS = ("minispec", "model", "sampling")  # the code a round runs


@lru_cache(maxsize=1)
def source_hash() -> str:
    """A hash of every Python file a round may run, so that a package never outlives its code."""
    root = Path(__file__).resolve().parent.parent
    digest = hashlib.sha256()
    for path in sorted(p for folder in SOURCE_FOLDERS for p in (root / folder).rglob("*.py")):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes())
    return digest.hexdigest()


def aot_folder() -> Path:
    """Where the packages live: inside Inductor's cache folder ($TORCHINDUCTOR_CACHE_DIR, or
    Inductor's default), so that clearing that cache clears them too. Inductor is asked only
    when the variable is unset: importing it imports Dynamo, a second of a warm start."""
    folder = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    if not folder:
        from torch._inductor.runtime.cache_dir_utils import cache_dir

        folder = cache_dir()
    return Path(folder) / "minispec-aot"


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


class AheadOfTime:
    """fn as one AOTInductor package per graph: exported and compiled on a graph's first call in
    any process, loaded from `folder` in later ones. A package's file name hashes everything
    its code depends on (see package_name), so a changed model, option or source file makes a
    new package rather than loading a stale one. Positional arguments are pytrees of tensors
    (and Nones); keyword arguments are static, baked into the graph."""

    def __init__(self, fn: Callable, models: torch.nn.Module, identity: str, folder: Path) -> None:
        self.fn, self.models, self.identity, self.folder = fn, models, identity, folder
        self.packages: dict[tuple, tuple[Callable, TreeSpec]] = {}  # per graph key
        self.exports = 0  # packages this object exported and compiled (loaded ones not counted)
        self.digest: str | None = None  # weights_digest, once taken
        self.current_buffers: dict[str, torch.Tensor] = {}
        self.buffer_shapes: tuple = ()  # (name, shape) of each of current_buffers
        self.buffers_version: tuple | None = None  # the models' cache_version when last read

    def __call__(self, *args, **kwargs):
        buffers = self.buffers()
        leaves, spec = tree_flatten(args)
        key = self.key_of(leaves, kwargs)
        if key not in self.packages:
            with quiet_treespecs():
                self.packages[key] = self.package(buffers, leaves, spec, kwargs)
        run, out_spec = self.packages[key]
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        return tree_unflatten(run([*buffers.values(), *tensors]), out_spec)

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

    def graph_key(self, args: tuple, kwargs: dict) -> tuple:
        """key_of, for Announced, which asks before each call whether it builds a graph."""
        self.buffers()  # refreshes buffer_shapes if setup_cache ran
        return self.key_of(tree_leaves(args), kwargs)

    def key_of(self, leaves: list, kwargs: dict) -> tuple:
        """What tells this graph's package from another's: every input's shape and dtype (or
        value), the static arguments, and the models' buffers. The buffers matter: a K = 0 round
        may first run before the draft has a KV cache, and once it has one, the same round takes
        four more inputs. Built on every round, so plain tuples, not describe's strings.
        buffer_shapes must be current: call buffers() first."""
        inputs = tuple(
            (x.shape, x.dtype) if isinstance(x, torch.Tensor) else repr(x) for x in leaves
        )
        statics = tuple(
            (k, v) for k, v in sorted(kwargs.items()) if not isinstance(v, torch.Tensor)
        )
        return inputs, statics, self.buffer_shapes

    def on_disk(self, args: tuple, kwargs: dict) -> bool:
        """Whether this graph's package was built before, by this process or another."""
        leaves, spec = tree_flatten(args)
        return self.paths([*self.buffers().values(), *leaves], spec, kwargs)[0].exists()

    def paths(self, flat: list, spec: TreeSpec, kwargs: dict) -> tuple[Path, Path]:
        """The graph's package and its outputs' structure, named by package_name."""
        name = self.package_name(flat, spec, kwargs)
        return self.folder / f"{name}.pt2", self.folder / f"{name}.spec"

    def package_name(self, flat: list, spec: TreeSpec, kwargs: dict) -> str:
        """The hash of what the compiled code depends on: the function and the models (identity,
        configs), every input's shape and dtype (or value, if not a tensor), the static
        arguments, the thread count (which Inductor bakes into its parallel loops), torch's
        version and minispec's source, and the weights it carries."""
        configs = [repr(getattr(m, "config", None)) for m in self.models.children()]
        inputs = [
            (tuple(x.shape), str(x.dtype), str(x.device)) if isinstance(x, torch.Tensor) else x
            for x in flat
        ]
        text = repr(
            (self.identity, configs, self.weights_digest(), inputs, str(spec))
            + (sorted(kwargs.items()), torch.get_num_threads(), torch.__version__, source_hash())
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def weights_digest(self) -> str:
        """A hash of the models' parameters, which every package carries: another checkpoint
        of the same shapes gets packages of its own. Taken once (47 MB of float32 hash in about
        0.1 s): weights changed in place later are not seen."""
        if self.digest is None:
            digest = hashlib.sha256()
            for name, p in self.models.named_parameters():
                digest.update(name.encode())
                digest.update(p.detach().contiguous().view(torch.uint8).numpy().tobytes())
            self.digest = digest.hexdigest()
        return self.digest

    def package(
        self, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict
    ) -> tuple[Callable, TreeSpec]:
        """The graph's package, loaded from the folder or else exported, compiled and saved, as
        a function of the flat input tensors, and its outputs' structure."""
        path, spec_path = self.paths([*buffers.values(), *leaves], spec, kwargs)
        if not path.exists():
            # Imported here: only a process that compiles pays for Inductor's import.
            from torch._inductor import aoti_compile_and_package

            out_specs = []  # the outputs' structure, known once traced

            def flat_fn(*args) -> list[torch.Tensor]:
                # Kept in a closure: export restores the module's attributes after tracing.
                out, out_spec = tree_flatten(self.fn(*args, **kwargs))
                out_specs.append(out_spec)
                return out

            flattened = Flattened(flat_fn, self.models, list(buffers), leaves, spec)
            tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
            program = torch.export.export(flattened, (*buffers.values(), *tensors), strict=False)
            self.exports += 1
            self.folder.mkdir(parents=True, exist_ok=True)
            # Written under a temporary name, then renamed: a process that stops half-way, or
            # one that compiles the same graph at the same time, never leaves a torn package.
            # The package is renamed last, so that its presence means its .spec is there too.
            temp = path.with_suffix(f".{os.getpid()}.tmp")
            aoti_compile_and_package(
                program,
                package_path=f"{temp}.pt2",
                # Freezing prepacks the weights for the CPU's GEMM: a round of K = 4 on the
                # shipped pair took 10.2 ms against 13.3 ms with the weights as inputs.
                inductor_configs={**COMPILE_OPTIONS["options"], "freezing": True},
            )
            Path(f"{temp}.spec").write_bytes(pickle.dumps(out_specs[-1]))
            os.replace(f"{temp}.spec", spec_path)
            os.replace(f"{temp}.pt2", path)
            prune(self.folder)
        os.utime(path)  # used now: prune keeps the packages used last
        # AOTInductor's C++ loader, called directly: torch._inductor.aoti_load_package wraps the
        # same object but imports Inductor and Dynamo first (about 1.5 s of a warm start), and
        # its call adds a pytree round trip per round. Arguments: the model's name inside the
        # package, one runner, not single-threaded, the default device.
        loader = torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1)
        return loader.boxed_run, pickle.loads(spec_path.read_bytes())


# Every code change or other checkpoint makes new packages (about 50 MB each for the shipped
# pair) and leaves the old ones unused: the folder keeps the ones used last.
KEEP_PACKAGES = 64


def prune(folder: Path, keep: int = KEEP_PACKAGES) -> None:
    """Delete all but the `keep` packages used last (a load touches its package), with their
    .spec files. A package another process is loading stays readable: it holds the file open."""
    used = {}
    for package in folder.glob("*.pt2"):
        with suppress(FileNotFoundError):  # another process pruned it first
            if ".tmp" not in package.name:  # never one still being written
                used[package] = package.stat().st_mtime
    for old in sorted(used, key=used.get, reverse=True)[keep:]:
        old.with_suffix(".spec").unlink(missing_ok=True)
        old.unlink(missing_ok=True)


@contextmanager
def quiet_treespecs() -> Iterator[None]:
    """Around export and around pickling a TreeSpec (torch's treespec_dumps cannot write one
    with a NamedTuple in it, LoopState): both touch a LeafSpec check inside torch that warns it
    is deprecated, which says nothing to the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield
