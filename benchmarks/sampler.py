"""The rejection sampler against itself uncompiled, the plain reference and the hardware floor.

    python -m minispec bench-sampler [--out results] [--device cpu] [--repeats 7]   # flags.py

For each size (B, K, V) and draft kind (one-hot, probabilistic, and probabilistic verified
with method="block") it times, warm, as the median of --repeats calls (the
contenders take turns, so load from other processes falls on all of them alike):
- compiled: sampling.rejection_sample, the default torch.compile(fullgraph=True) path;
- eager: the same tensor code run without compiling (compiled=False);
- plain: sampling.reference, the loop that reads like Algorithm 1 (small sizes only);
- floor: one pass that reads every input tensor once (a sum of each), measured in the same run.
The first compiled call, which compiles the graph, is timed apart. Goals at (64, 4, 128256):
compiled at least 5x faster than eager, and within 3x of the read floor.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Callable

import torch

from sampling import reference, rejection_sample

SIZES = [(1, 4, 256), (1, 4, 32000), (64, 4, 32000), (64, 4, 128256)]
GOAL_SIZE = (64, 4, 128256)
GOAL_EAGER_OVER_COMPILED = 5.0
GOAL_COMPILED_OVER_FLOOR = 3.0
PLAIN_MAX_LOGITS = 1 * 5 * 32000  # the reference loops in Python: small sizes only


def _inputs(
    batch_size: int, num_drafts: int, vocab_size: int, one_hot: bool, device: torch.device
) -> dict:
    """Target logits at a realistic spread, drafts drawn from q (argmax of the draft logits
    for a one-hot draft), and the randomness."""
    gen = torch.Generator(device=device).manual_seed(0)
    target_logits = 3 * torch.randn(
        batch_size, num_drafts + 1, vocab_size, device=device, generator=gen
    )
    draft_logits = target_logits[:, :num_drafts] + torch.randn(
        batch_size, num_drafts, vocab_size, device=device, generator=gen
    )
    if one_hot:
        draft_probs, draft_ids = None, draft_logits.argmax(-1)
    else:
        draft_probs = draft_logits.softmax(-1)
        draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1, generator=gen).view(
            batch_size, num_drafts
        )
    return dict(
        target_logits=target_logits,
        draft_token_ids=draft_ids,
        draft_probs=draft_probs,
        uniforms=torch.rand(
            batch_size, num_drafts, dtype=torch.float64, device=device, generator=gen
        ),
        exponentials=torch.empty(batch_size, vocab_size, device=device).exponential_(generator=gen),
    )


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


# (one-hot draft, method): block verification with a one-hot draft runs the token-wise rule.
KINDS = [(True, "standard"), (False, "standard"), (False, "block")]


def measure(
    batch_size: int,
    num_drafts: int,
    vocab_size: int,
    one_hot: bool,
    device: torch.device,
    repeats: int,
    method: str = "standard",
) -> dict:
    args = _inputs(batch_size, num_drafts, vocab_size, one_hot, device)
    tensors = [t for t in args.values() if t is not None]
    args["method"] = method
    row = dict(
        B=batch_size,
        K=num_drafts,
        V=vocab_size,
        draft=("one-hot" if one_hot else "probabilistic")
        + (", block" if method == "block" else ""),
        input_mb=sum(t.numel() * t.element_size() for t in tensors) / 2**20,
    )
    row["compile_s"] = _timed(lambda: rejection_sample(**args), device)
    contenders = {
        "compiled": lambda: rejection_sample(**args),
        "eager": lambda: rejection_sample(**args, compiled=False),
        "floor": lambda: [t.sum() for t in tensors],
    }
    if batch_size * (num_drafts + 1) * vocab_size <= PLAIN_MAX_LOGITS:
        cpu = {k: v.cpu() if isinstance(v, torch.Tensor) else v for k, v in args.items()}
        contenders["plain"] = lambda: reference.rejection_sample(  # noqa: E731
            **cpu, temperature=1.0, top_k=None, top_p=None
        )
    # Interleaved, so that a burst of load from other processes (this is often a shared
    # machine) hits every contender alike instead of one of them.
    times: dict[str, list[float]] = {name: [] for name in contenders}
    for name, fn in contenders.items():
        _timed(fn, device)  # warm-up
    for _ in range(repeats):
        for name, fn in contenders.items():
            times[name].append(_timed(fn, device))
    for name in ("compiled", "eager", "floor", "plain"):
        row[f"{name}_ms"] = 1e3 * statistics.median(times[name]) if name in times else None
    row["eager_over_compiled"] = row["eager_ms"] / row["compiled_ms"]
    row["compiled_over_floor"] = row["compiled_ms"] / row["floor_ms"]
    return row


def machine(device: torch.device, threads: int | None = None) -> dict:
    """What a result was measured on: CPU model, cores, torch, Python, threads, the GPU."""
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), torch=torch.__version__, device=str(device))
    info.update(python=platform.python_version(), threads=threads or torch.get_num_threads())
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = round(os.getloadavg()[0], 2)
    return info


HEADER = (
    "| B | K | V | draft | compiled ms | eager ms | plain ms | floor ms | eager/compiled "
    "| compiled/floor | compile s |"
)


def format_row(r: dict) -> str:
    plain = "-" if r["plain_ms"] is None else f"{r['plain_ms']:.1f}"
    return (
        f"| {r['B']} | {r['K']} | {r['V']} | {r['draft']} | {r['compiled_ms']:.2f} | "
        f"{r['eager_ms']:.2f} | {plain} | {r['floor_ms']:.2f} | "
        f"{r['eager_over_compiled']:.1f}x | {r['compiled_over_floor']:.1f}x | "
        f"{r['compile_s']:.1f} |"
    )


def goals(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if (r["B"], r["K"], r["V"]) != GOAL_SIZE:
            continue
        for name, value, goal, better in [
            ("eager/compiled", r["eager_over_compiled"], GOAL_EAGER_OVER_COMPILED, "above"),
            ("compiled/floor", r["compiled_over_floor"], GOAL_COMPILED_OVER_FLOOR, "below"),
        ]:
            met = value >= goal if better == "above" else value <= goal
            lines.append(
                f"{r['draft']} draft at {GOAL_SIZE}: {name} {value:.1f}x, goal "
                f"{better} {goal:g}x: {'met' if met else 'SHORT'}"
            )
    return lines


def render_markdown(report: dict) -> str:
    m = report["machine"]
    load = (
        f" Load average {m['load_average_at_start']} at the start and "
        f"{m['load_average_at_end']} at the end: other processes shared the machine."
        if "load_average_at_start" in m
        else ""
    )
    lines = [
        "# Sampler benchmark\n",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, device "
        f"{m.get('gpu', m['device'])}.{load} Median of {report['repeats']} warm calls, "
        "taken in turns; floor = one read of every input tensor (a sum of each); "
        "compile s = the first call, which compiles the graph or loads it from "
        "Inductor's on-disk cache.\n",
    ]
    for run in report["runs"]:
        lines += [
            f"## {run['threads']} thread{'s' if run['threads'] > 1 else ''}\n",
            HEADER,
            "|" + "---|" * 11,
        ]
        lines += [format_row(r) for r in run["rows"]]
        lines += [""] + [f"- {g}" for g in run["goals"]] + [""]
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """The table at each thread count (args: benchmarks.flags.sampler_parser's, resolved by
    benchmarks.cli.bench_sampler)."""
    device = torch.device(args.device)
    report = dict(machine=machine(device), repeats=args.repeats, runs=[])
    for threads in [int(t) for t in args.threads.split(",")]:
        torch.set_num_threads(threads)
        print(f"{threads} thread(s)\n{HEADER}", flush=True)
        rows = []
        for size in SIZES:
            for one_hot, method in KINDS:
                rows.append(
                    measure(
                        *size, one_hot=one_hot, device=device, repeats=args.repeats, method=method
                    )
                )
                print(format_row(rows[-1]), flush=True)
        run = dict(threads=threads, rows=rows, goals=goals(rows))
        print("\n".join(run["goals"]) + "\n", flush=True)
        report["runs"].append(run)
    if hasattr(os, "getloadavg"):
        report["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampler.json").write_text(json.dumps(report, indent=2))
    (out / "sampler.md").write_text(render_markdown(report))
    print(f"wrote {out / 'sampler.md'} and {out / 'sampler.json'}")
    return 0
