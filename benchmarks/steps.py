"""One forward of each model, timed alone: the steps a round is made of, c, and a memory floor.

Each model's forward over [1, T] tokens (B = 1, at POSITION, reading the slots a round reads
there) is compiled as the decoder compiles its rounds and timed in turns with the others: the
target at 1 token and at each verify width K + 1, the draft model at 1 token and at each
parallel pass's width, the feature head's step. c, measured in the same process as the decode
rows it prices, is a draft forward over the target's 1-token step. The floor is what a step
must read (weights, live KV entries) over the read bandwidth of a large sum() in the same run.
"""

from __future__ import annotations

import statistics
import time

import torch

from benchmarks.timing import in_turns
from minispec.compilation import compile_round, huge_pages
from minispec.decode import SpeculativeDecoder
from model.gpt import GPT

POSITION = 320  # about a 300-byte prompt and some of its new tokens


class HeadStep(torch.nn.Module):
    """One drafting step of the feature head: its layer at one position, then the LM head."""

    def __init__(self, target, head) -> None:
        super().__init__()
        self.target, self.head = target, head

    def forward(self, state, token, positions):
        return self.target.logits(self.head(self.target, state, token, positions))


def read_bandwidth(megabytes: int = 256, repeats: int = 7) -> float:
    """Bytes per second one sum() reads from memory, median over repeats."""
    with huge_pages.new_memory_on_huge_pages():  # as the packages' weights are
        x = torch.ones(megabytes * 2**18)  # float32
    x.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / statistics.median(times)


def model_bytes(model: GPT, live_tokens: int) -> int:
    """Weight bytes plus the KV bytes of `live_tokens` positions (B = 1): one step's reads."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    c = model.config
    return weights + 2 * c.n_layer * live_tokens * c.d_model * model.embed.weight.element_size()


@torch.no_grad()
def measure(
    decoder: SpeculativeDecoder, target_widths: set[int], draft_widths: set[int], repeats: int
) -> dict:
    """{"ms": {model: {width: ms}}, "floor_ms": {model: ms}, "c": {model: {width: ratio}}}:
    models "target", "draft" and (with a feature head) "head"; widths as str (JSON's keys)."""
    target, draft, head = decoder.target, decoder.draft, decoder.feature_head()
    device = target.embed.weight.device
    state = torch.zeros(1, 1, target.config.d_model, device=device)
    models = {"target": (target, target_widths | {1}), "draft": (draft, draft_widths | {1})}
    if head is not None:
        models["head"] = (HeadStep(target, head), {1})
    for m in (target, draft, head):
        if m is not None:
            m.setup_cache(1)
    calls = {}
    for name, (model, widths) in models.items():
        holder = torch.nn.ModuleList([model])  # what the rounds pass: its children's caches
        # The cache slots a round's forward reads, and as the rounds compile them: one
        # dynamic length (a head's step reads the cache the target's forward left).
        dynamic = "layout" if name != "head" and not decoder.static_shapes else None
        step = compile_round(
            model.forward, f"{name} step", decoder.compile, device, holder, "bench step", dynamic
        )
        for t in sorted(widths):
            token = torch.zeros(1, t, dtype=torch.long, device=device)
            positions = POSITION + torch.arange(t, device=device)[None]
            slots = decoder.key_positions(POSITION, t)
            args = (state, token, positions) if name == "head" else (token, positions, slots)
            calls[(name, str(t))] = lambda step=step, args=args: step(*args)
    medians = in_turns(calls, repeats, device)
    ms = {name: {} for name in models}
    for (name, width), seconds in medians.items():
        ms[name][width] = 1e3 * seconds
    bandwidth = read_bandwidth() if device.type == "cpu" else None
    floor = {
        name: 1e3 * model_bytes(m, POSITION) / bandwidth
        for name, m in (("target", target), ("draft", draft))
        if bandwidth
    }
    one = ms["target"]["1"]
    c = {name: {w: v / one for w, v in widths.items()} for name, widths in ms.items()}
    return {"ms": ms, "floor_ms": floor, "c": c, "read_GBps": bandwidth and bandwidth / 1e9}
