"""make gpu-check: the GPU path end to end, in one unattended command of a few minutes.

    PYTHONPATH=. python -m benchmarks.gpu_check            # on a CUDA machine: the table
    python -m benchmarks.gpu_check --write-reference       # on the CPU: the greedy reference

It needs only the project and the machine's own CUDA torch (no install, no network), and
writes results/gpu/check.md as it goes, so a run cut short still leaves what it measured:

1. Greedy tokens: eager and compiled CUDA decoding at K = 0, 4 and auto against the target's
   K = 0, T = 0 tokens computed eagerly on the CPU (results/gpu/reference.json). Where one
   differs, the CPU target's margin between its two best logits there tells a near-tie at
   float32 rounding, which the GPU's other summation order may flip, from a failure.
1b. Draft steps: the feature head's and the draft model's one step over a target step, and
   the parallel drafter's one pass at K = 4 and 8.
2. Speed at B = 1, 16 and 64, T = 0 and 1: eager and compiled K = 0, 4 and auto, interleaved
   (at B = 1 also the feature head's K = 4 and auto, and a decoder with the parallel draft at
   K = 0, 4, 8 and auto), with tok/s, the round time beside the captured round's replay alone,
   the CUDA graph captures per (B, K), and each speedup over its own K = 0 as median (min-max)
   over the rotations.
3. The law: `minispec verify --device cuda`, its checks of the sampler and the loop on the GPU.

The run fails (exit 1) on a greedy difference that is not a near-tie or a failed law check.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import importlib.util
import io
import itertools
import json
import statistics
import sys
import time
from collections import Counter
from pathlib import Path

# make gpu-check runs the machine's own Python ($(PYTHON)), which may have no torch: then one
# line, before the imports below fail with a traceback.
if importlib.util.find_spec("torch") is None:
    print(
        f"gpu-check needs a Python with torch and CUDA: {sys.executable} has no torch "
        "(name one: make gpu-check PYTHON=...)",
        file=sys.stderr,
    )
    sys.exit(2)

import torch

from benchmarks.decoding import decode, warm_up
from benchmarks.methods import BASELINE, Method, pass_width
from benchmarks.spread import format_spread, spread
from minispec.api import DEFAULT_DRAFT, DEFAULT_HEAD, DEFAULT_PARALLEL_DRAFT, DEFAULT_TARGET
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from model import tokenizer
from model.checkpoint import load_checkpoint, load_head, load_pair

REFERENCE = Path("results/gpu/reference.json")
NEW_TOKENS = 64  # per prompt, greedy check
NEAR_TIE = 1e-3  # logit margin below which a float32 GPU/CPU difference is a near-tie
SPEED_NEW_TOKENS = 128
ROTATIONS = 3


def pair_id(target: Path, draft: Path) -> str:
    return "/".join(hashlib.sha256(p.read_bytes()).hexdigest()[:16] for p in (target, draft))


def greedy(decoder: SpeculativeDecoder, ids: list[int], k, max_new: int) -> list[int]:
    params = [SamplingParams(temperature=0.0, seed=0, max_new_tokens=max_new)]
    return decoder.generate([ids], params, SpeculativeConfig(k, "auto")).token_ids[0]


def write_reference(target: Path, draft: Path, path: Path) -> dict:
    """The target's greedy K = 0 tokens, eager on the CPU, for held-out prompts."""
    from minispec.commands.prompts import held_out_prompts

    decoder = SpeculativeDecoder(*load_pair(target, draft), compile=False)
    prompts = held_out_prompts(6, 200)
    tokens = [greedy(decoder, tokenizer.encode(p), 0, NEW_TOKENS) for p in prompts]
    reference = {"pair": pair_id(target, draft), "prompts": prompts, "tokens": tokens}
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(reference, indent=1) + "\n")
    return reference


class Report:
    """results/gpu/check.md, rewritten after every line so that a cut-short run keeps it."""

    def __init__(self, path: Path) -> None:
        self.path, self.lines, self.failures = path, [], []
        path.parent.mkdir(parents=True, exist_ok=True)

    def add(self, line: str = "") -> None:
        print(line, flush=True)
        self.lines.append(line)
        self.path.write_text("\n".join(self.lines) + "\n")


def margin_at(target_cpu, prefix: list[int]) -> float:
    """The CPU target's gap, in float64, between its two best logits after `prefix`."""
    with torch.no_grad():
        logits = target_cpu.double()(torch.tensor([prefix]))[0, -1]
    top = logits.topk(2).values
    return float(top[0] - top[1])


def check_greedy(report, reference, decoders, target_cpu) -> None:
    report.add("## 1. Greedy tokens against the CPU's eager K = 0\n")
    report.add("| decoder | K | prompts equal | first differences (prompt: token, logit margin) |")
    report.add("|---|---|---|---|")
    for name, decoder in decoders:
        for k in (0, 4, "auto"):
            equal, notes = 0, []
            for i, (prompt, expected) in enumerate(zip(reference["prompts"], reference["tokens"])):
                ids = tokenizer.encode(prompt)
                got = greedy(decoder, ids, k, len(expected))
                if got == expected:
                    equal += 1
                    continue
                at = next(j for j, (a, b) in enumerate(zip(got, expected + [-1])) if a != b)
                margin = margin_at(target_cpu, ids + expected[:at])
                tie = margin < NEAR_TIE
                notes.append(f"{i}: token {at}, {margin:.1e}{' near-tie' if tie else ''}")
                if not tie:
                    report.failures.append(f"greedy {name} K = {k}, prompt {i}")
            count = f"{equal}/{len(reference['prompts'])}"
            report.add(f"| {name} | {k} | {count} | {'; '.join(notes) or '-'} |")
    report.add()


def graph_setting(key: tuple) -> tuple[int, int, bool]:
    """(B, K, adaptive) of a CudaGraphs key: a fixed-K round and adaptive K's round of the same
    width are two graphs (the adaptive one also picks the next width)."""
    _spec, shapes, statics = key
    statics = dict(statics)
    return shapes[0][0][0], int(statics["num_speculative_tokens"]), statics["adaptive"] != "None"


def captures(decoder: SpeculativeDecoder, batch: int) -> str:
    """The CUDA graphs captured for batch size `batch`, per K (a: adaptive K's)."""
    counts = Counter()
    for _, announced in decoder.rounds.values():
        for key, n in getattr(announced.fn, "captures", {}).items():
            b, k, adaptive = graph_setting(key)
            if b == batch:
                counts[f"{k}{'a' if adaptive else ''}"] += n
    return ", ".join(f"{k}: {n}" for k, n in sorted(counts.items())) or "-"


def replay_floor(decoder: SpeculativeDecoder, batch: int, k: int, repeats: int = 200) -> float:
    """Milliseconds per replay of the captured fixed-K round (batch, k), back to back. The
    graph's buffers hold the last call's state, every row done: done rows compute in place, so
    the replays move nothing."""
    for _, announced in decoder.rounds.values():
        for key, graph in getattr(announced.fn, "graphs", {}).items():
            if graph_setting(key) == (batch, k, False):
                torch.cuda.synchronize()
                start = time.perf_counter()
                for _ in range(repeats):
                    graph.replay()
                torch.cuda.synchronize()
                return 1000 * (time.perf_counter() - start) / repeats
    return float("nan")


def speed(report, decoders, prompts, batches, deadline: float) -> None:
    report.add(f"## 2. Speed at B = {', '.join(map(str, batches))} (interleaved K = 0, 4, auto)\n")
    report.add(
        "| decoder | B | T | method | tok/s | ms / round | replay alone, ms | tokens / round | "
        "speedup over K = 0 | CUDA graphs captured, per K |"
    )
    report.add("|---|---|---|---|---|---|---|---|---|---|")
    for (name, decoder), batch, temperature in itertools.product(decoders, batches, (0.0, 1.0)):
        if time.perf_counter() > deadline:
            report.add(f"| {name} | {batch} | {temperature:g} | skipped: time budget |")
            continue
        if (name == "eager" and batch > 16) or (name == "parallel" and batch > 1):
            continue
        # the draft model's K = 0, 4 and auto (auto neither eager nor at B = 64), and at B = 1
        # the feature head's; the parallel draft's decoder times its K = 4, 8 and auto at B = 1
        methods = [BASELINE, Method("draft_model", 4)]
        if name == "parallel":
            methods = [BASELINE, *(Method("parallel", k) for k in (4, 8, "auto"))]
        if name != "eager" and batch < 64:
            methods.append(Method("draft_model", "auto"))
        if batch == 1 and decoder.head is not None:
            methods += [Method("feature_head", 4), Method("feature_head", "auto")]
        rows = [tokenizer.encode(prompts[i % len(prompts)]) for i in range(batch)]
        specs = {m.label: m.spec("auto") for m in methods}
        warm_up(decoder, rows, list(specs.values()), temperature)  # compile, capture
        results = {label: [] for label in specs}
        for r in range(1 if name == "eager" else ROTATIONS):
            seed = 1000 * (r + 1)
            for label, spec in specs.items():
                stats, _ = decode(decoder, spec, rows, temperature, SPEED_NEW_TOKENS, seed, batch)
                results[label].append(stats)
        for m in methods:
            stats, base = results[m.label], results[BASELINE.label]
            tok_s = statistics.median(s.tokens_per_second for s in stats)
            ms = statistics.median(1000 * s.round_time for s in stats)
            per_round = statistics.median(s.emitted / s.batch_rounds for s in stats)
            ratios = [s.speedup_over(b) for s, b in zip(stats, base)]
            floor = "-"
            if name == "compiled" and isinstance(m.k, int) and m.proposer == "draft_model":
                floor = f"{replay_floor(decoder, batch, m.k):.3f}"
            report.add(
                f"| {name} | {batch} | {temperature:g} | {m.label} | {tok_s:.0f} | "
                f"{ms:.2f} | {floor} | {per_round:.2f} | "
                f"{format_spread(spread(ratios)) if m.k else '-'} | "
                f"{captures(decoder, batch) if name != 'eager' else '-'} |"
            )
    report.add()


def draft_steps(report, decoder) -> None:
    """The head's and the draft model's one drafting step over the target's 1-token step,
    compiled (captured) alone on the GPU: what c each proposer brings to Theorem 3.8."""
    from benchmarks.steps import measure

    report.add("## 1b. Draft steps over a target step (compiled, B = 1)\n")
    c = measure(decoder, set(), {pass_width(4), pass_width(8)}, repeats=50)["c"]
    head = f"{c['head']['1']:.3f}" if "head" in c else "-"
    one_pass = {k: c["draft"][str(pass_width(k))] for k in (4, 8)}
    report.add(
        f"draft model {c['draft']['1']:.3f}, feature head {head}; the parallel drafter's one "
        f"pass at K = 4 {one_pass[4]:.3f}, at K = 8 {one_pass[8]:.3f}\n"
    )


def law(report) -> None:
    from minispec.commands import verify

    report.add("## 3. The law on CUDA (minispec verify --device cuda)\n")
    argv = ["--device", "cuda", "--draws", "400000", "--rounds", "100000", "--loop-rows", "20000"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        code = verify.main(argv)
    report.add("```\n" + out.getvalue().strip() + "\n```")
    if code:
        report.failures.append("minispec verify --device cuda")
    report.add()


def cuda_decoder(args, compile) -> SpeculativeDecoder:
    """The pair on CUDA, with the shipped feature head when the target is the shipped one."""
    target, draft = load_pair(args.target, args.draft, "cuda")
    head = None
    if args.target == DEFAULT_TARGET and DEFAULT_HEAD.is_file():
        head = load_head(DEFAULT_HEAD, target, "cuda")[0]
    return SpeculativeDecoder(target, draft, compile=compile, head=head)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m benchmarks.gpu_check", description=__doc__)
    parser.add_argument("--target", type=Path, default=DEFAULT_TARGET)
    parser.add_argument("--draft", type=Path, default=DEFAULT_DRAFT)
    parser.add_argument("--reference", type=Path, default=REFERENCE)
    parser.add_argument("--out", type=Path, default=Path("results/gpu/check.md"))
    parser.add_argument("--budget-s", type=float, default=270, help="stop starting new cells")
    parser.add_argument("--write-reference", action="store_true")
    args = parser.parse_args(argv)
    if args.write_reference:
        write_reference(args.target, args.draft, args.reference)
        print(f"reference -> {args.reference}")
        return 0
    if not torch.cuda.is_available():
        print("gpu-check: this torch sees no CUDA device", file=sys.stderr)
        return 2
    deadline = time.perf_counter() + args.budget_s
    report = Report(args.out)
    report.add("# GPU check\n")
    report.add(
        f"`PYTHONPATH=. python -m benchmarks.gpu_check` on {torch.cuda.get_device_name()}, "
        f"torch {torch.__version__}, the pair {pair_id(args.target, args.draft)}.\n"
    )
    reference = json.loads(args.reference.read_text()) if args.reference.exists() else None
    if reference is None or reference["pair"] != pair_id(args.target, args.draft):
        report.add("The stored reference is for another pair: computed here, on the CPU.\n")
        reference = write_reference(args.target, args.draft, Path("/tmp/gpu_reference.json"))
    target_cpu, _ = load_pair(args.target, args.draft)
    # A pair each: a decoder that reallocates the KV caches for another batch size would
    # otherwise make the other recapture its graphs.
    decoders = [("eager", cuda_decoder(args, False)), ("compiled", cuda_decoder(args, True))]
    if DEFAULT_PARALLEL_DRAFT.is_file():  # the parallel drafter beside the draft model, B = 1
        target = decoders[1][1].target
        parallel = load_checkpoint(DEFAULT_PARALLEL_DRAFT, "cuda")[0]
        decoders.append(("parallel", SpeculativeDecoder(target, parallel, compile=True)))
    check_greedy(report, reference, decoders, target_cpu)
    if decoders[1][1].head is not None:
        draft_steps(report, decoders[1][1])
    speed(report, decoders, reference["prompts"], (1,), deadline)
    law(report)
    speed(report, decoders, reference["prompts"], (16, 64), deadline)
    verdict = "FAILED: " + "; ".join(report.failures) if report.failures else "passed"
    report.add(f"**{verdict}**")
    return 1 if report.failures else 0


if __name__ == "__main__":
    sys.exit(main())
