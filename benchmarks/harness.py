"""`make bench` (`python -m benchmarks`): every method against one K = 0 baseline, by category.

1. Steps (steps.py): each model's forward timed alone, for c and against its memory floor.
2. Rotations, at each temperature: every method of methods.py once over every prompt of every
   category (prompts.py), in an order shuffled anew for each category (seeded), after an untimed
   warm-up that builds or loads every graph. --batch-size B decodes each category's prompts
   (cycled to fill) B rows at a time.
3. Correctness, from the same runs: at T = 0 each method's tokens against K = 0's; at T > 0
   the target's mean log-likelihood of each method's first-rotation samples against K = 0's
   (Welch's z, as `make vllm-check` compares engines).
4. OUT/bench.json holds the raw counts, from which summary.py and tables.py compute every
   figure; OUT/bench.md the tables, with the default --out the README's block too; all written
   after each temperature.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from pathlib import Path

import torch

from benchmarks import bench_vllm, tables
from benchmarks.decoding import decode, warm_up
from benchmarks.flags import COMPILE_MODES, DEFAULT_OUT
from benchmarks.methods import BASELINE, ONE_PASS, Method, pass_width, unavailable
from benchmarks.prompts import categories
from benchmarks.steps import measure as measure_steps
from benchmarks.summary import record
from benchmarks.timing import machine
from benchmarks.vllm_check import compare_ids, sample_nll, sampling_verdict
from minispec.api import DEFAULT_DRAFT, default_draft, load_decoder
from minispec.decode import SpeculativeDecoder
from model import tokenizer


def rotate(decoders, methods, prompts: dict[str, list], temperature: float, args) -> tuple:
    """Every method once over every category per rotation, each on the decoder of its draft
    (decoders: by api.default_draft's path): (runs, ids), each {label: [ {category: ...} per
    rotation ]}: the stats' records, the new tokens. Each category runs every method in an
    order shuffled anew, so that a method's seconds are spread over the whole rotation and a
    drift in the machine's pace within it falls on every method alike."""
    spec_of = {m: m.spec(args.draft_sample_method) for m in methods}
    first = next(iter(prompts.values()))[: args.batch_size]  # one call's shape
    for m in methods:
        warm_up(decoders[default_draft(m.proposer)], first, [spec_of[m]], temperature)
    order = random.Random(f"{args.seed} {temperature}")
    runs = {m.label: [] for m in methods}
    ids = {m.label: [] for m in methods}
    for r in range(args.rotations):
        start, seed = time.perf_counter(), 1000 * r
        for m in methods:
            runs[m.label].append({})
            ids[m.label].append({})
        for category, ps in prompts.items():
            for m in order.sample(methods, len(methods)):
                decoder = decoders[default_draft(m.proposer)]
                stats, ids[m.label][r][category] = decode(
                    decoder, spec_of[m], ps, temperature, args.max_new_tokens, seed, args.batch_size
                )
                runs[m.label][r][category] = record(stats)
        seconds = time.perf_counter() - start
        print(f"  T = {temperature:g}, rotation {r + 1}: {seconds:.0f} s", flush=True)
    return runs, ids


def same_text(ids: list[dict], base: list[dict]) -> dict:
    """T = 0: how many prompts, over every rotation, decode to K = 0's tokens; the first that
    does not, as "category prompt i, token j"."""
    equal, of, first = 0, 0, None
    for mine, theirs in zip(ids, base):
        for category, rows in mine.items():
            n, where = compare_ids(rows, theirs[category])
            equal, of = equal + n, of + len(rows)
            if where and first is None:
                first = f"{category} {where}"
    return {"equal": equal, "of": of, "first_difference": first}


def correctness(decoder, prompts, temperature, ids) -> dict:
    """T = 0: same_text; T > 0: each method's first-rotation samples' mean log-likelihood under
    the target (nats per token), against K = 0's."""
    base = ids[BASELINE.label]
    if temperature == 0:
        return {label: same_text(mine, base) for label, mine in ids.items()}
    flat = [p for ps in prompts.values() for p in ps]
    nll = {
        label: sample_nll(decoder.target, flat, [s for c in prompts for s in runs[0][c]])
        for label, runs in ids.items()
    }
    checks = {}
    for label, values in nll.items():
        checks[label] = {"log_likelihood": -statistics.fmean(values)}
        if label != BASELINE.label:
            checks[label] |= sampling_verdict(values, nll[BASELINE.label])
    return checks


def decoders_for(methods: list[Method], args) -> tuple[dict, list[Method], dict[str, str]]:
    """The decoder of each draft the methods use (by its path: api.default_draft, the parallel
    drafter's for its proposers), the methods that can run, and why the others cannot."""
    compile = COMPILE_MODES[args.compile_mode]
    main = load_decoder(device=args.device, compile=compile)
    has_head = main.feature_head() is not None
    skipped = {m.label: why for m in methods if (why := unavailable(m, has_head))}
    runnable = [m for m in methods if m.label not in skipped]
    decoders = {DEFAULT_DRAFT: main}
    for m in runnable:
        if (draft := default_draft(m.proposer)) not in decoders:
            decoders[draft] = load_decoder(draft=draft, device=args.device, compile=compile)
    if any(m.proposer == "suffix" for m in runnable):
        from minispec.commands.build_index import cached_index

        main.suffix_index = cached_index()  # built on first use, over the training corpus
    return decoders, runnable, skipped


def steps(decoder: SpeculativeDecoder, methods: list[Method]) -> dict:
    ks = {m.k for m in methods if isinstance(m.k, int) and m.k}
    passes = {pass_width(m.k) for m in methods if m.proposer in ONE_PASS and isinstance(m.k, int)}
    return measure_steps(decoder, {k + 1 for k in ks}, passes, repeats=21)


def write(report: dict, out: Path) -> None:
    """OUT/bench.json and OUT/bench.md, and with the default --out the README's block; the
    tables read the record back from JSON, as a test of the README does."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    saved = json.loads((out / "bench.json").read_text())
    (out / "bench.md").write_text(tables.render(saved))
    if out == Path(DEFAULT_OUT) and saved["settings"]["batch_size"] == 1:
        readme = Path("README.md")
        text = readme.read_text()
        start, end = text.index(tables.README_BEGIN), text.index(tables.README_END)
        end += len(tables.README_END)
        readme.write_text(text[:start] + tables.readme_block(saved) + text[end:])


def filled(prompts: list, batch_size: int) -> list:
    """The prompts cycled to fill whole batches (as they are at B = 1)."""
    rows = -(-len(prompts) // batch_size) * batch_size
    return [prompts[i % len(prompts)] for i in range(rows)]


SETTINGS = (
    "batch_size",
    "max_new_tokens",
    "rotations",
    "threads",
    "compile_mode",
    "seed",
    "draft_sample_method",
)


def run(args: argparse.Namespace) -> int:
    """The harness (args: benchmarks.flags.parse_bench's)."""
    start = time.perf_counter()
    torch.set_num_threads(args.threads)
    decoders, methods, skipped = decoders_for(args.methods, args)
    texts = {c: ps for c, ps in categories(args.prompts).items() if c in args.categories}
    if args.vllm:
        path = Path(args.out) / "vllm" / "bench.md"
        bench_vllm.vllm_section(decoders[DEFAULT_DRAFT], texts["stdlib"], args, path)
        return 0
    prompts = {
        c: filled([tokenizer.encode(t) for t in ps], args.batch_size)
        for c, ps in texts.items()
        if ps
    }
    report = {
        "command": args.command,
        "machine": machine(torch.device(args.device), args.threads),
        "settings": {name: getattr(args, name) for name in SETTINGS},
        "prompts": texts,
        "skipped": skipped,
        "temperatures": {},
    }
    print("steps", flush=True)
    report["steps"] = steps(decoders[DEFAULT_DRAFT], methods)
    for temperature in args.temperatures:
        print(f"T = {temperature:g}: {', '.join(m.label for m in methods)}", flush=True)
        runs, ids = rotate(decoders, methods, prompts, temperature, args)
        checks = correctness(decoders[DEFAULT_DRAFT], prompts, temperature, ids)
        report["temperatures"][f"{temperature:g}"] = {"runs": runs, "correctness": checks}
        report["wall_s"] = time.perf_counter() - start
        write(report, Path(args.out))
        print(f"wrote {args.out}/bench.md and {args.out}/bench.json", flush=True)
    return 0
