"""Where a B = 16 round's time goes: the target's forward at 1, 3, 5 and 9 tokens and the draft's
1-token step, eager, on the shipped pair, timed interleaved; then torch.profiler's operator
split of the 1- and 5-token forwards.

    .venv/bin/python results/vllm/profile_batch.py [--batch 16] [--position 360] [--repeats 15]
        [--threads 1] [--live-keys]
"""

import argparse
import statistics
import time

import torch
from torch.profiler import ProfilerActivity, profile

from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--position", type=int, default=360)
p.add_argument("--repeats", type=int, default=15)
p.add_argument("--threads", type=int, default=1)
p.add_argument("--widths", default="1,3,5,9")
args = p.parse_args()
torch.set_num_threads(args.threads)
target, draft = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
B = args.batch
for m in (target, draft):
    m.setup_cache(B)
widths = [int(w) for w in args.widths.split(",")]


def inputs(t):
    pos = args.position + torch.arange(t)[None].expand(B, t)
    return torch.randint(0, 256, (B, t)), pos


cases = {f"target {t}": (target, *inputs(t)) for t in widths}
cases["draft 1"] = (draft, *inputs(1))
times = {k: [] for k in cases}
with torch.no_grad():
    for _ in range(2):
        for m, x, pos in cases.values():
            m(x, pos)
    for _ in range(args.repeats):
        for name, (m, x, pos) in cases.items():
            s = time.perf_counter()
            m(x, pos)
            times[name].append(time.perf_counter() - s)
base = statistics.median(times["target 1"])
print(f"B = {B}, position {args.position}, {args.threads} thread(s), eager; ms median (min-max)")
for name, v in times.items():
    med = statistics.median(v)
    print(f"  {name:10s} {1e3 * med:7.2f} ({1e3 * min(v):.2f}-{1e3 * max(v):.2f})  {med / base:.2f}x target 1")
with torch.no_grad():
    for t in (1, 5):
        m, x, pos = cases[f"target {t}"]
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            for _ in range(5):
                m(x, pos)
        print(f"\ntarget {t}-token forward, B = {B}, 5 calls:")
        print(prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=12))
