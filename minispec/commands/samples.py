"""How often does the default `make decode` output read as Python? (the model card's figure)

    python -m minispec samples [--n 20] [--max-new-tokens 200] [--target T --draft D]

Each sample is the default prompt plus `max_new_tokens` sampled bytes at temperature 1. Its
"parsed fraction" is the share of its lines in the longest run of whole lines, from the start,
that Python's own parser accepts: indentation, brackets and statements all have to be right, so
a text that merely looks like Python scores low. A sample "reads as Python" at >= 80 %.
"""

from __future__ import annotations

import argparse
import ast
import statistics


def parsed_fraction(text: str) -> float:
    """Share of lines in the longest parseable prefix of whole lines (the last, cut-off line and
    an unfinished block at the end naturally fall outside it)."""
    lines = text.split("\n")[:-1] or [text]  # the text after the last newline is cut mid-line
    for keep in range(len(lines), 0, -1):
        try:
            ast.parse("\n".join(lines[:keep]))
            return keep / len(lines)
        except (SyntaxError, ValueError):
            continue
    return 0.0


def main(argv: list[str] | None = None) -> int:
    from minispec.commands.args import OneLineParser, checkpoint_path, in_range, integer
    from minispec.commands.cli import DEFAULT_PROMPT

    parser = OneLineParser(
        prog="minispec samples",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument("--n", type=integer(1), default=20, help="number of samples (seeds 0..n-1)")
    parser.add_argument("--max-new-tokens", type=in_range("max_new_tokens", integer()), default=200)
    parser.add_argument("--target", type=checkpoint_path(folder_ok=True), default=None)
    parser.add_argument("--draft", type=checkpoint_path(folder_ok=True), default=None)
    args = parser.parse_args(argv)
    import minispec
    from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET

    decoder = minispec.load_decoder(args.target or DEFAULT_TARGET, args.draft or DEFAULT_DRAFT)
    out = minispec.generate(
        [DEFAULT_PROMPT] * args.n,
        temperature=1.0,
        seed=0,
        decoder=decoder,
        max_new_tokens=args.max_new_tokens,
    )
    fractions = [parsed_fraction(DEFAULT_PROMPT + text) for text in out.texts]
    reads = sum(f >= 0.8 for f in fractions)
    print(
        f"{args.n} samples of {args.max_new_tokens} bytes at temperature 1 from {DEFAULT_PROMPT!r}"
    )
    print(
        f"  parsed fraction: median {statistics.median(fractions):.2f}, "
        f"mean {statistics.mean(fractions):.2f}"
    )
    print(f"  reads as Python (>= 80 % of lines parse): {reads} of {args.n}")
    print("--- sample 0 ---")
    print(DEFAULT_PROMPT + out.texts[0])
    return 0
