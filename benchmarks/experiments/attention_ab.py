"""A compiled cached forward of the shipped models with `cached_attention` (model/gpt.py) as it
is, written as broadcast products and sums ("sums"), against the same forward with SDPA's CPU
kernel in its place ("sdpa"): one process, the two graphs called in turn (A B A B), at the
round's shapes: the target at T = 1 (a K = 0 step), 3 and 5 (a K = 2 and K = 4 verify) and the
draft at T = 1, B = 1 and 16, the cache read up to S = 384 (position 340, a 300-byte prompt
partway through 128 new tokens). Prints the median ms of "sdpa" and the median (min-max) of the
per-pair ratio sums / sdpa, and the largest logit difference between the two.

    python -m benchmarks.experiments.attention_ab [--threads 1] [--pairs 40]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

import model.gpt
from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--threads", type=int, default=1)
p.add_argument("--pairs", type=int, default=40)
args = p.parse_args()
torch.set_num_threads(args.threads)
sums = model.gpt.cached_attention


def sdpa(q, k, v, mask):
    gqa = k.shape[1] != q.shape[1]
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)


# One function per arm, so that each has a compiled graph of its own; the module's
# cached_attention is set to the arm's before each call, which is what the graph's guard checks.
def call_sums(m, *inputs):
    return m(*inputs)


def call_sdpa(m, *inputs):
    return m(*inputs)


ARMS = {"sums": (sums, call_sums), "sdpa": (sdpa, call_sdpa)}
POSITION, LIVE = 340, 384

print(f"{args.threads} thread(s), {args.pairs} pairs")
for which, b, t in [
    ("target", 16, 1), ("target", 16, 3), ("target", 16, 5), ("draft", 16, 1),
    ("target", 1, 1), ("target", 1, 5), ("draft", 1, 1),
]:  # fmt: skip
    runs = {}
    for arm, (attention, caller) in ARMS.items():
        target, draft = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
        m = target if which == "target" else draft
        m.setup_cache(b)
        gen = torch.Generator().manual_seed(0)
        tokens = torch.randint(256, (b, POSITION + t), generator=gen)
        positions = (POSITION + torch.arange(t)).expand(b, t).contiguous()
        key_positions = torch.arange(LIVE)
        torch._dynamo.mark_dynamic(key_positions, 0)
        model.gpt.cached_attention = attention
        compiled = torch.compile(caller, dynamic=False)
        with torch.no_grad():
            m.prefill(tokens[:, :POSITION])
            inputs = (m, tokens[:, POSITION:], positions, key_positions)
            runs[arm] = (compiled, inputs, compiled(*inputs))
    ms = {arm: [] for arm in ARMS}
    with torch.no_grad():
        for _ in range(args.pairs):
            for arm, (compiled, inputs, _) in runs.items():
                model.gpt.cached_attention = ARMS[arm][0]
                start = time.perf_counter()
                compiled(*inputs)
                ms[arm].append(1e3 * (time.perf_counter() - start))
    model.gpt.cached_attention = sums
    ratios = sorted(a / b for a, b in zip(ms["sums"], ms["sdpa"]))
    diff = (runs["sums"][2] - runs["sdpa"][2]).abs().max().item()
    print(
        f"{which} B = {b} T = {t}: sdpa {statistics.median(ms['sdpa']):.2f} ms, sums / sdpa "
        f"{statistics.median(ratios):.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f}), "
        f"max |logit difference| {diff:.1e}",
        flush=True,
    )
