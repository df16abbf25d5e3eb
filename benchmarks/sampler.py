"""The rejection sampler against itself uncompiled, the plain reference and the hardware floor.

`minispec bench-sampler` (its flags: flags.py). For each size (B, K, V) and draft kind (one-hot,
probabilistic, and probabilistic verified with method="block") it times, warm, as the median of
--repeats calls taken in turns (benchmarks/timing.py), so that load from other processes falls
on all of them alike:
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
from pathlib import Path

import torch

from benchmarks.timing import in_turns, machine, timed
from sampling import reference, rejection_sample

SIZES = [(1, 4, 256), (1, 4, 32000), (64, 4, 32000), (64, 4, 128256)]
GOAL_SIZE = (64, 4, 128256)
# At GOAL_SIZE: (ratio, the row's key, the goal, the side of it that meets it).
GOALS = (
    ("eager/compiled", "eager_over_compiled", 5.0, "above"),
    ("compiled/floor", "compiled_over_floor", 3.0, "below"),
)
PLAIN_MAX_LOGITS = 1 * 5 * 32000  # the reference loops in Python: small sizes only


def _inputs(b: int, k: int, v: int, one_hot: bool, device: torch.device) -> dict:
    """At (B, K, V): target logits at a realistic spread, drafts drawn from q (argmax of the
    draft logits for a one-hot draft), and the randomness."""
    gen = torch.Generator(device=device).manual_seed(0)
    target_logits = 3 * torch.randn(b, k + 1, v, device=device, generator=gen)
    draft_logits = target_logits[:, :k] + torch.randn(b, k, v, device=device, generator=gen)
    if one_hot:
        draft_probs, draft_ids = None, draft_logits.argmax(-1)
    else:
        draft_probs = draft_logits.softmax(-1)
        draft_ids = torch.multinomial(draft_probs.view(-1, v), 1, generator=gen).view(b, k)
    return dict(
        target_logits=target_logits,
        draft_token_ids=draft_ids,
        draft_probs=draft_probs,
        uniforms=torch.rand(b, k, dtype=torch.float64, device=device, generator=gen),
        exponentials=torch.empty(b, v, device=device).exponential_(generator=gen),
    )


# (one-hot draft, method): block verification with a one-hot draft runs the token-wise rule.
KINDS = [(True, "standard"), (False, "standard"), (False, "block")]


def measure(size: tuple, one_hot: bool, method: str, device: torch.device, repeats: int) -> dict:
    """One row: size (B, K, V), one draft kind, each contender's median milliseconds."""
    b, k, v = size
    args = _inputs(b, k, v, one_hot, device)
    tensors = [t for t in args.values() if t is not None]
    args["method"] = method
    kind = ("one-hot" if one_hot else "probabilistic") + (", block" if method == "block" else "")
    megabytes = sum(t.numel() * t.element_size() for t in tensors) / 2**20
    row = dict(B=b, K=k, V=v, draft=kind, input_mb=megabytes)
    row["compile_s"] = timed(lambda: rejection_sample(**args), device)
    contenders = {
        "compiled": lambda: rejection_sample(**args),
        "eager": lambda: rejection_sample(**args, compiled=False),
        "floor": lambda: [t.sum() for t in tensors],
    }
    if b * (k + 1) * v <= PLAIN_MAX_LOGITS:
        cpu = {name: x.cpu() if isinstance(x, torch.Tensor) else x for name, x in args.items()}
        contenders["plain"] = lambda: reference.rejection_sample(  # noqa: E731
            **cpu, temperature=1.0, top_k=None, top_p=None
        )
    medians = in_turns(contenders, repeats, device)
    for name in ("compiled", "eager", "floor", "plain"):
        row[f"{name}_ms"] = 1e3 * medians[name] if name in medians else None
    row["eager_over_compiled"] = row["eager_ms"] / row["compiled_ms"]
    row["compiled_over_floor"] = row["compiled_ms"] / row["floor_ms"]
    return row


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
        for name, key, goal, better in GOALS:
            value = r[key]
            met = value >= goal if better == "above" else value <= goal
            lines.append(
                f"{r['draft']} draft at {GOAL_SIZE}: {name} {value:.1f}x, goal "
                f"{better} {goal:g}x: {'met' if met else 'SHORT'}"
            )
    return lines


def render_markdown(report: dict) -> str:
    m = report["machine"]
    load = ""
    if "load_average_at_start" in m:
        load = (
            f" Load average {m['load_average_at_start']} at the start and "
            f"{m['load_average_at_end']} at the end: other processes shared the machine."
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
        title = f"## {run['threads']} thread{'s' if run['threads'] > 1 else ''}\n"
        lines += [title, HEADER, "|" + "---|" * 11]
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
                rows.append(measure(size, one_hot, method, device, args.repeats))
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
