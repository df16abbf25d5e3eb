"""The rejection sampler against itself uncompiled, the plain reference and the hardware floor.

    python -m minispec bench-sampler [--out results] [--device cpu] [--repeats 7]

For each size (B, K, V) and draft kind it times, warm, as the median of --repeats calls:
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

from sampling import rejection_sample
from sampling import reference

SIZES = [(1, 4, 256), (1, 4, 32000), (64, 4, 32000), (64, 4, 128256)]
GOAL_SIZE = (64, 4, 128256)
GOAL_EAGER_OVER_COMPILED = 5.0
GOAL_COMPILED_OVER_FLOOR = 3.0
PLAIN_MAX_LOGITS = 1 * 5 * 32000  # the reference loops in Python: small sizes only


def _inputs(batch_size: int, num_drafts: int, vocab_size: int, one_hot: bool,
            device: torch.device) -> dict:
    """Target logits at a realistic spread, drafts drawn from q (argmax of the draft logits
    for a one-hot draft), and the randomness."""
    gen = torch.Generator(device=device).manual_seed(0)
    target_logits = 3 * torch.randn(batch_size, num_drafts + 1, vocab_size, device=device,
                                    generator=gen)
    draft_logits = target_logits[:, :num_drafts] + torch.randn(
        batch_size, num_drafts, vocab_size, device=device, generator=gen)
    if one_hot:
        draft_probs, draft_ids = None, draft_logits.argmax(-1)
    else:
        draft_probs = draft_logits.softmax(-1)
        draft_ids = torch.multinomial(draft_probs.view(-1, vocab_size), 1,
                                      generator=gen).view(batch_size, num_drafts)
    return dict(
        target_logits=target_logits, draft_token_ids=draft_ids, draft_probs=draft_probs,
        uniforms=torch.rand(batch_size, num_drafts, dtype=torch.float64, device=device,
                            generator=gen),
        exponentials=torch.empty(batch_size, vocab_size, device=device).exponential_(
            generator=gen))


def _timed(fn: Callable[[], object], device: torch.device) -> float:
    if device.type == "cuda":
        torch.cuda.synchronize()
    start = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize()
    return time.perf_counter() - start


def _median_ms(fn: Callable[[], object], device: torch.device, repeats: int) -> float:
    _timed(fn, device)  # warm-up
    return 1e3 * statistics.median(_timed(fn, device) for _ in range(repeats))


def measure(batch_size: int, num_drafts: int, vocab_size: int, one_hot: bool,
            device: torch.device, repeats: int) -> dict:
    args = _inputs(batch_size, num_drafts, vocab_size, one_hot, device)
    tensors = [t for t in args.values() if t is not None]
    row = dict(B=batch_size, K=num_drafts, V=vocab_size,
               draft="one-hot" if one_hot else "probabilistic",
               input_mb=sum(t.numel() * t.element_size() for t in tensors) / 2**20)
    row["compile_s"] = _timed(lambda: rejection_sample(**args), device)
    row["compiled_ms"] = _median_ms(lambda: rejection_sample(**args), device, repeats)
    row["eager_ms"] = _median_ms(lambda: rejection_sample(**args, compiled=False), device,
                                 repeats)
    row["floor_ms"] = _median_ms(lambda: [t.sum() for t in tensors], device, repeats)
    row["plain_ms"] = None
    if batch_size * (num_drafts + 1) * vocab_size <= PLAIN_MAX_LOGITS:
        cpu = {k: None if v is None else v.cpu() for k, v in args.items()}
        plain = lambda: reference.rejection_sample(**cpu, temperature=1.0, top_k=None,  # noqa: E731
                                                   top_p=None)
        row["plain_ms"] = _median_ms(plain, torch.device("cpu"), max(1, repeats // 2))
    row["eager_over_compiled"] = row["eager_ms"] / row["compiled_ms"]
    row["compiled_over_floor"] = row["compiled_ms"] / row["floor_ms"]
    return row


def machine(device: torch.device) -> dict:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    info = dict(cpu=cpu, cores=os.cpu_count(), torch=torch.__version__,
                threads=torch.get_num_threads(), device=str(device))
    if device.type == "cuda":
        info["gpu"] = torch.cuda.get_device_name(device)
    if hasattr(os, "getloadavg"):
        info["load_average_at_start"] = round(os.getloadavg()[0], 2)
    return info


HEADER = ("| B | K | V | draft | compiled ms | eager ms | plain ms | floor ms | eager/compiled "
          "| compiled/floor | compile s |")


def format_row(r: dict) -> str:
    plain = "-" if r["plain_ms"] is None else f"{r['plain_ms']:.1f}"
    return (f"| {r['B']} | {r['K']} | {r['V']} | {r['draft']} | {r['compiled_ms']:.2f} | "
            f"{r['eager_ms']:.2f} | {plain} | {r['floor_ms']:.2f} | "
            f"{r['eager_over_compiled']:.1f}x | {r['compiled_over_floor']:.1f}x | "
            f"{r['compile_s']:.1f} |")


def goals(rows: list[dict]) -> list[str]:
    lines = []
    for r in rows:
        if (r["B"], r["K"], r["V"]) != GOAL_SIZE:
            continue
        for name, value, goal, better in [
                ("eager/compiled", r["eager_over_compiled"], GOAL_EAGER_OVER_COMPILED, "above"),
                ("compiled/floor", r["compiled_over_floor"], GOAL_COMPILED_OVER_FLOOR, "below")]:
            met = value >= goal if better == "above" else value <= goal
            lines.append(f"{r['draft']} draft at {GOAL_SIZE}: {name} {value:.1f}x, goal "
                         f"{better} {goal:g}x: {'met' if met else 'SHORT'}")
    return lines


def render_markdown(report: dict) -> str:
    m = report["machine"]
    load = (f", load average {m['load_average_at_start']} at the start (a shared machine)"
            if "load_average_at_start" in m else "")
    lines = ["# Sampler benchmark\n",
             f"Machine: {m['cpu']}, {m['cores']} cores, {m['threads']} torch threads, torch "
             f"{m['torch']}, device {m.get('gpu', m['device'])}{load}. Median of "
             f"{report['repeats']} warm calls; floor = one read of every input tensor.\n",
             HEADER, "|" + "---|" * 11]
    lines += [format_row(r) for r in report["rows"]]
    lines += ["", "Goals:", ""] + [f"- {g}" for g in report["goals"]]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="minispec bench-sampler", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", default="results", help="folder for sampler.json/.md")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    device = torch.device(args.device)
    report = dict(machine=machine(device), repeats=args.repeats, rows=[])
    print(HEADER, flush=True)
    for size in SIZES:
        for one_hot in (True, False):
            row = measure(*size, one_hot=one_hot, device=device, repeats=args.repeats)
            report["rows"].append(row)
            print(format_row(row), flush=True)
    if hasattr(os, "getloadavg"):
        report["machine"]["load_average_at_end"] = round(os.getloadavg()[0], 2)
    report["goals"] = goals(report["rows"])
    print("\n".join(report["goals"]))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "sampler.json").write_text(json.dumps(report, indent=2))
    (out / "sampler.md").write_text(render_markdown(report))
    print(f"wrote {out / 'sampler.md'} and {out / 'sampler.json'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
