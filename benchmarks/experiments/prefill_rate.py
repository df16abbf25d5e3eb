"""How close the target's prefill runs to the machine's matrix-product rate, eagerly, on the
shipped pair: `GPT.prefill` of B rows of --width tokens on every usable core, its matrix
products' float32 GFLOP/s beside a single matrix product of the same shape class (the prefill's
widest, [B * width, d_model] x [d_model, 3 d_model]), and the prefill's time by operator
(torch.profiler). Interleaved, wall seconds, median with min and max.

    python -m benchmarks.experiments.prefill_rate [--batch 16] [--width 300] [--repeats 7]
"""

import argparse
import statistics
import time

import torch
from torch.profiler import profile

from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from minispec.machine import usable_cores
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--width", type=int, default=300)
p.add_argument("--repeats", type=int, default=7)
args = p.parse_args()
torch.set_num_threads(usable_cores())
target, _ = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
target.setup_cache(args.batch)
c = target.config
tokens = torch.randint(1, 256, (args.batch, args.width))
rows = args.batch * args.width
# Matrix work: every linear of the inner blocks, and the last block's key/value projection.
per_token = (c.n_layer - 1) * (4 * c.d_model**2 + 3 * c.d_model * c.mlp_hidden)
per_token += 3 * c.d_model**2
flops = 2 * rows * per_token
a, w = torch.randn(rows, c.d_model), torch.randn(3 * c.d_model, c.d_model)
gemm_flops = 2 * rows * c.d_model * 3 * c.d_model


def timed(f) -> float:
    start = time.perf_counter()
    f()
    return time.perf_counter() - start


rates = {"prefill": [], "one matrix product": []}
with torch.inference_mode():
    target.prefill(tokens)
    for _ in range(args.repeats):
        rates["prefill"].append(flops / timed(lambda: target.prefill(tokens)) / 1e9)
        rates["one matrix product"].append(gemm_flops / timed(lambda: a @ w.T) / 1e9)
    with profile() as prof:
        target.prefill(tokens)
print(f"B = {args.batch} x {args.width} tokens, {torch.get_num_threads()} threads, float32")
print("| what | GFLOP/s of its matrix products, median (min-max) |\n|---|---|")
for name, v in rates.items():
    print(f"| {name} | {statistics.median(v):.0f} ({min(v):.0f}-{max(v):.0f}) |")
events = prof.key_averages()
total = sum(e.self_cpu_time_total for e in events)
print("\n| operator | share of the prefill's time |\n|---|---|")
for e in sorted(events, key=lambda e: -e.self_cpu_time_total)[:6]:
    print(f"| {e.key} | {100 * e.self_cpu_time_total / total:.0f} % |")
