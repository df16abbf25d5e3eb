"""The Python API: text in, text + token ids + stats out, with the shipped pair by default."""
from __future__ import annotations

from functools import lru_cache
from pathlib import Path
from typing import Callable, NamedTuple

from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.stats import DecodeStats
from model import tokenizer
from model.checkpoint import load_pair

CHECKPOINTS = Path(__file__).resolve().parent.parent / "checkpoints"
DEFAULT_TARGET = CHECKPOINTS / "target.safetensors"
DEFAULT_DRAFT = CHECKPOINTS / "draft.safetensors"


class GenerateResult(NamedTuple):
    texts: list[str]
    token_ids: list[list[int]]
    origins: list[list[str]]
    stats: DecodeStats


@lru_cache(maxsize=4)
def load_decoder(target: str | Path = DEFAULT_TARGET, draft: str | Path = DEFAULT_DRAFT,
                 device: str = "cpu", compile: bool = True) -> SpeculativeDecoder:
    """Load a checkpoint pair once per process and wrap it in a (compiled) decoder."""
    target_model, draft_model = load_pair(target, draft, device=device)
    return SpeculativeDecoder(target_model, draft_model, compile=compile)


def generate(prompts: list[str], *, num_speculative_tokens: int | str = "auto",
             draft_sample_method: str = "auto", rejection_sample_method: str = "standard",
             proposer: str = "draft_model", warm_up: bool = False,
             temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0,
             seed: int | None = None, max_new_tokens: int = 128,
             params: list[SamplingParams] | None = None,
             decoder: SpeculativeDecoder | None = None,
             on_tokens: Callable[[int, list[int], list[str]], None] | None = None
             ) -> GenerateResult:
    """Speculatively decode each prompt. Sampling arguments apply to every request, unless
    `params` gives one SamplingParams per prompt; request i's seed is seed + i when seeded.
    `warm_up`: compile every graph the settings can use (one round per K) and stop."""
    if isinstance(prompts, str):
        raise ValueError("prompts must be a list of strings, got a single string")
    for i, text in enumerate(prompts):
        if not text:
            raise ValueError(f"prompt {i} is empty")
    if params is None:
        params = [SamplingParams(temperature, top_k, top_p, None if seed is None else seed + i,
                                 max_new_tokens) for i in range(len(prompts))]
    spec = SpeculativeConfig(num_speculative_tokens, draft_sample_method, rejection_sample_method,
                             proposer)
    decoder = decoder or load_decoder()
    out = decoder.generate([tokenizer.encode(p) for p in prompts], params, spec, on_tokens,
                           warm_up=warm_up)
    texts = [tokenizer.decode(ids) for ids in out.token_ids]
    return GenerateResult(texts, out.token_ids, out.origins, out.stats)
