"""`python -m minispec <command>` (also the `minispec` console script): the one front door.

    decode        speculative decoding with the shipped pair (make decode)
    train         train the target, then the distilled draft (make train)
    bench         end-to-end, batch, sampler and start-up benchmarks (make bench)
    bench-sampler the rejection sampler against eager, plain and the read floor
    copy-score    how well a target copies its context (the lookup proposers' ceiling)
    verify        the paper's worked example through the compiled sampler (make verify)
    kernels       the sampler's generated kernels (Triton on a GPU, C++ on a CPU)
    export        the pair as Hugging Face Llama folders (transformers, vLLM, SGLang)
    build-index   the suffix index that --proposer suffix reads (else built on first use)
    samples       how often the default decode output parses as Python

Every command runs through `main`, which turns each expected failure into one line: bad input
(a flag, a prompt, a checkpoint, a folder) is one line on stderr and exit code 2; Ctrl-C at any
moment, even while torch is still importing, is exit code 130; a reader that goes away early
(`| head`) ends the run quietly with 141, as SIGPIPE would; a command started with stdout
closed (`>&-`) is one line and exit code 2 before it runs, since its output could go nowhere.
A traceback means a bug.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import threading
import time
import warnings
from importlib import import_module
from typing import Callable

from minispec.commands.args import (
    THREADS_HELP,
    OneLineParser,
    device_name,
    fail,
    integer,
    real,
    thread_count,
)
from minispec.origins import ACCEPTED, BONUS, CORRECTIVE, TARGET
from model import tokenizer as byte_tokenizer
from model.hf_tokenizer import TextTokenizer, load_tokenizer

START = time.perf_counter()  # for time-to-first-token, measured from interpreter start-up

DEFAULT_PROMPT = "import os\n\n\ndef "
COLOURS = {ACCEPTED: "\033[32m", CORRECTIVE: "\033[33m", BONUS: "\033[36m", TARGET: ""}
RESET = "\033[0m"
EXIT_INTERRUPTED, EXIT_BROKEN_PIPE = 130, 141  # 128 + SIGINT, 128 + SIGPIPE: what a shell shows


def speculative_tokens(text: str) -> int | str:
    """-k: "auto" or an int >= 0."""
    return text if text == "auto" else integer(0)(text)


def decode_parser() -> argparse.ArgumentParser:
    p = OneLineParser(
        prog="minispec decode", description="Speculative decoding with a draft/target pair."
    )
    p.add_argument(
        "--prompt", action="append", help="a prompt; repeat for a batch (default: a Python snippet)"
    )
    p.add_argument(
        "-k",
        "--num-speculative-tokens",
        type=speculative_tokens,
        default="auto",
        help="K drafts per round; 0 = target only; auto = chosen each round",
    )
    p.add_argument(
        "--proposer",
        default="draft_model",
        help="draft_model, ngram (prompt lookup) or suffix (an index over the training corpus)",
    )
    p.add_argument(
        "--draft-sample-method",
        default="auto",
        help="greedy (every row drafts the argmax: a one-hot q), probabilistic (every row samples "
        "its q, one-hot at T = 0) or auto (as probabilistic: greedy drafts at T = 0, per row)",
    )
    p.add_argument(
        "--rejection-sample-method",
        default="standard",
        help="standard (the default: exact, token-wise), block (exact, judges the drafts as "
        "a block), drafter_invariant (exact, and a seed gives the -k 0 text whatever "
        "-k, proposer or batch, for a few percent fewer tokens per round) or naive (biased)",
    )
    p.add_argument("--temperature", type=real(), default=1.0, help="0 = greedy")
    p.add_argument("--top-k", type=integer(), default=0, help="0 = off")
    p.add_argument("--top-p", type=real(), default=1.0, help="1.0 = off")
    p.add_argument(
        "--seed",
        type=integer(),
        default=0,
        help="request i uses seed + i. Under drafter_invariant a seed fixes the text (the -k 0 "
        "text, for any -k, --proposer or batch); under standard and block, only for a fixed -k "
        "(-k auto follows measured round times)",
    )
    p.add_argument("--max-new-tokens", type=integer(), default=200)
    p.add_argument(
        "--compare", action="store_true", help="also run K = 0 and print the measured speedup"
    )
    p.add_argument("--json", action="store_true", help="print one JSON result instead of text")
    p.add_argument(
        "--no-compile", dest="compile", action="store_false", help="run eagerly (debugging)"
    )
    p.add_argument(
        "--compile-mode",
        choices=("auto", "aot", "jit"),
        default="auto",
        help="auto (default): on the CPU, start eagerly while a background process compiles "
        "each round graph into a package on disk, and switch to it once built (a switch may "
        "change float rounding: aot or --no-compile give bitwise-repeatable output); "
        "aot: compile each package first, then decode; on CUDA, both as jit. jit: "
        "torch.compile each round graph (Dynamo traces it again in every process)",
    )
    p.add_argument(
        "--target", default=None, help="target checkpoint (default: checkpoints/target.safetensors)"
    )
    p.add_argument(
        "--draft", default=None, help="draft checkpoint (default: checkpoints/draft.safetensors)"
    )
    p.add_argument("--device", type=device_name, default="cpu")
    p.add_argument("--threads", type=thread_count, default=1, help=THREADS_HELP)
    p.add_argument(
        "--prefill-threads",
        type=thread_count,
        default=None,
        help="CPU threads for the prefill (default: every core; 1 when other work holds the "
        "other cores, since a busy core stalls every parallel step)",
    )
    return p


class Streamer:
    """Writes row 0's text as its tokens are accepted, coloured by origin on a terminal, and
    notes when the first token arrived (time-to-first-token, from interpreter start-up).

    The legend and the prompt (`header`) are written with the first token, i.e. only once the
    request has passed validation: bad input leaves stdout empty. Text comes from re-decoding
    all of the row's ids with `tokenizer` and writing what is new, so it is the decoded text
    whatever the tokenizer (bytes, or a model folder's own, whose tokens need not be whole
    characters or decode alone).
    """

    def __init__(
        self, colour: bool, header: str | None, tokenizer: TextTokenizer = byte_tokenizer
    ) -> None:
        self.colour, self.header, self.first_token_at = colour, header, None
        self.tokenizer, self.ids, self.shown = tokenizer, [], ""

    def __call__(self, row: int, ids: list[int], origins: list[str]) -> None:
        if self.first_token_at is None:
            self.first_token_at = time.perf_counter() - START
            if self.header is not None:
                sys.stdout.write(self.header)
        if row or self.header is None:
            return
        for token, origin in zip(ids, origins):
            self.ids.append(token)
            text = self.tokenizer.decode(self.ids)
            if not text.endswith("\ufffd"):  # else a character's bytes may still be arriving
                self.write(text, origin)
        sys.stdout.flush()

    def write(self, text: str, origin: str) -> None:
        new, self.shown = text[len(self.shown) :], text
        if new and self.colour and COLOURS[origin]:
            new = f"{COLOURS[origin]}{new}{RESET}"
        sys.stdout.write(new)

    def finish(self) -> None:
        """Write what was held back: a cut-off character ends the text as U+FFFD, as it does in
        the decoded text (--json) - dropping it would make the two disagree."""
        if self.header is not None and self.first_token_at is not None:
            self.write(self.tokenizer.decode(self.ids), TARGET)


def use_colour(json_output: bool) -> bool:
    """Colour only on a terminal, and never when NO_COLOR is set to anything (no-color.org)."""
    return not json_output and sys.stdout.isatty() and not os.environ.get("NO_COLOR")


def json_safe(value):
    """`value` with every NaN or infinite float made None: JSON has no NaN, and a figure that
    could not be measured is missing (null), not a number."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_safe(v) for v in value]
    return value


def run_decode(argv: list[str]) -> int:
    args = decode_parser().parse_args(argv)
    import torch  # deferred: --help and argument errors stay instant

    from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET, generate, load_decoder

    prompts = args.prompt or [DEFAULT_PROMPT]
    colour = use_colour(args.json)
    torch.set_num_threads(args.threads)
    target = args.target or DEFAULT_TARGET
    compile = args.compile_mode if args.compile and args.compile_mode != "jit" else args.compile
    decoder = load_decoder(target, args.draft or DEFAULT_DRAFT, args.device, compile)
    decoder.prefill_threads = args.prefill_threads
    tokenizer = load_tokenizer(target)  # the draft's is the same: load_pair compared them
    if args.proposer == "suffix" and decoder.suffix_index is None:
        from minispec.commands.build_index import cached_index

        decoder.suffix_index = cached_index()  # built on first use, then cached
    kwargs = dict(
        num_speculative_tokens=args.num_speculative_tokens,
        proposer=args.proposer,
        draft_sample_method=args.draft_sample_method,
        rejection_sample_method=args.rejection_sample_method,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        max_new_tokens=args.max_new_tokens,
        decoder=decoder,
        tokenizer=tokenizer,
    )
    if args.compile and args.compile_mode != "auto":  # compile every graph, so the run is warm
        generate(prompts, **kwargs, warm_up=True)
        if args.compare:
            generate(prompts, **{**kwargs, "num_speculative_tokens": 0}, warm_up=True)
    legend = (
        "legend: "
        + " ".join(f"{COLOURS[o]}{o}{RESET}" for o in (ACCEPTED, CORRECTIVE, BONUS))
        + "\n"
    )
    header = None  # with --json, nothing is streamed
    if not args.json:
        header = (legend if colour else "") + prompts[0]
    streamer = Streamer(colour, header, tokenizer)
    result = generate(prompts, **kwargs, on_tokens=streamer)
    streamer.finish()
    baseline = (
        generate(prompts, **{**kwargs, "num_speculative_tokens": 0}) if args.compare else None
    )
    stats = result.stats
    if args.json:
        rows = zip(prompts, result.texts, result.token_ids, result.origins)
        report = {
            "requests": [
                {"prompt": p, "text": t, "token_ids": ids, "origins": o} for p, t, ids, o in rows
            ],
            "stats": stats.to_dict(),
            "time_to_first_token_s": streamer.first_token_at,
        }
        if baseline:
            report["baseline_stats"] = baseline.stats.to_dict()
            report["speedup"] = stats.speedup_over(baseline.stats)
        print(json.dumps(json_safe(report), allow_nan=False))
        return 0
    print()
    for i, text in enumerate(result.texts[1:], start=1):
        print(f"--- request {i} ---\n{prompts[i]}{text}")
    print(
        f"\n--- stats (torch {torch.__version__}, {args.device}, "
        f"{'compiled ' + args.compile_mode if args.compile else 'eager'}) ---",
        file=sys.stderr,
    )
    print(stats.summary(baseline.stats if baseline else None), file=sys.stderr)
    if baseline:
        print(baseline.stats.summary(), file=sys.stderr)
    return 0


# Each command but decode lives in its own module, imported on demand so `--help` stays instant.
COMMANDS = {
    "train": "minispec.commands.train",
    "bench": "minispec.commands.bench",
    "bench-sampler": "minispec.commands.bench_sampler",
    "copy-score": "minispec.commands.copy_score",
    "export": "minispec.commands.export",
    "build-index": "minispec.commands.build_index",
    "kernels": "minispec.commands.kernels",
    "samples": "minispec.commands.samples",
    "verify": "minispec.commands.verify",
}


def command(name: str) -> Callable[[list[str]], int]:
    """The function that runs command `name` on the rest of the arguments."""
    if name == "decode":
        return run_decode
    if name in COMMANDS:
        return import_module(COMMANDS[name]).main
    if name in ("-h", "--help", "help"):
        return lambda _: print(__doc__) or 0
    return lambda _: fail(f"unknown command {name!r}; try: python -m minispec --help")


def importing(name: str) -> bool:
    """Whether module `name` is being imported at this moment (importlib marks its spec)."""
    return bool(getattr(getattr(sys.modules.get(name), "__spec__", None), "_initializing", False))


class CtrlC:
    """Ctrl-C raises KeyboardInterrupt as usual, and is also remembered: a library that catches
    the interrupt and raises something else instead (an import machinery error, a worker pool's
    failure) must still end as an interrupt, not as a traceback. A second Ctrl-C is ignored, so
    that it cannot break into the clean-up of the first (an atomic save, the exit itself).

    While torch itself is being imported, an exception cannot be raised safely: its C++ start-up
    may abort the process with a C++ stack trace, or CPython records the interrupt as unhandled
    and kills the process with SIGINT at exit. Measured here with Ctrl-C at random moments of
    the first 3 s: 3 of 16 and 2 of 16 runs ended that way (and one abort), 0 of 20 once the
    process ends on the spot instead, which is safe: nothing has been written yet.
    """

    pressed = False

    @staticmethod
    def handler(signum: int, frame: object) -> None:
        CtrlC.pressed = True
        signal.signal(signal.SIGINT, signal.SIG_IGN)
        if importing("torch"):
            os._exit(EXIT_INTERRUPTED)
        raise KeyboardInterrupt


def unwritable_stdout() -> OSError | None:
    """Flush stdout; when that fails (the reader closed the pipe, the disk is full), point the
    file descriptor at /dev/null so the interpreter's own flush at exit cannot fail again with a
    traceback (the recipe in Python's `signal` documentation), and return the error."""
    try:
        sys.stdout.flush()
        return None
    except OSError as exc:
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        os.close(devnull)
        return exc


def one_line(exc: BaseException) -> str:
    if isinstance(exc, MemoryError):
        return f"out of memory {exc}".strip()
    if isinstance(exc, OSError) and exc.strerror:  # "[Errno 28] ..." says nothing more to a user
        return f"{exc.filename}: {exc.strerror}" if exc.filename else exc.strerror
    return str(exc) or type(exc).__name__


def front_door(argv: list[str]) -> int:
    closed = [name for name in ("stdout", "stderr") if getattr(sys, name) is None]
    for name in closed:  # started with the stream closed (`>&-`): write nowhere
        setattr(sys, name, open(os.devnull, "w"))
    if "stdout" in closed:  # the output would be lost: say so (on stderr, if it is open)
        return fail("stdout is closed: the output would be lost; redirect it to a file instead")
    problem: BaseException | None = None
    try:
        name, rest = (argv[0], argv[1:]) if argv else ("--help", [])
        code = command(name)(rest)
    except KeyboardInterrupt:
        return EXIT_INTERRUPTED
    except SystemExit:
        raise  # argparse's verdict (--help, or a bad flag already reported in one line)
    except BaseException as exc:
        if CtrlC.pressed:  # whatever the interrupt turned into on its way up
            return EXIT_INTERRUPTED
        if not isinstance(exc, (ValueError, OSError, MemoryError)):  # CheckpointError: ValueError
            raise  # a bug: the traceback is what a report needs
        code, problem = 2, exc
    unwritable = unwritable_stdout()
    if isinstance(problem, BrokenPipeError) or isinstance(unwritable, BrokenPipeError):
        return EXIT_BROKEN_PIPE  # the reader has gone (`| head`): no one is left to tell
    if unwritable is not None and (problem is None or isinstance(problem, OSError)):
        problem = OSError(f"cannot write the output: {one_line(unwritable)}")
    return fail(one_line(problem)) if problem is not None else code


def one_line_warning(message, category, filename, lineno, file=None, line=None) -> None:
    print(f"warning: {' '.join(str(message).split())}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Run one command (argv defaults to the process's arguments) behind the front door."""
    program = argv is None  # this process is the command, not a Python caller
    owns_signals = threading.current_thread() is threading.main_thread()
    previous = signal.signal(signal.SIGINT, CtrlC.handler) if owns_signals else None
    CtrlC.pressed = False
    shown = warnings.showwarning
    warnings.showwarning = one_line_warning
    try:
        return front_door(list(sys.argv[1:] if program else argv))
    except KeyboardInterrupt:  # in the few lines of front_door outside its own `try`
        return EXIT_INTERRUPTED
    finally:
        warnings.showwarning = shown
        if owns_signals:
            # The program is done: a late Ctrl-C must not interrupt the interpreter's exit.
            restore = signal.default_int_handler if previous is None else previous  # None: set in C
            signal.signal(signal.SIGINT, signal.SIG_IGN if program else restore)
