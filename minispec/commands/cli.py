"""`python -m minispec <command>` (also the `minispec` console script).

    decode        speculative decoding with the shipped pair (make decode)
    train         train the target, then the distilled draft (make train)
    bench         end-to-end, batch, sampler and start-up benchmarks (make bench)
    bench-sampler the rejection sampler against eager, plain and the read floor
    verify        the paper's worked example through the compiled sampler (make verify)
    kernels       the sampler's generated kernels (Triton on a GPU, C++ on a CPU)

Bad input is one line on stderr and exit code 2, never a traceback.
"""
from __future__ import annotations

import argparse
import codecs
import json
import sys
import time
from importlib import import_module

START = time.perf_counter()  # for time-to-first-token, measured from interpreter start-up

DEFAULT_PROMPT = "import os\n\n\ndef "
COLOURS = {"accepted": "\033[32m", "corrective": "\033[33m", "bonus": "\033[36m", "target": ""}
RESET = "\033[0m"


# Decode steps at B = 1 are latency-bound: each of a forward's ~50 kernels is microseconds of
# work, and an OpenMP team's barrier per kernel costs more than a second core saves. When another
# process holds that core the barrier waits for it to be scheduled: measured on the 2-core dev
# machine, the target's step went from 6.8 ms (1 thread) to 35-300 ms (2 threads).
THREADS_HELP = "CPU threads for torch (default 1: faster for B = 1 decoding, see minispec/commands/cli.py)"


class OneLineParser(argparse.ArgumentParser):
    """argparse, but a bad flag is one line and exit code 2 (argparse prints usage too)."""

    def error(self, message: str) -> None:
        raise SystemExit(fail(f"{self.prog}: {message}"))


def fail(message: str) -> int:
    print(f"error: {message}", file=sys.stderr)
    return 2


def decode_parser() -> argparse.ArgumentParser:
    p = OneLineParser(prog="minispec decode", description="Speculative decoding with a draft/target pair.")
    p.add_argument("--prompt", action="append", help="a prompt; repeat for a batch (default: a Python snippet)")
    p.add_argument("-k", "--num-speculative-tokens", type=int, default=4, help="K drafts per round; 0 = target only")
    p.add_argument("--draft-sample-method", default="greedy", help="greedy (one-hot q) or probabilistic")
    p.add_argument("--rejection-sample-method", default="standard", help="standard (exact) or naive (biased)")
    p.add_argument("--temperature", type=float, default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="1.0 = off")
    p.add_argument("--seed", type=int, default=0, help="request i uses seed + i")
    p.add_argument("--max-new-tokens", type=int, default=200)
    p.add_argument("--compare", action="store_true", help="also run K = 0 and print the measured speedup")
    p.add_argument("--json", action="store_true", help="print one JSON result instead of text")
    p.add_argument("--no-compile", dest="compile", action="store_false", help="run eagerly (debugging)")
    p.add_argument("--target", default=None, help="target checkpoint (default: checkpoints/target.safetensors)")
    p.add_argument("--draft", default=None, help="draft checkpoint (default: checkpoints/draft.safetensors)")
    p.add_argument("--device", default="cpu")
    p.add_argument("--threads", type=int, default=1, help=THREADS_HELP)
    return p


class Streamer:
    """Writes row 0's tokens as they are accepted, coloured by origin on a terminal, and notes
    when the first token arrived (time-to-first-token, from interpreter start-up).

    The legend and the prompt (`header`) are written with the first token, i.e. only once the
    request has passed validation: bad input leaves stdout empty.
    """

    def __init__(self, colour: bool, header: str | None) -> None:
        self.colour, self.header, self.first_token_at = colour, header, None
        self.utf8 = codecs.getincrementaldecoder("utf-8")(errors="replace")  # bytes may split a character

    def __call__(self, row: int, ids: list[int], origins: list[str]) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter() - START
            if self.header is not None:
                sys.stdout.write(self.header)
        if row or self.header is None:
            return
        for token, origin in zip(ids, origins):
            text = self.utf8.decode(bytes([token])) if token < 256 else ""
            if text:
                sys.stdout.write(f"{COLOURS[origin]}{text}{RESET}" if self.colour and COLOURS[origin] else text)
        sys.stdout.flush()


def device_problem(name: str) -> str | None:
    """Why --device `name` cannot be used here (torch would raise with a traceback), or None."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError:
        return f"unknown --device {name!r}"
    if device.type == "cpu":
        return None
    backend = getattr(torch, device.type, None)
    if backend is None or not backend.is_available():
        return f"--device {name}: no {device.type} device is available to this torch build"
    if device.index is not None and device.index >= backend.device_count():
        return f"--device {name}: there are only {backend.device_count()} {device.type} devices"
    return None


def run_decode(argv: list[str]) -> int:
    args = decode_parser().parse_args(argv)
    import torch  # deferred: --help and argument errors stay instant

    from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET, generate, load_decoder

    prompts = args.prompt or [DEFAULT_PROMPT]
    colour = sys.stdout.isatty() and not args.json
    if (problem := device_problem(args.device)) is not None:
        return fail(problem)
    if args.threads < 1:
        return fail(f"--threads must be >= 1, got {args.threads}")
    torch.set_num_threads(args.threads)
    try:
        decoder = load_decoder(args.target or DEFAULT_TARGET, args.draft or DEFAULT_DRAFT, args.device, args.compile)
        kwargs = dict(num_speculative_tokens=args.num_speculative_tokens, draft_sample_method=args.draft_sample_method,
                      rejection_sample_method=args.rejection_sample_method, temperature=args.temperature,
                      top_k=args.top_k, top_p=args.top_p, seed=args.seed, max_new_tokens=args.max_new_tokens,
                      decoder=decoder)
        if args.compile:  # compile every graph in a one-token warm-up so the timed run is warm
            generate(prompts, **{**kwargs, "max_new_tokens": 1})
            if args.compare:
                generate(prompts, **{**kwargs, "max_new_tokens": 1, "num_speculative_tokens": 0})
        legend = "legend: " + " ".join(f"{COLOURS[o]}{o}{RESET}" for o in ("accepted", "corrective", "bonus")) + "\n"
        streamer = Streamer(colour, header=None if args.json else (legend if colour else "") + prompts[0])
        result = generate(prompts, **kwargs, on_tokens=streamer)
        baseline = generate(prompts, **{**kwargs, "num_speculative_tokens": 0}) if args.compare else None
    except ValueError as exc:  # includes CheckpointError
        return fail(str(exc))
    except KeyboardInterrupt:
        return 130
    stats = result.stats
    if args.json:
        report = {"requests": [{"prompt": p, "text": t, "token_ids": ids, "origins": o}
                               for p, t, ids, o in zip(prompts, result.texts, result.token_ids, result.origins)],
                  "stats": stats.to_dict(), "time_to_first_token_s": streamer.first_token_at}
        if baseline:
            c = stats.cost_ratio()
            report["baseline_stats"] = baseline.stats.to_dict()
            report["speedup"] = stats.tokens_per_second / baseline.stats.tokens_per_second
            report["stats"]["c"] = c
        print(json.dumps(report))
        return 0
    print()
    for i, text in enumerate(result.texts[1:], start=1):
        print(f"--- request {i} ---\n{prompts[i]}{text}")
    print(f"\n--- stats (torch {torch.__version__}, {args.device}, "
          f"{'compiled' if args.compile else 'eager'}) ---", file=sys.stderr)
    print(stats.summary(baseline.stats if baseline else None), file=sys.stderr)
    if baseline:
        print(baseline.stats.summary(), file=sys.stderr)
    return 0


# Each command but decode lives in its own module, imported on demand so `--help` stays instant.
COMMANDS = {"train": "minispec.commands.train", "bench": "minispec.commands.bench", "bench-sampler": "minispec.commands.bench_sampler",
            "kernels": "minispec.commands.kernels", "verify": "minispec.commands.verify"}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    command, rest = (argv[0], argv[1:]) if argv else ("--help", [])
    if command == "decode":
        return run_decode(rest)
    if command in COMMANDS:
        return import_module(COMMANDS[command]).main(rest)
    if command in ("-h", "--help", "help"):
        print(__doc__)
        return 0
    return fail(f"unknown command {command!r}; try: python -m minispec --help")
