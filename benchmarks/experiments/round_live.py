"""Compiled (torch.compile) rounds at B = 16 reading only the live KV cache slots against the
whole cache, on the shipped pair and the bench's held-out prompts: CPU ms per round (this
process, one thread), interleaved live / full, min / median / max over the repeats.

"full" sets the decoder's KV_BUCKET past max_seq_len, so that every round reads all slots
through the same graph. Run from a checkout without key_positions (PYTHONPATH=that checkout),
the script times that checkout's static graphs instead ("static").

    python -m benchmarks.experiments.round_live [--batch 16] [--ks 0,4] [--repeats 3]
"""

import argparse
import statistics
import time

import torch

import minispec.decode
from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from minispec.commands.prompts import held_out_prompts
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from model import tokenizer
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--ks", default="0,4")
p.add_argument("--max-new-tokens", type=int, default=128)
p.add_argument("--repeats", type=int, default=3)
args = p.parse_args()
torch.set_num_threads(1)
decoder = SpeculativeDecoder(*load_pair(DEFAULT_TARGET, DEFAULT_DRAFT), compile=True)
texts = held_out_prompts(6)
prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(args.batch)]
live_bucket = getattr(minispec.decode, "KV_BUCKET", None)
modes = {"live": live_bucket, "full": 10**6} if live_bucket else {"static": None}


def cpu_ms_per_round(k: int, mode: str, seed: int) -> tuple[float, float, list]:
    """CPU ms per round of a call (its prefill and first round taken out by a 1-token call),
    wall ms per round as the loop times them, and the tokens."""
    if modes[mode] is not None:
        minispec.decode.KV_BUCKET = modes[mode]
    cpu = []
    for max_new in (1, args.max_new_tokens):
        params = [
            SamplingParams(temperature=0.0, seed=seed + i, max_new_tokens=max_new)
            for i in range(len(prompts))
        ]
        start = time.process_time()
        out = decoder.generate(prompts, params, SpeculativeConfig(k))
        cpu.append((time.process_time() - start, out.stats.batch_rounds))
    (first, _), (call, rounds) = cpu
    return 1e3 * (call - first) / (rounds - 1), 1e3 * out.stats.round_time, out.token_ids


for k in map(int, args.ks.split(",")):
    for mode in modes:  # compiles (once for both modes: the live length is a dynamic size)
        cpu_ms_per_round(k, mode, 0)
    times = {mode: ([], []) for mode in modes}
    tokens = {}
    for r in range(args.repeats):
        for mode in modes:
            cpu, wall, tokens[mode] = cpu_ms_per_round(k, mode, 1000 * r)
            times[mode][0].append(cpu)
            times[mode][1].append(wall)
    same = len({str(t) for t in tokens.values()}) == 1
    for mode, (cpu, wall) in times.items():
        print(
            f"| {args.batch} | {k} | {mode} | {statistics.median(cpu):.2f} ({min(cpu):.2f}-"
            f"{max(cpu):.2f}) | {statistics.median(wall):.2f} ({min(wall):.2f}-{max(wall):.2f}) "
            f"| {'same tokens' if same else 'TOKENS DIFFER'} |",
            flush=True,
        )
