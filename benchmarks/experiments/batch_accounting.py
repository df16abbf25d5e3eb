"""A B = 16 generate() call's CPU time split into its prefill and its rounds, eagerly, on the
shipped pair and the bench's held-out prompts, for K = 0 and fixed K: how much of the call a
faster decode can shorten, and the tokens a round gives each row against eq. (1) of Leviathan
et al. at the call's acceptance rate alpha, (1 - alpha^(K+1)) / (1 - alpha): the batch's rounds
run until its slowest row is done. CPU seconds of this process (one thread), so that other work on a
shared machine distorts the figures less than wall time would.

    python -m benchmarks.experiments.batch_accounting [--batch 16] [--ks 0,2,4] [--repeats 2]
"""

import argparse
import statistics
import time

import torch

from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from minispec.commands.prompts import held_out_prompts
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from model import tokenizer
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--ks", default="0,2,4")
p.add_argument("--temperatures", default="0,1")
p.add_argument("--max-new-tokens", type=int, default=128)
p.add_argument("--repeats", type=int, default=2)
args = p.parse_args()
torch.set_num_threads(1)
decoder = SpeculativeDecoder(*load_pair(DEFAULT_TARGET, DEFAULT_DRAFT), compile=False)
texts = held_out_prompts(6)
prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(args.batch)]


def cpu_of(k, temperature, max_new, seed):
    params = [
        SamplingParams(temperature=temperature, seed=seed + i, max_new_tokens=max_new)
        for i in range(len(prompts))
    ]
    start = time.process_time()
    stats = decoder.generate(prompts, params, SpeculativeConfig(k)).stats
    return time.process_time() - start, stats


print(f"B = {args.batch}, eager, 1 thread, CPU seconds, median of {args.repeats}")
print(
    "| T | K | call | prefill (+1 round) | rounds | prefill share | rounds | tokens/round/row "
    "| eq. (1) at alpha |"
)
print("|---|---|---|---|---|---|---|---|---|")
for temperature in map(float, args.temperatures.split(",")):
    for k in map(int, args.ks.split(",")):
        calls, firsts, rounds, per_row, expected = [], [], [], [], []
        for r in range(args.repeats):
            first, _ = cpu_of(k, temperature, 1, 1000 * r)
            call, stats = cpu_of(k, temperature, args.max_new_tokens, 1000 * r)
            calls.append(call)
            firsts.append(first)
            rounds.append(stats.batch_rounds)
            per_row.append(stats.emitted / stats.batch_rounds / len(prompts))
            alpha = stats.alpha if k else 0.0
            expected.append((1 - alpha ** (k + 1)) / (1 - alpha) if alpha < 1 else k + 1)
        c, f = statistics.median(calls), statistics.median(firsts)
        print(
            f"| {temperature:g} | {k} | {c:.2f} | {f:.2f} | {c - f:.2f} | {100 * f / c:.0f} % | "
            f"{statistics.median(rounds):.0f} | {statistics.median(per_row):.2f} | "
            f"{statistics.median(expected):.2f} |",
            flush=True,
        )
