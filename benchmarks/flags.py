"""The flags of the benchmark commands: `minispec bench`, `minispec bench-sampler`, the guard.

Apart from the benchmarks themselves, and light: nothing here imports torch, so that a bad flag
is one line at once (cli.py parses here, then imports the benchmark). Run from the repository
root, where the default --out is in the repository's results/.
"""

from __future__ import annotations

import argparse
import shlex

from benchmarks.methods import BASELINE, METHODS, Method, parse
from benchmarks.prompts import CATEGORIES
from minispec.commands.args import (
    OneLineParser,
    choice_list,
    comma_list,
    device_name,
    integer,
    real,
    thread_count,
    writable_folder,
)

VLLM_PYTHON = ".venv-vllm/bin/python"  # the Python of the environment `make vllm-check` builds
# --compile-mode's words as SpeculativeDecoder's `compile` takes them
COMPILE_MODES = {"aot": "aot", "jit": True, "eager": False}
DEFAULT_OUT = "results"  # the run whose headline the README shows


def method_list(text: str) -> list[Method]:
    """An argparse type: --methods, a comma list of methods.parse's labels."""
    try:
        return [parse(label) for label in text.split(",") if label]
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def bench_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="minispec bench",
        description="Every method against one K = 0 baseline, by prompt category (make bench): "
        "benchmarks/harness.py says what it runs, docs/benchmarks.md how to read it.",
    )
    parser.add_argument(
        "--methods",
        type=method_list,
        default="",
        help="comma list of rows beside K = 0, as proposer:K, proposer:auto or tree:K:b1,b2 "
        "(default: every row of benchmarks/methods.py this checkout can run)",
    )
    parser.add_argument("--temperatures", type=comma_list(real(0)), default="0,1")
    parser.add_argument("--categories", type=choice_list(CATEGORIES), default=",".join(CATEGORIES))
    parser.add_argument("--prompts", type=integer(1), default=8, help="prompts per category")
    parser.add_argument("--max-new-tokens", type=integer(1, 128), default=48)
    parser.add_argument("--rotations", type=integer(1), default=5)
    parser.add_argument(
        "--batch-size", type=integer(1), default=1, help="rows a call (B > 1: prompts cycled)"
    )
    parser.add_argument("--seed", type=integer(0), default=0, help="of the rotations' order")
    parser.add_argument(
        "--out",
        type=writable_folder,
        default=DEFAULT_OUT,
        help="writes OUT/bench.json and OUT/bench.md (the default: the README's block too)",
    )
    parser.add_argument(
        "--device", type=device_name, default="cpu", help="cpu or cuda (CUDA graphs there)"
    )
    parser.add_argument(
        "--threads",
        type=thread_count,
        default=1,
        help="CPU threads for the rounds (default 1: B = 1 decode steps are latency-bound); the "
        "prefill runs on every core",
    )
    parser.add_argument(
        "--draft-sample-method",
        default="auto",
        choices=("auto", "greedy", "probabilistic"),
        help="auto: one-hot drafts at T = 0, sampled ones at T > 0",
    )
    parser.add_argument("--compile-mode", choices=tuple(COMPILE_MODES), default="aot")
    parser.add_argument(
        "--vllm",
        action="store_true",
        help="instead: vLLM beside minispec on the stdlib prompts (benchmarks/bench_vllm.py)",
    )
    parser.add_argument("--vllm-python", default=VLLM_PYTHON, help="vLLM's environment's Python")
    return parser


def parse_bench(parser: OneLineParser, argv: list[str] | None) -> argparse.Namespace:
    """`minispec bench`'s flags, every check but those that need torch (cli.py's), and the
    command that made the run, for its files."""
    args = parser.parse_args(argv)
    args.command = "make bench" + (f" ARGS='{shlex.join(argv)}'" if argv else "")
    args.temperatures = [float(t) for t in args.temperatures.split(",")]
    args.categories = args.categories.split(",")
    asked = args.methods or METHODS  # argparse passes the default "" through method_list too
    args.methods = [BASELINE, *(m for m in asked if m.label != BASELINE.label)]
    return args


def sampler_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="minispec bench-sampler",
        description="The rejection sampler against itself uncompiled, the plain reference and "
        "the read floor (benchmarks/sampler.py says what each row times).",
    )
    parser.add_argument("--out", default="results", help="folder for sampler.json/.md")
    parser.add_argument(
        "--device", type=device_name, help="default: cuda when this machine has it, else cpu"
    )
    parser.add_argument("--repeats", type=integer(1), default=11)
    parser.add_argument(
        "--threads",
        type=comma_list(thread_count),
        help="comma list of CPU thread counts to run the table with, e.g. 2,1: "
        "one thread is the steady figure on a machine other jobs share (default: torch's)",
    )
    return parser


def guard_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="python -m benchmarks.guard",
        description="The speed guard (make bench-guard): a short run of the harness, compared "
        "with the kept reference; exit code 1 when a setting fell (benchmarks/guard.py).",
    )
    parser.add_argument(
        "--update",
        action="store_true",
        help="write this run as the new reference (by default the reference is only read)",
    )
    parser.add_argument(
        "--reference",
        default="results/guard.json",
        help="the reference to compare with; its .md table is written beside it",
    )
    parser.add_argument("--pairs", type=integer(2), default=6, help="rotations (K = 0 and each)")
    return parser
