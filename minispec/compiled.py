"""torch.compile with a voice: announce each graph as it compiles, so a cold start never looks hung.

Every distinct input shape (and static argument: K, the methods) of a compiled callable is its
own graph: we compile with dynamic=False so that each shape gets a static, fully specialised
kernel. The one exception is a callable's `dynamic_arg`, a 1-D tensor whose length changes from
call to call (the round's key_positions, the KV cache slots attention reads): its length is a
dynamic size, so one graph serves every length. The first call with a new shape is where
Inductor spends seconds to a minute generating and building C++ (or Triton); this wrapper prints
a line before it and the time after it, and each call of a compiled function is one guard check.

On the CPU, compile="aot" builds each graph ahead of time instead (AheadOfTime): an AOTInductor
package per graph, kept on disk, which a later process loads in milliseconds where torch.compile
would trace the function again with Dynamo (seconds per graph, even with Inductor's cache warm).
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import sys
import tempfile
import time
import warnings
from contextlib import contextmanager, suppress
from functools import lru_cache
from pathlib import Path
from typing import Callable, Iterator

import torch
from torch.utils._pytree import TreeSpec, tree_flatten, tree_leaves, tree_unflatten

from minispec.compilation.cuda_graphs import CudaGraphs
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


def without_dynamic(args: tuple, dynamic_arg: int | None) -> tuple:
    """args with the dynamic one (if any) left out: what tells one graph from another."""
    if dynamic_arg is None or dynamic_arg >= len(args):
        return args
    return args[:dynamic_arg] + (None,) + args[dynamic_arg + 1 :]


def the_dynamic(args: tuple, dynamic_arg: int | None) -> torch.Tensor | None:
    """The dynamic argument, a 1-D tensor, or None (no dynamic_arg, or not passed)."""
    return args[dynamic_arg] if dynamic_arg is not None and dynamic_arg < len(args) else None


class Announced:
    """Call `fn` (compiled or not); when `announce` is set, say in one line when a call compiles
    a graph, and how long it took. An AheadOfTime `fn` announces for itself (it knows whether a
    call built, loaded or ran eagerly) and says whether its last call compiled. A compiled `fn`
    takes its positional argument `dynamic_arg` (if any) with a dynamic length (mark_dynamic):
    one graph, and one announcement, for every length."""

    seen: set[tuple] = set()  # shared: a graph compiled for one decoder serves the next

    def __init__(
        self,
        fn: Callable,
        name: str,
        announce: bool,
        dynamic_arg: int | None = None,
    ) -> None:
        self.fn, self.name, self.announce = fn, name, announce
        self.dynamic_arg = dynamic_arg if announce else None  # eager code has no graph
        # Whether the last call compiled or loaded a graph: its time is not a round's.
        self.compiled_last = False

    @property
    def ran_compiled(self) -> bool:
        """Whether the last call ran compiled code: an announced graph does (eager code is not
        announced); an AheadOfTime function, when the call ran its package, not its eager
        tier."""
        if isinstance(self.fn, AheadOfTime):
            return self.fn.ran_package
        return self.announce

    def __call__(self, *args, **kwargs):
        if isinstance(self.fn, AheadOfTime):
            out = self.fn(*args, **kwargs)
            self.compiled_last = self.fn.compiled_last
            return out
        key = (self.name, *describe(without_dynamic(args, self.dynamic_arg), kwargs))
        self.compiled_last = self.announce and key not in Announced.seen
        if (dynamic := the_dynamic(args, self.dynamic_arg)) is not None:
            # Marked on every call: a call that compiles (a new K) must see the mark too.
            torch._dynamo.mark_dynamic(dynamic, 0)
        if not self.compiled_last:
            # The plain call inline: one frame less between the loop and the round.
            out = self.fn(*args, **kwargs)
        else:
            with compiling(in_words(self.name, args, kwargs)):
                out = self.fn(*args, **kwargs)
            Announced.seen.add(key)
        if isinstance(self.fn, CudaGraphs):  # a new decoder captures its own graphs
            self.compiled_last = self.fn.compiled_last
        return out


@contextmanager
def compiling(what: str) -> Iterator[None]:
    """The one line a foreground compile prints: what, then how long it took."""
    print(f"  compiling {what} ...", end="", file=sys.stderr, flush=True)
    start = time.perf_counter()
    yield
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
        if kwargs.get("draft_sample_method"):
            words.append(f"{kwargs['draft_sample_method']} drafts")
        if kwargs.get("rejection_sample_method", "standard") != "standard":
            words.append(f"{kwargs['rejection_sample_method']} verification")
    return ", ".join(words)


def compile_fn(
    fn: Callable,
    name: str,
    enabled: bool | str,
    device: torch.device,
    models: torch.nn.Module | None = None,
    identity: str = "",
    dynamic_arg: int | None = None,
) -> Announced:
    """fullgraph, static shapes, sampling/'s Inductor options; on CUDA, CUDA graphs (one replay
    per call, as mode="reduce-overhead"). On the CPU, enabled="aot": AheadOfTime packages,
    compiled on first use; enabled="auto": the same packages, built by a background process
    while the calls run eagerly (minispec/tiers.py). `models` holds every module fn runs and
    `identity` names what else fn bakes in (see AheadOfTime). On CUDA, "aot" and "auto"
    compile as True does. `dynamic_arg`: the index of a positional argument, a 1-D tensor whose
    length changes from call to call, compiled as a dynamic size (every other size static): one
    graph serves every length (under CUDA graphs, one recording per length)."""
    if not enabled:
        return Announced(fn, name, announce=False)
    cuda = device.type == "cuda"
    if enabled in ("aot", "auto") and not cuda:
        aot = AheadOfTime(
            fn, models, f"{name} {identity}", aot_folder(), name, enabled == "auto", dynamic_arg
        )
        return Announced(aot, name, announce=True)
    if cuda:
        version = lambda: tuple(m.cache_version for m in models)  # noqa: E731
        return Announced(CudaGraphs(fn, jit, buffers_version=version), name, announce=True)
    return Announced(jit(fn), name, announce=True, dynamic_arg=dynamic_arg)


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


# Freezing prepacks the weights for the CPU's GEMM: a round of K = 4 on the shipped pair took
# 10.2 ms against 13.3 ms with the weights as inputs.
PACKAGE_OPTIONS = {**COMPILE_OPTIONS["options"], "freezing": True}


class AheadOfTime:
    """fn as one AOTInductor package per graph, kept in `folder` and loaded by later processes.
    A package's file name hashes everything its code depends on (see package_name), so a
    changed model, option or source file makes a new package rather than loading a stale one.
    Positional arguments are pytrees of tensors (and Nones); keyword arguments are static,
    baked into the graph. The positional argument `dynamic_arg` (if any), a 1-D tensor, is
    exported with a dynamic length (a torch.export Dim): one package serves every length.

    In the foreground (background=False) a graph's first call exports and compiles its package
    and then runs it. In the background, a graph whose package is not on disk runs eagerly
    while a separate process builds the package (minispec/tiers.py); each later call checks
    for it (one stat) and the package takes over once it is there. A package that fails its
    check (check_package) is removed, rebuilt, and said so in one line; an unwritable folder
    is said in one line too, and the calls then run eagerly."""

    def __init__(
        self,
        fn: Callable,
        models: torch.nn.Module,
        identity: str,
        folder: Path,
        name: str = "",
        background: bool = False,
        dynamic_arg: int | None = None,
    ) -> None:
        self.fn, self.models, self.identity, self.folder = fn, models, identity, folder
        self.name, self.background, self.options = name, background, dict(PACKAGE_OPTIONS)
        self.dynamic_arg = dynamic_arg
        self.packages: dict[tuple, tuple[Callable, TreeSpec]] = {}  # per graph key
        self.exports = 0  # packages this object exported and compiled (loaded ones not counted)
        self.waiting: dict[tuple, Path] = {}  # background: each graph's package, once asked
        self.requested: set[Path] = set()  # background: the packages asked of a builder
        self.compiled_last = False  # whether the last call compiled or loaded its package
        self.ran_package = False  # whether the last call ran a package (else, eagerly)
        self.unwritable: str | None = None  # why the folder cannot be written; then eager
        self.digest: str | None = None  # weights_digest, once taken
        self.current_buffers: dict[str, torch.Tensor] = {}
        self.buffer_shapes: tuple = ()  # (name, shape) of each of current_buffers
        self.buffers_version: tuple | None = None  # the models' cache_version when last read

    def __call__(self, *args, **kwargs):
        buffers = self.buffers()
        leaves, spec = tree_flatten(args)
        key = self.key_of(leaves, kwargs, the_dynamic(args, self.dynamic_arg))
        self.compiled_last = self.ran_package = False
        if key not in self.packages and self.unwritable is None:
            find = self.background_package if self.background else self.foreground_package
            with quiet_treespecs():
                package = find(key, buffers, leaves, spec, kwargs)
            if package is None:
                return self.fn(*args, **kwargs)  # the eager tier
            self.packages[key] = package
            self.compiled_last = True
        if key not in self.packages:
            return self.fn(*args, **kwargs)
        run, out_spec = self.packages[key]
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        self.ran_package = True
        return tree_unflatten(run([*buffers.values(), *tensors]), out_spec)

    def foreground_package(
        self, key: tuple, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict
    ) -> tuple[Callable, TreeSpec] | None:
        """The graph's package, loaded, or else compiled here and now (announced, timed)."""
        path = self.paths([*buffers.values(), *leaves], spec, kwargs)[0]
        if path.exists() and (package := self.load(path)) is not None:
            return package
        if self.cannot_write():
            return None
        with compiling(in_words(self.name, tree_unflatten(leaves, spec), kwargs)):
            self.build(path, buffers, leaves, spec, kwargs)
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
        if path.exists():
            package = self.load(path)
            if package is not None:
                self.announce_ready(path, leaves, spec, kwargs)
                return package
            self.requested.discard(path)  # removed: build it again
        if path not in self.requested and not self.cannot_write():
            self.request(buffers, leaves, spec, kwargs)
        return None

    def request(self, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict) -> None:
        """Queue this graph and its siblings not yet on disk for the builder (tiers.py), with
        one line saying so; an unwritable folder is said instead, and the calls stay eager."""
        from minispec import tiers  # tiers builds with this class: imported on first use

        flat = [*buffers.values(), *leaves]
        siblings = [(self.paths(flat, spec, kw)[0], kw) for kw in sibling_kwargs(kwargs)]
        todo = [(p, kw) for p, kw in siblings if not p.exists() and p not in self.requested]
        if not todo:
            return
        widths = tuple(sorted(kw["num_speculative_tokens"] for _, kw in todo if len(todo) > 1))
        try:
            tiers.request_build(self, buffers, tree_unflatten(leaves, spec), todo)
        except OSError as error:
            self.unwritable = error.strerror or str(error)
            print(cache_off_line(self.folder, self.unwritable), file=sys.stderr, flush=True)
            return
        self.requested.update(p for p, _ in todo)
        what = in_words(self.name, tree_unflatten(leaves, spec), todo[0][1], widths)
        print(f"  compiling {what} in the background (eager until ready)", file=sys.stderr)

    def announce_ready(self, path: Path, leaves: list, spec: TreeSpec, kwargs: dict) -> None:
        """One line when a package this object asked for takes over: what, and how long the
        builder took."""
        if path in self.requested:
            seconds = read_manifest(path).get("seconds", 0.0)
            what = in_words(self.name, tree_unflatten(leaves, spec), kwargs)
            print(f"  {what}: compiled in {seconds:.0f} s, now in use", file=sys.stderr)

    def cannot_write(self) -> bool:
        """Whether the folder cannot be written (said once, in one line naming it)."""
        if self.unwritable is None:
            self.unwritable = unwritable(self.folder)
            if self.unwritable is not None:
                print(cache_off_line(self.folder, self.unwritable), file=sys.stderr, flush=True)
        return self.unwritable is not None

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
        dynamic = self.dynamic_of(flat[len(flat) - spec.num_leaves :], spec)
        inputs = [
            (tuple(x.shape) if x is not dynamic else "dynamic", str(x.dtype), str(x.device))
            if isinstance(x, torch.Tensor)
            else x
            for x in flat
        ]
        text = repr(
            (self.identity, configs, self.weights_digest(), inputs, str(spec))
            + (sorted(kwargs.items()), sorted(self.options.items()), torch.get_num_threads())
            + (torch.__version__, source_hash())
        )
        return hashlib.sha256(text.encode()).hexdigest()[:32]

    def dynamic_of(self, leaves: list, spec: TreeSpec) -> torch.Tensor | None:
        """The dynamic argument among the arguments' leaves, or None."""
        return the_dynamic(tree_unflatten(leaves, spec), self.dynamic_arg)

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

    def build(self, path: Path, buffers: dict, leaves: list, spec: TreeSpec, kwargs: dict) -> None:
        """Export fn for these inputs, compile it into the package `path`, and write its .spec
        (the outputs' structure) and its manifest (checksum, build time) beside it."""
        start, cpu_start = time.perf_counter(), cpu_seconds()
        out_specs = []  # the outputs' structure, known once traced

        def flat_fn(*args) -> list[torch.Tensor]:
            # Kept in a closure: export restores the module's attributes after tracing.
            out, out_spec = tree_flatten(self.fn(*args, **kwargs))
            out_specs.append(out_spec)
            return out

        flattened = Flattened(flat_fn, self.models, list(buffers), leaves, spec)
        tensors = [x for x in leaves if isinstance(x, torch.Tensor)]
        dynamic = self.dynamic_of(leaves, spec)
        sizes = (None,) * len(buffers) + tuple(
            {0: torch.export.Dim.DYNAMIC} if x is dynamic else None for x in tensors
        )
        with quiet_treespecs():
            program = torch.export.export(
                flattened, (*buffers.values(), *tensors), strict=False, dynamic_shapes=(sizes,)
            )
        self.exports += 1
        self.folder.mkdir(parents=True, exist_ok=True)
        # Written under temporary names, then renamed: a process that stops half-way, or one
        # that compiles the same graph at the same time, never leaves a torn package. The
        # package is renamed last, so that its presence means its .spec and manifest are there.
        temp = path.with_suffix(f".{os.getpid()}.tmp")
        try:
            compile_package(program, Path(f"{temp}.pt2"), self.options)
            Path(f"{temp}.spec").write_bytes(pickle.dumps(out_specs[-1]))
            times = time.perf_counter() - start, cpu_seconds() - cpu_start
            write_manifest(Path(f"{temp}.pt2"), Path(f"{temp}.spec"), *times)
            for suffix in (".spec", ".json", ".pt2"):
                os.replace(f"{temp}{suffix}", path.with_suffix(suffix))
        finally:
            for suffix in (".spec", ".json", ".pt2"):
                Path(f"{temp}{suffix}").unlink(missing_ok=True)
        prune(self.folder)

    def load(self, path: Path) -> tuple[Callable, TreeSpec] | None:
        """The package at `path` as a function of the flat input tensors, and its outputs'
        structure; None, with the package removed and one line saying so, if it fails its
        check or does not load."""
        reason = check_package(path)
        if reason is None:
            try:
                run = load_runner(path)
                out_spec = pickle.loads(path.with_suffix(".spec").read_bytes())
            except Exception as error:  # whatever a foreign file makes the loader raise
                reason = f"does not load ({str(error).strip().splitlines()[0][:80]})"
        if reason is not None:
            remove_package(path)
            print(f"  package {path} {reason}: removed, rebuilding it", file=sys.stderr)
            return None
        with suppress(OSError):  # a read-only folder still loads
            os.utime(path)  # used now: prune keeps the packages used last
        return run, out_spec


def sibling_kwargs(kwargs: dict) -> list[dict]:
    """The static arguments of the graphs a round with `kwargs` comes with: with an adaptive
    configuration, one per width, this K first and then the nearest; else `kwargs` alone."""
    adaptive = kwargs.get("adaptive")
    k = kwargs.get("num_speculative_tokens")
    if adaptive is None or k is None:
        return [kwargs]
    widths = sorted(adaptive.widths, key=lambda w: (abs(w - k), w))
    return [{**kwargs, "num_speculative_tokens": w} for w in widths]


def compile_package(program, package_path: Path, options: dict) -> None:
    """AOTInductor: the exported program as C++, compiled into a package at package_path.
    Imported here: only a process that compiles pays for Inductor's import."""
    from torch._inductor import aoti_compile_and_package

    aoti_compile_and_package(program, package_path=str(package_path), inductor_configs=options)


def load_runner(path: Path) -> Callable:
    """The package's model, run by AOTInductor's C++ loader, called directly:
    torch._inductor.aoti_load_package wraps the same object but imports Inductor and Dynamo
    first (about 1.5 s of a warm start), and its call adds a pytree round trip per round.
    Arguments: the model's name inside the package, one runner, not single-threaded, the
    default device."""
    return torch._C._aoti.AOTIModelPackageLoader(str(path), "model", False, 1, -1).boxed_run


def package_digest(package: Path, spec: Path) -> str:
    """sha256 of a package and its .spec (about 0.06 s for 50 MB)."""
    digest = hashlib.sha256()
    for part in (package, spec):
        with open(part, "rb") as f:
            digest.update(hashlib.file_digest(f, "sha256").digest())
    return digest.hexdigest()


def write_manifest(package: Path, spec: Path, seconds: float, cpu: float) -> None:
    """Beside the package (same name, .json): its checksum and how long it took to build, in
    wall seconds and in CPU seconds (the C++ compiler's included)."""
    manifest = {"sha256": package_digest(package, spec), "seconds": round(seconds, 1)}
    manifest["cpu_seconds"] = round(cpu, 1)
    package.with_suffix(".json").write_text(json.dumps(manifest))


def cpu_seconds() -> float:
    """CPU time of this process and of its children that ended (the C++ compiler)."""
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def read_manifest(package: Path) -> dict:
    """The package's manifest; {} if missing or unreadable."""
    try:
        manifest = json.loads(package.with_suffix(".json").read_text())
    except (OSError, ValueError):
        return {}
    return manifest if isinstance(manifest, dict) else {}


def check_package(package: Path) -> str | None:
    """Why the package must not be loaded (a corrupt, truncated or empty file, a .spec or
    manifest missing or changed), or None: its checksum matches the one written with it."""
    expected = read_manifest(package).get("sha256")
    if expected is None:
        return "has no readable checksum"
    try:
        actual = package_digest(package, package.with_suffix(".spec"))
    except OSError as error:
        return f"cannot be read ({error.strerror})"
    return None if actual == expected else "does not match its checksum (corrupt or truncated)"


def remove_package(package: Path) -> None:
    for suffix in (".pt2", ".spec", ".json"):
        with suppress(OSError):
            package.with_suffix(suffix).unlink(missing_ok=True)


def unwritable(folder: Path) -> str | None:
    """Why files cannot be created in `folder` (made if missing), or None if they can."""
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as error:
        return error.strerror or str(error)
    return None


def cache_off_line(folder: Path, reason: str) -> str:
    return f"  cannot write the package cache {folder} ({reason}): running eagerly, uncached"


# Every code change or other checkpoint makes new packages (about 50 MB each for the shipped
# pair) and leaves the old ones unused: the folder keeps the ones used last.
KEEP_PACKAGES = 64
# A temporary file this old belongs to a build that died: a build takes minutes, not an hour.
STALE_SECONDS = 3600


def prune(folder: Path, keep: int = KEEP_PACKAGES, stale: float = STALE_SECONDS) -> None:
    """Delete all but the `keep` packages used last (a load touches its package), with their
    .spec and manifest, and the temporary files of builds that died (older than `stale`
    seconds). A package another process is loading stays readable: it holds the file open."""
    used, now = {}, time.time()
    for path in folder.glob("*"):
        with suppress(FileNotFoundError):  # another process pruned it first
            if ".tmp" in path.name:
                if now - path.stat().st_mtime > stale:
                    path.unlink(missing_ok=True)
            elif path.suffix == ".pt2":
                used[path] = path.stat().st_mtime
    for old in sorted(used, key=used.get, reverse=True)[keep:]:
        remove_package(old)


@contextmanager
def quiet_treespecs() -> Iterator[None]:
    """Around export and around pickling a TreeSpec (torch's treespec_dumps cannot write one
    with a NamedTuple in it, LoopState): both touch a LeafSpec check inside torch that warns it
    is deprecated, which says nothing to the user."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)
        yield
