"""The target's prefill on one thread against every usable core, eagerly, on the shipped pair:
B = 16 and B = 1, rows of --width tokens, interleaved (the order alternating run by run), wall
milliseconds with min and max. `SpeculativeDecoder.prefill` runs on every core
(minispec/machine.py); this measures what that buys, and on a shared machine what it costs when
another process holds a core.

    python -m benchmarks.experiments.prefill_threads [--width 320] [--repeats 7]
"""

import argparse
import os
import statistics
import time

import torch

from minispec.api import load_decoder
from minispec.machine import torch_threads, usable_cores

p = argparse.ArgumentParser()
p.add_argument("--width", type=int, default=320, help="tokens a row (a multiple of 64)")
p.add_argument("--repeats", type=int, default=7)
args = p.parse_args()
target = load_decoder(compile=False).target
cores = usable_cores()
generator = torch.Generator().manual_seed(0)
print(f"load average at the start: {os.getloadavg()[0]:.2f}")
for b in (16, 1):
    tokens = torch.randint(1, 256, (b, args.width), generator=generator)
    positions = torch.arange(args.width).expand(b, args.width)
    target.setup_cache(b)
    ms: dict[int, list[float]] = {1: [], cores: []}
    for r in range(args.repeats):
        for threads in (1, cores) if r % 2 else (cores, 1):
            with torch_threads(threads), torch.no_grad():
                start = time.perf_counter()
                target(tokens, positions)
                ms[threads].append(1000 * (time.perf_counter() - start))
    for threads, values in ms.items():
        print(
            f"B = {b}, {threads} thread(s): {statistics.median(values):.0f} ms "
            f"({min(values):.0f}-{max(values):.0f}), {len(values)} runs"
        )
