"""`make bench-auto`: K = "auto" against the best fixed K at B = 1 on code from outside the
corpus (the pair trained on the standard library; these prompts are cut from numpy's sources).

Each rotation decodes every prompt once at K = 0, K = 4 and K = auto, in turn, in one process
(draft model, the rounds compiled as --compile-mode says, one thread). Reported: each
setting's tok/s, the medians of the per-rotation ratios auto / K = 4 and auto / K = 0 with
their min and max, and the rounds auto ran at each K (which tells a width it locked onto from
noise). Writes results/auto.md and results/auto.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections import Counter
from pathlib import Path

import numpy
import torch

from benchmarks.bench_proposers import decode_all, warm_up
from benchmarks.flags import COMPILE_MODES
from benchmarks.spread import format_spread, spread
from minispec.api import load_decoder
from minispec.params import SpeculativeConfig
from model import tokenizer

SETTINGS = {"K=0": 0, "K=4": 4, "auto": "auto"}


def outside_prompts(count: int, length: int = 300) -> list[str]:
    """`count` prompts of `length` bytes, each from its own numpy source file (sorted, every
    n-th), starting at a line start a third of the way in."""
    files = sorted(Path(numpy.__file__).parent.rglob("*.py"))
    files = [f for f in files if "tests" not in f.parts and f.stat().st_size > 4 * length]
    prompts = []
    for path in files[:: max(len(files) // count, 1)][:count]:
        text = path.read_text(encoding="utf-8", errors="replace")
        start = text.index("\n", len(text) // 3) + 1
        prompts.append(text[start : start + length])
    return prompts


def run(args: argparse.Namespace) -> dict:
    torch.set_num_threads(args.threads)
    decoder = load_decoder(compile=COMPILE_MODES[args.compile_mode])
    prompts = [tokenizer.encode(p) for p in outside_prompts(args.prompts)]
    report: dict = {"prompts": args.prompts, "rotations": args.rotations, "rows": []}
    for temperature in args.temperatures:
        specs = {name: SpeculativeConfig(k) for name, k in SETTINGS.items()}
        warm_up(decoder, prompts[:1], list(specs.values()), temperature)
        rate = {name: [] for name in specs}
        chosen: Counter = Counter()  # auto's rounds at each K, over every rotation
        for r in range(args.rotations):
            for name, spec in specs.items():
                stats = decode_all(
                    decoder, prompts, spec, temperature, args.max_new_tokens, 1000 * r, False
                )
                rate[name].append(stats.tokens_per_second)
                if name == "auto":
                    chosen.update(stats.k_histogram)
        row = {
            "temperature": temperature,
            "tokens_per_s": {name: statistics.median(v) for name, v in rate.items()},
            "auto_over_K4": spread([a / b for a, b in zip(rate["auto"], rate["K=4"])]),
            "auto_over_K0": spread([a / b for a, b in zip(rate["auto"], rate["K=0"])]),
            "K4_over_K0": spread([a / b for a, b in zip(rate["K=4"], rate["K=0"])]),
            "auto_k_histogram": dict(sorted(chosen.items())),
        }
        print(format_row(row), flush=True)
        report["rows"].append(row)
    return report


HEADER = (
    "| T | tok/s K=0 | tok/s K=4 | tok/s auto | auto / K=4 (min-max) | auto / K=0 | K=4 / K=0 "
    "| K chosen by auto (rounds) |\n"
    "|---|---|---|---|---|---|---|---|"
)


def format_row(row: dict) -> str:
    rates = row["tokens_per_s"]
    return (
        f"| {row['temperature']:g} | {rates['K=0']:.1f} | {rates['K=4']:.1f} | "
        f"{rates['auto']:.1f} | {format_spread(row['auto_over_K4'], '')} | "
        f"{format_spread(row['auto_over_K0'])} | {format_spread(row['K4_over_K0'])} | "
        + " ".join(f"{k}:{n}" for k, n in row["auto_k_histogram"].items())
        + " |"
    )


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_auto", description=__doc__)
    p.add_argument("--temperatures", type=lambda s: [float(t) for t in s.split(",")], default="0,1")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--rotations", type=int, default=7)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile-mode", choices=tuple(COMPILE_MODES), default="aot")
    p.add_argument("--out", default="results")
    args = p.parse_args(argv)
    report = run(args)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    (out / "auto.json").write_text(json.dumps(report, indent=2))
    command = "make bench-auto" + (f" ARGS='{' '.join(argv)}'" if argv else "")
    lines = [
        "# K = auto against K = 4 and K = 0, B = 1, code from outside the corpus\n",
        f"Made by `{command}`: {args.prompts} prompts of 300 bytes cut from numpy's sources x "
        f"{args.max_new_tokens} new tokens, each its own request, {args.rotations} rotations of "
        f"K = 0, K = 4, auto (draft model, {args.compile_mode} rounds, {args.threads} thread). "
        "Ratios: the median of the per-rotation ratios (min-max).\n",
        HEADER,
        *map(format_row, report["rows"]),
    ]
    (out / "auto.md").write_text("\n".join(lines) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
