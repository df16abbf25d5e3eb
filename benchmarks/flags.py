"""The flags of the two benchmark commands, `minispec bench` and `minispec bench-sampler`.

Apart from the benchmarks themselves, and light: nothing here imports torch, so that a bad flag
is one line at once (cli.py parses here, then imports the benchmark). Run from the repository
root, where `--out results` is the repository's results/.
"""

from __future__ import annotations

import argparse

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
from minispec.rules import PROPOSER_NAMES, TREE_PROPOSERS

VLLM_PYTHON = ".venv-vllm/bin/python"  # the Python of the environment `make vllm-check` builds
# --compile-mode's words as SpeculativeDecoder's `compile` takes them
COMPILE_MODES = {"aot": "aot", "jit": True, "eager": False}
PARTS = ("steps", "end_to_end", "batch", "proposers", "sampler", "startup", "peer", "vllm")
OWN_REPORT = ("sampler", "peer", "vllm")  # sampler.md, peer.md, vllm/bench.md
# The proposer table runs K = "auto", and a tree has a fixed depth: trees have a bench of their
# own, make bench-tree (benchmarks/bench_tree.py).
TABLE_PROPOSERS = tuple(name for name in PROPOSER_NAMES if name not in TREE_PROPOSERS)


def table_proposers(text: str) -> str:
    """An argparse type: --proposers, a comma list of TABLE_PROPOSERS; tree is refused with
    where trees are benched, not as an unknown name."""
    if set(TREE_PROPOSERS) & {part.strip() for part in text.split(",")}:
        raise argparse.ArgumentTypeError(
            "trees are not in the proposer table, which runs K = auto (a tree needs a fixed "
            "depth): make bench-tree benches trees"
        )
    return choice_list(TABLE_PROPOSERS)(text)


def bench_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="minispec bench",
        description="Every benchmark, into results/ (make bench): the parts are listed in "
        "benchmarks/bench.py, and docs/benchmarks.md says how to read them.",
    )
    parser.add_argument(
        "--ks",
        type=comma_list(integer(1)),
        default="2,4,6,8",
        help="speculative K values (K = 0 is the baseline every row is paired with)",
    )
    parser.add_argument("--temperatures", type=comma_list(real(0)), default="0,1")
    parser.add_argument("--batch-sizes", type=comma_list(integer(1)), default="1,4,16,64")
    parser.add_argument(
        "--batch-ks",
        type=comma_list(integer(1)),
        default="2,4,8",
        help="the fixed K values of the batch table (part 3), beside K = 0 and K = auto",
    )
    parser.add_argument(
        "--batch-proposers",
        type=choice_list(("draft_model", "feature_head")),
        default="draft_model,feature_head",
        help="the batch table's proposers (part 3; feature_head with the shipped head only)",
    )
    parser.add_argument(
        "--proposers",
        type=table_proposers,
        default="draft_model,ngram,suffix",
        help="the proposer table's rows (part 3b), from " + ", ".join(TABLE_PROPOSERS),
    )
    parser.add_argument("--max-new-tokens", type=integer(1), default=128)
    parser.add_argument("--repeats", type=integer(1), default=5, help="A B pairs per row")
    parser.add_argument(
        "--prompts", type=integer(1), default=6, help="held-out prompts of 300 bytes"
    )
    parser.add_argument("--out", type=writable_folder, default="results")
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
        help="auto (greedy at T = 0, probabilistic at T > 0), greedy (one-hot q) or probabilistic",
    )
    parser.add_argument(
        "--compile-mode",
        choices=("jit", "aot"),
        default="aot",
        help="how the decoder compiles its rounds, as `minispec decode --compile-mode`",
    )
    parser.add_argument(
        "--vllm-python",
        default=VLLM_PYTHON,
        help="the Python of vLLM's environment, for part 7 (default: make vllm-check's)",
    )
    parser.add_argument(
        "--skip",
        type=choice_list(PARTS),
        default="",
        help="comma list of parts to skip: " + ",".join(PARTS),
    )
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a smoke run: K = 4, T = 0, "
        "2 pairs, 2 prompts, 32 tokens, no batch, sampler or start-up parts",
    )
    return parser


def parse_bench(parser: OneLineParser, argv: list[str] | None) -> argparse.Namespace:
    """`minispec bench`'s flags, every check but the device's (cli.py's: it needs torch), and
    --quick's settings."""
    args = parser.parse_args(argv)
    args.argv = list(argv or [])  # the command, for results/vllm/bench.md
    if args.quick:
        args.ks, args.temperatures, args.repeats, args.prompts = "4", "0", 2, 2
        args.max_new_tokens, args.skip = 32, "batch,proposers,sampler,startup,peer,vllm"
    if "end_to_end" in args.skip and "peer" not in args.skip:
        parser.error("the peer part uses the end-to-end part's best K: skip both or neither")
    return args


def sampler_parser() -> OneLineParser:
    parser = OneLineParser(
        prog="minispec bench-sampler",
        description="The rejection sampler against itself uncompiled, the plain reference and "
        "the read floor (benchmarks/bench_sampler.py says what each row times).",
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
        description="The speed guard (make bench-guard): a short part 2 of the bench, compared "
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
    parser.add_argument("--pairs", type=integer(2), default=6, help="A B pairs per setting")
    return parser
