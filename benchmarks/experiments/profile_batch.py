"""Where a batch's time goes in minispec, eagerly, on the shipped pair: the target's forward at
1, 3, 5 and 9 tokens (reading the whole 512-slot cache, and at 1 and 5 tokens only the live
slots, the decoder's key_positions), the draft's 1-token step, one layer's attention over the
whole 512-slot cache against only the live slots, and the prefill of the batch's prompts
(target and draft).
Timed in CPU seconds of this process (time.process_time, one thread), interleaved, so that other
work on a shared machine distorts the figures less than wall time would.

    python -m benchmarks.experiments.profile_batch [--batch 16] [--position 360] [--repeats 9]
"""

import argparse
import statistics
import time

import torch
import torch.nn.functional as F

from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
from minispec.decode import KV_BUCKET
from model.checkpoint import load_pair

p = argparse.ArgumentParser()
p.add_argument("--batch", type=int, default=16)
p.add_argument("--position", type=int, default=360, help="the rows' position in the cache")
p.add_argument("--prefill", type=int, default=300, help="the prefill's width")
p.add_argument("--repeats", type=int, default=9)
args = p.parse_args()
torch.set_num_threads(1)
target, draft = load_pair(DEFAULT_TARGET, DEFAULT_DRAFT)
B, S = args.batch, target.config.max_seq_len
H, D = target.config.n_kv_head, target.config.head_dim
for m in (target, draft):
    m.setup_cache(B)


def step(model, t, live=None):
    x = torch.randint(0, 256, (B, t))
    pos = args.position + torch.arange(t)[None].expand(B, t)
    key_positions = None if live is None else torch.arange(live)
    return lambda: model(x, pos, key_positions)


def attention(t, keys):
    q, k, v = torch.randn(B, H, t, D), torch.randn(B, H, keys, D), torch.randn(B, H, keys, D)
    pos = args.position + torch.arange(t)[None].expand(B, t)
    mask = torch.arange(keys)[None, None, None, :] <= pos[:, None, :, None]
    return lambda: F.scaled_dot_product_attention(q, k, v, attn_mask=mask)


def prefill(model):
    x = torch.randint(0, 256, (B, args.prefill))
    return lambda: model.prefill(x)


live = args.position + 8
cases = {f"target {t}-token forward": step(target, t) for t in (1, 3, 5, 9)}
for t in (1, 5):
    slots = min(S, -(-(args.position + t) // KV_BUCKET) * KV_BUCKET)
    cases[f"target {t}-token forward, {slots} live slots"] = step(target, t, slots)
cases["draft 1-token step"] = step(draft, 1)
for t in (1, 5):
    cases[f"one layer's attention, {t} tokens, {S} slots"] = attention(t, S)
    cases[f"one layer's attention, {t} tokens, {live} slots"] = attention(t, live)
cases[f"target prefill, {args.prefill} tokens a row"] = prefill(target)
cases[f"draft prefill, {args.prefill} tokens a row"] = prefill(draft)
times = {k: [] for k in cases}
with torch.no_grad():
    for f in cases.values():
        f()
    for _ in range(args.repeats):
        for name, f in cases.items():
            start = time.process_time()
            f()
            times[name].append(time.process_time() - start)
base = statistics.median(times["target 1-token forward"])
print(f"B = {B}, position {args.position}, 1 thread, eager: CPU ms,", end=" ")
print(f"median (min-max) of {args.repeats}")
print("| what | CPU ms | x target 1-token |\n|---|---|---|")
for name, v in times.items():
    med = statistics.median(v)
    spread = f"{1e3 * min(v):.2f}-{1e3 * max(v):.2f}"
    print(f"| {name} | {1e3 * med:.2f} ({spread}) | {med / base:.2f} |")
