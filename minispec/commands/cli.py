"""`python -m minispec <command>` (also the `minispec` console script): the one front door.

    decode        speculative decoding with the shipped pair (make decode)
    train         train the target, then the distilled draft (make train)
    train-head    train the feature head on the target's cached states (make train-head)
    train-parallel  fine-tune the draft to draft K tokens in one forward (make train-parallel)
    bench         every method against one K = 0 baseline, by prompt category (make bench)
    bench-sampler the rejection sampler against eager, plain and the read floor
    copy-score    how well a target copies its context (the lookup proposers' ceiling)
    verify        the paper's worked example through the compiled sampler (make verify)
    kernels       the sampler's generated kernels (Triton on a GPU, C++ on a CPU)
    export        the pair as Hugging Face Llama folders (transformers, vLLM, SGLang)
    build-index   the suffix index that --proposer suffix reads (else built on first use)
    samples       how often the default decode output parses as Python

Every command runs behind the front door (front_door.py): each expected failure is one line
and exit code 2, Ctrl-C is 130, a closed pipe 141. A bad flag is reported before torch is
imported (a second of start-up): each command parses its arguments first and imports torch
after. `bench` and `bench-sampler` are the benchmarks (benchmarks/, beside this package in the
repository, not installed with it), imported only when asked for.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from importlib import import_module
from pathlib import Path
from typing import Callable

from minispec.commands.args import (
    THREADS_HELP,
    OneLineParser,
    check_device,
    checkpoint_path,
    device_name,
    fail,
    in_range,
    integer,
    real,
    thread_count,
)
from minispec.commands.front_door import run
from minispec.origins import ACCEPTED, BONUS, CORRECTIVE, TARGET
from minispec.rules import (
    DEFAULT_TREE_BRANCHING,
    DRAFT_SAMPLE_METHODS,
    HEAD_PROPOSERS,
    MAX_TREE_NODES,
    PROPOSER_NAMES,
    REJECTION_SAMPLE_METHOD_NAMES,
    TREE_PROPOSERS,
    check_seed_count,
    check_tree,
    head_problem,
)
from model import tokenizer as byte_tokenizer
from model.errors import CheckpointError
from model.hf_tokenizer import TextTokenizer, load_tokenizer
from model.storage import (
    DEFAULT_TARGET,
    HEAD_FORMAT,
    check_whole,
    default_head,
    header_metadata,
)

START = time.perf_counter()  # for time-to-first-token, measured from interpreter start-up

DEFAULT_PROMPT = "import os\n\n\ndef "
COLOURS = {ACCEPTED: "\033[32m", CORRECTIVE: "\033[33m", BONUS: "\033[36m", TARGET: ""}
RESET = "\033[0m"


AUTO_TREE_DEPTH = 4  # --proposer tree without -k: at least this deep (the flag's help)


def speculative_tokens(text: str) -> int | str:
    """-k: "auto" (in any case: AUTO means nothing else) or an int in the library's range."""
    if text.strip().lower() == "auto":
        return "auto"
    try:
        int(text)
    except ValueError:
        message = f"expected auto or an integer >= 0, got {text!r}"
        raise argparse.ArgumentTypeError(message) from None
    return in_range("num_speculative_tokens", integer())(text)


def tree_branching(text: str) -> tuple[int, ...]:
    """--tree-branching: a comma list of candidate counts, each in [1, MAX_TREE_NODES] (the
    tree as a whole is check_tree's, once -k is known)."""
    return tuple(integer(1, MAX_TREE_NODES)(part.strip()) for part in text.split(","))


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
        help="K drafts per round; 0 = target only; auto = chosen each round (with --proposer "
        "tree: the tree's depth, which auto fixes as --tree-branching says)",
    )
    p.add_argument(
        "--proposer",
        choices=PROPOSER_NAMES,
        default="draft_model",
        help="draft_model, feature_head (a head drafting from the target's own states), ngram "
        "(prompt lookup), suffix (an index over the training corpus), tree (the draft model "
        "drafts a tree, verified in one target forward; -k is its depth), parallel (a draft "
        "trained for it drafts all K tokens in one forward) or parallel_tree (a tree from that "
        "forward)",
    )
    p.add_argument(
        "--tree-branching",
        type=tree_branching,
        default=None,
        help="with --proposer tree only: the candidates each node gets at the first depths, "
        "deeper ones a chain (default 2: two candidates for the first token); at most "
        f"{MAX_TREE_NODES} nodes in all. Without -k (or with -k auto) the tree is as deep "
        f"as the branching is long, and at least {AUTO_TREE_DEPTH} deep",
    )
    p.add_argument(
        "--draft-sample-method",
        choices=DRAFT_SAMPLE_METHODS,
        default="auto",
        help="greedy (every row drafts the argmax: a one-hot q), probabilistic (every row samples "
        "its q, one-hot at T = 0) or auto (as probabilistic: greedy drafts at T = 0, per row)",
    )
    p.add_argument(
        "--rejection-sample-method",
        choices=REJECTION_SAMPLE_METHOD_NAMES,
        default="standard",
        help="standard (the default: exact, token-wise), block (exact, judges the drafts as "
        "a block), drafter_invariant (exact, and a seed gives the -k 0 text whatever "
        "-k, proposer or batch, for a few percent fewer tokens per round) or naive (biased)",
    )
    p.add_argument(
        "--temperature", type=in_range("temperature", real()), default=1.0, help="0 = greedy"
    )
    p.add_argument("--top-k", type=in_range("top_k", integer()), default=0, help="0 = off")
    p.add_argument("--top-p", type=in_range("top_p", real()), default=1.0, help="1.0 = off")
    p.add_argument(
        "--seed",
        type=in_range("seed", integer()),
        default=0,
        help="request i uses seed + i. Under drafter_invariant a seed fixes the text (the -k 0 "
        "text, for any -k, --proposer or batch); under standard and block, only for a fixed -k "
        "(-k auto follows measured round times)",
    )
    p.add_argument("--max-new-tokens", type=in_range("max_new_tokens", integer()), default=200)
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
        "--target",
        type=checkpoint_path(folder_ok=True),
        default=None,
        help="target checkpoint or model folder (default: checkpoints/target.safetensors)",
    )
    p.add_argument(
        "--draft",
        type=checkpoint_path(folder_ok=True),
        default=None,
        help="draft checkpoint or model folder (default: checkpoints/draft.safetensors; "
        "checkpoints/parallel.safetensors for the parallel proposers)",
    )
    p.add_argument(
        "--head",
        type=checkpoint_path(folder_ok=False),
        default=None,
        help="feature head checkpoint for --proposer feature_head (default: "
        "checkpoints/head.safetensors, with the shipped target)",
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


def check_across_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The rules that join flags, by the library's own checks and before torch is imported:
    --tree-branching only with the tree proposer, whose depth -k auto chooses here (the
    branching's length, at least AUTO_TREE_DEPTH) and whose size is counted, not built; and
    a seed per prompt."""
    tree = args.proposer in TREE_PROPOSERS
    if not tree and args.tree_branching is not None:
        parser.error(
            f"argument --tree-branching: only with --proposer tree or head_tree, not "
            f"{args.proposer}"
        )
    if tree:
        args.tree_branching = args.tree_branching or DEFAULT_TREE_BRANCHING
        if args.num_speculative_tokens == "auto":  # a tree has a fixed depth
            args.num_speculative_tokens = max(len(args.tree_branching), AUTO_TREE_DEPTH)
        try:
            check_tree(
                args.num_speculative_tokens, args.rejection_sample_method, args.tree_branching
            )
        except ValueError as exc:
            parser.error(str(exc))
    try:
        check_seed_count(args.seed, len(args.prompt or [DEFAULT_PROMPT]))
    except ValueError as exc:
        parser.error(f"argument --seed: {exc}")


def check_head_flag(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """The feature head, from the files' headers, before torch is imported: a proposer that
    drafts with one needs one (--head, or the shipped one with the shipped target), and the
    file --head names must hold a head that fits the target."""
    target = args.target or DEFAULT_TARGET
    drafts = args.proposer in HEAD_PROPOSERS and args.num_speculative_tokens != 0
    if drafts and args.head is None and default_head(target) is None:
        parser.error(
            f"argument --proposer: {args.proposer} drafts with a feature head trained on the "
            f"target: name one with --head (minispec train-head trains one)"
        )
    if args.head is not None and (problem := head_file_problem(args.head, target)):
        parser.error(f"argument --head: {problem}")


def head_file_problem(head: str, target: str | Path) -> str | None:
    """Why the file `head` cannot draft for `target`, from the two files' headers alone, or
    None. What only loading can tell (a checksum, a model folder's width) is load_head's and
    the decoder's to find."""
    try:
        meta = header_metadata(Path(head))
        check_whole(Path(head))
    except CheckpointError as exc:
        return str(exc)
    if meta.get("format") != HEAD_FORMAT:
        return (
            f"{head}: not a feature head (format {meta.get('format')!r}, expected "
            f"{HEAD_FORMAT!r}); minispec train-head writes one"
        )
    fields = config_fields(meta, "target_width", "max_seq_len")
    if fields is None:
        return f"{head}: its config does not parse"
    try:
        target_meta = {} if Path(target).is_dir() else header_metadata(Path(target))
    except CheckpointError:  # the target's own problem: its load names it
        return None
    wants = config_fields(target_meta, "d_model", "max_seq_len")
    if wants is None:  # a model folder, or a target whose own load names its problem
        return None
    problem = head_problem(*fields, *wants)
    return None if problem is None else f"{head} {problem}"


def config_fields(meta: dict, *names: str) -> tuple[int, ...] | None:
    """The int fields `names` of a checkpoint's config (its metadata's JSON), or None where
    it has none or they are not ints."""
    try:
        config = json.loads(meta["config"])
        values = tuple(config[name] for name in names)
    except (KeyError, TypeError, ValueError, RecursionError):
        return None
    ints = all(isinstance(v, int) and not isinstance(v, bool) for v in values)
    return values if ints else None


def run_decode(argv: list[str]) -> int:
    parser = decode_parser()
    args = parser.parse_args(argv)
    check_across_flags(parser, args)
    check_head_flag(parser, args)
    check_device(parser, args.device)  # the one check that needs torch: after every other one
    import torch  # deferred: --help and argument errors stay instant

    from minispec.api import default_draft, generate, load_decoder

    prompts = args.prompt or [DEFAULT_PROMPT]
    colour = use_colour(args.json)
    torch.set_num_threads(args.threads)
    target = args.target or DEFAULT_TARGET
    compile = args.compile_mode if args.compile and args.compile_mode != "jit" else args.compile
    draft = args.draft or default_draft(args.proposer)
    decoder = load_decoder(target, draft, args.device, compile, args.head)
    decoder.prefill_threads = args.prefill_threads
    # A checkpoint file is on the byte vocabulary; a model folder may carry its own tokenizer.
    # The draft's is the same: load_pair compared them.
    tokenizer = load_tokenizer(target) if Path(target).is_dir() else byte_tokenizer
    if args.proposer == "suffix" and decoder.suffix_index is None:
        from minispec.commands.build_index import cached_index

        decoder.suffix_index = cached_index()  # built on first use, then cached
    kwargs = dict(
        num_speculative_tokens=args.num_speculative_tokens,
        proposer=args.proposer,
        **({"tree_branching": args.tree_branching} if args.tree_branching else {}),
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


# Each command but decode lives in its own module (module:function), imported on demand so that
# `--help` stays instant. By name, not by import: the table sits above every command, and the
# benchmarks are not part of the installed package.
COMMANDS = {
    "train": "minispec.commands.train_args:main",
    "train-head": "minispec.commands.train_head:main",
    "train-parallel": "minispec.commands.train_parallel:main",
    "bench": "benchmarks.cli:bench",
    "bench-sampler": "benchmarks.cli:bench_sampler",
    "copy-score": "minispec.commands.copy_score:main",
    "export": "minispec.commands.export:main",
    "build-index": "minispec.commands.build_index:main",
    "kernels": "minispec.commands.kernels:main",
    "samples": "minispec.commands.samples:main",
    "verify": "minispec.commands.verify:main",
}


def command(name: str) -> Callable[[list[str]], int]:
    """The function that runs command `name` on the rest of the arguments."""
    if name == "decode":
        return run_decode
    if name in COMMANDS:
        module, function = COMMANDS[name].split(":")
        if module.startswith("benchmarks.") and not benchmarks_present():
            return lambda _: fail(
                f"{name} is one of the benchmarks, which live in the repository, not in the "
                "installed package: run it from a checkout's root (make bench)"
            )
        return getattr(import_module(module), function)
    if name in ("-h", "--help", "help"):
        return lambda _: print(__doc__) or 0
    return lambda _: fail(f"unknown command {name!r}; try: python -m minispec --help")


def benchmarks_present() -> bool:
    """Whether the repository's benchmarks/ package can be imported from here."""
    from importlib.util import find_spec

    return find_spec("benchmarks") is not None


def main(argv: list[str] | None = None) -> int:
    """`minispec NAME ARGS...`: run command NAME on ARGS (no name: the help) behind the front
    door; argv defaults to the process's arguments."""
    given = sys.argv[1:] if argv is None else argv
    name, rest = (given[0], given[1:]) if given else ("--help", [])
    return run(command(name), rest, program=argv is None)
