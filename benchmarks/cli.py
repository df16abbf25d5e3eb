"""`minispec bench` and `minispec bench-sampler` (also `python -m benchmarks`): flags first.

Each parses its flags (flags.py: no torch) and only then imports its benchmark, so that a bad
flag is one line at once. The one check that needs torch comes next, still one line naming its
flag: whether the device is on this machine.
"""

from __future__ import annotations

from benchmarks.flags import bench_parser, parse_bench, sampler_parser
from minispec.commands.args import check_device


def bench(argv: list[str]) -> int:
    parser = bench_parser()
    args = parse_bench(parser, argv)
    check_device(parser, args.device)
    from benchmarks.harness import run

    return run(args)


def bench_sampler(argv: list[str]) -> int:
    parser = sampler_parser()
    args = parser.parse_args(argv)
    import torch

    args.device = args.device or ("cuda" if torch.cuda.is_available() else "cpu")
    check_device(parser, args.device)
    args.threads = args.threads or str(torch.get_num_threads())
    from benchmarks.sampler import run

    return run(args)
