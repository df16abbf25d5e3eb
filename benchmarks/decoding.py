"""How the benchmarks decode a set of prompts: the calls every timed run is made of."""

from __future__ import annotations

from benchmarks.summary import summed
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.stats import DecodeStats


def decode(
    decoder: SpeculativeDecoder,
    spec: SpeculativeConfig,
    prompts: list[list[int]],
    temperature: float,
    max_new: int,
    seed: int,
    batch_size: int = 1,
) -> tuple[DecodeStats, list[list[int]]]:
    """Every prompt, `batch_size` rows a call (1: each prompt its own request): the calls'
    stats summed, and each prompt's new tokens. Prompt i is seeded seed + i, whatever the spec,
    so that every method samples with the same seeds."""
    parts, ids = [], []
    for start in range(0, len(prompts), batch_size):
        group = prompts[start : start + batch_size]
        params = [
            SamplingParams(temperature=temperature, seed=seed + start + i, max_new_tokens=max_new)
            for i in range(len(group))
        ]
        out = decoder.generate(group, params, spec)
        parts.append(out.stats)
        ids += out.token_ids
    return summed(parts, spec.num_speculative_tokens), ids


def warm_up(decoder, prompts, specs: list[SpeculativeConfig], temperature: float) -> None:
    """Build or load every graph the specs can use, at the batch shape of `prompts`, before
    anything is timed: a round at each K each spec allows."""
    params = [SamplingParams(temperature=temperature, seed=0, max_new_tokens=8) for _ in prompts]
    for spec in specs:
        decoder.generate(prompts, params, spec, warm_up=True)
