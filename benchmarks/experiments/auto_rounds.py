"""`-k auto` against K = 0 call by call, compiled (jit), on the shipped pair and the bench's
held-out prompts: each call's rounds-only tok/s, and for auto the rounds each width ran and
their median time, the first round's width and the family's relative round times after the
call. The calls alternate (K = 0 first in even rotations, auto first in odd ones), in one
process, as `make bench` part 7 runs them; what it shows is whether a slow auto call chose
badly or ran slowly at every width.

    python -m benchmarks.experiments.auto_rounds [--batch 16] [--threads 2] [--temperature 1]
"""

import argparse
import statistics

import minispec.policies.adaptive
import minispec.policies.width_choice
from benchmarks.bench_proposers import warm_up
from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from minispec.commands.prompts import held_out_prompts
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.threads import torch_threads
from model import tokenizer
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--threads", type=int, default=2)
p.add_argument("--temperature", type=float, default=1.0)
p.add_argument("--rotations", type=int, default=6)
p.add_argument("--max-new-tokens", type=int, default=128)
args = p.parse_args()
decoder = SpeculativeDecoder(*load_pair(DEFAULT_TARGET, DEFAULT_DRAFT), compile=True)
texts = held_out_prompts(6)
prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(args.batch)]
widths = minispec.policies.width_choice.DEFAULT_WIDTHS
timed: list[tuple[int, float]] = []  # the (width, seconds) of every timed round of a call
observe = minispec.policies.adaptive.RoundTimes.observe


def recording_observe(self, k: int, seconds: float, previous=None) -> None:
    timed.append((k, seconds))
    observe(self, k, seconds, previous)


minispec.policies.adaptive.RoundTimes.observe = recording_observe
specs = {"K = 0": SpeculativeConfig(0), "auto": SpeculativeConfig("auto")}
print(f"B = {args.batch}, T = {args.temperature:g}, {args.threads} threads, rounds only")
with torch_threads(args.threads):
    warm_up(decoder, prompts, list(specs.values()), args.temperature)
    for r in range(args.rotations):
        for name in specs if r % 2 == 0 else reversed(specs):
            timed.clear()
            params = [
                SamplingParams(
                    temperature=args.temperature,
                    seed=1000 * r + i,
                    max_new_tokens=args.max_new_tokens,
                )
                for i in range(args.batch)
            ]
            stats = decoder.generate(prompts, params, specs[name]).stats
            line = f"rotation {r}, {name}: {stats.emitted / stats.decode_time:.0f} tok/s"
            if name == "auto":
                by_width: dict[int, list[float]] = {}
                for k, seconds in timed:
                    by_width.setdefault(k, []).append(1e3 * seconds)
                line += "; " + ", ".join(
                    f"K = {k}: {len(ms)} rounds, median {statistics.median(ms):.1f} ms"
                    for k, ms in sorted(by_width.items())
                )
                family = decoder.families[next(reversed(decoder.families))]
                relative = " ".join(f"{t:.2f}" for t in family.times.relative(widths).tolist())
                line += f"; first round K = {timed[0][0]}; relative times {relative}"
            print(line, flush=True)
