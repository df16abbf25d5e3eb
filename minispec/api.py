"""The Python API: text in, text + token ids + stats out, with the shipped pair by default."""

from __future__ import annotations

import inspect
import json
import os
import warnings
from functools import lru_cache
from pathlib import Path
from typing import Callable, NamedTuple

import torch

from minispec.decode import SpeculativeDecoder
from minispec.machine import device_problem
from minispec.params import SamplingParams, SpeculativeConfig, check_int, check_params
from minispec.rules import DEFAULT_TREE_BRANCHING, PARALLEL_PROPOSERS, check_seed_count
from minispec.stats import DecodeStats
from model import tokenizer as byte_tokenizer
from model.checkpoint import CheckpointError, load_head, load_pair
from model.hf_tokenizer import TextTokenizer
from model.storage import (  # noqa: F401 (CHECKPOINTS: the API's name for the folder too)
    CHECKPOINTS,
    DEFAULT_DRAFT,
    DEFAULT_HEAD,
    DEFAULT_PARALLEL_DRAFT,
    DEFAULT_TARGET,
    default_head,
)


class GenerateResult(NamedTuple):
    texts: list[str]
    token_ids: list[list[int]]
    origins: list[list[str]]
    stats: DecodeStats


def load_decoder(
    target: str | Path = DEFAULT_TARGET,
    draft: str | Path = DEFAULT_DRAFT,
    device: str = "cpu",
    compile: bool | str = True,
    head: str | Path | None = None,
) -> SpeculativeDecoder:
    """Load a checkpoint pair (and a feature head trained on the target, for the feature_head
    and head_tree proposers, read on first use; None: the shipped one, with the shipped target
    only) once per process and wrap it in a (compiled) decoder; `compile` as
    SpeculativeDecoder's. A bad argument raises TypeError or ValueError naming it."""
    for name, path in (("target", target), ("draft", draft), ("head", head)):
        if not isinstance(path, (str, os.PathLike)) and not (name == "head" and path is None):
            raise TypeError(f"{name} must be a path (str or Path), got {type(path).__name__}")
    if not isinstance(compile, (bool, str)):
        raise TypeError(f"compile must be a bool or a str, got {type(compile).__name__}")
    if compile not in (True, False, "aot", "auto"):
        raise ValueError(f"compile must be True, False, 'aot' or 'auto', got {compile!r}")
    check_device(device)
    head = default_head(target) if head is None else head
    return cached_decoder(target, draft, device, compile, head)


def check_device(device: str | torch.device) -> None:
    """TypeError unless `device` names a device; ValueError unless this machine has it."""
    if not isinstance(device, (str, torch.device)):
        raise TypeError(
            f"device must be a str such as 'cpu' or 'cuda', got {type(device).__name__}"
        )
    if (problem := device_problem(device)) is not None:
        raise ValueError(f"device {str(device)!r}: {problem}")


@lru_cache(maxsize=4)
def cached_decoder(
    target: str | Path, draft: str | Path, device: str, compile: bool | str, head: str | Path | None
) -> SpeculativeDecoder:
    """load_decoder's work, once per process for each set of (checked) arguments. The head is
    read on the first call that drafts with it."""
    target_model, draft_model = load_pair(target, draft, device=device)
    load = None if head is None else lambda: load_head(head, target_model, device)[0]
    eos = (
        hf_eos_token_id(target, target_model)
        if Path(target).is_dir()
        else byte_tokenizer.EOS_TOKEN_ID
    )
    return SpeculativeDecoder(
        target_model, draft_model, compile=compile, eos_token_id=eos, head=load
    )


def hf_eos_token_id(folder: str | Path, model: torch.nn.Module) -> int | None:
    """The id where a Hugging Face model's output ends: generation_config.json's when the
    folder has one, else config.json's, as transformers' generate reads them. None: the model
    has none."""
    folder = Path(folder)
    file = folder / "generation_config.json"
    if not file.is_file():
        file = folder / "config.json"
    try:
        value = json.loads(file.read_text()).get("eos_token_id")
    except (OSError, ValueError, AttributeError):
        raise CheckpointError(f"{file}: not a JSON object with an eos_token_id") from None
    if isinstance(value, list):  # chat models may list several ends; the loop stops at one
        if len(value) > 1:
            warnings.warn(
                f"{file} lists {len(value)} eos_token_ids {value}: minispec stops "
                f"only at the first, {value[0]}",
                stacklevel=2,
            )
        value = value[0] if value else None
    if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
        raise CheckpointError(f"{file}: eos_token_id must be an int, got {value!r}")
    vocab_size = model.config.vocab_size
    if value is not None and not 0 <= value < vocab_size:
        raise CheckpointError(
            f"{folder}: eos_token_id {value} is outside the vocabulary [0, {vocab_size})"
        )
    return value


def generate(
    prompts: list[str],
    *,
    num_speculative_tokens: int | str = "auto",
    draft_sample_method: str = "auto",
    rejection_sample_method: str = "standard",
    proposer: str = "draft_model",
    tree_branching: tuple[int, ...] = DEFAULT_TREE_BRANCHING,
    warm_up: bool = False,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    max_new_tokens: int = 128,
    params: list[SamplingParams] | None = None,
    decoder: SpeculativeDecoder | None = None,
    on_tokens: Callable[[int, list[int], list[str]], None] | None = None,
    tokenizer: TextTokenizer = byte_tokenizer,
) -> GenerateResult:
    """Speculatively decode each prompt. Sampling arguments apply to every request, unless
    `params` gives one SamplingParams per prompt; request i's seed is seed + i when seeded.
    `tree_branching`: proposer "tree"'s candidates per node at the first depths
    (SpeculativeConfig). `warm_up`: compile every graph the settings can use (one round per K)
    and stop.
    `tokenizer` encodes the prompts and decodes the texts (hf_tokenizer.load_tokenizer gives a
    model folder's own); it must be the one the decoder's models were trained with.

    A bad argument raises TypeError (wrong type) or ValueError (wrong value) naming it: here
    the text's (prompts, tokenizer) and the shared sampling arguments', the rest by the
    decoder (minispec/params.py)."""
    check_tokenizer(tokenizer)
    if decoder is not None and not isinstance(decoder, SpeculativeDecoder):
        raise TypeError(
            f"decoder must be a SpeculativeDecoder or None, got {type(decoder).__name__}"
        )
    prompt_ids = encode_prompts(prompts, tokenizer)
    shared = dict(
        temperature=temperature, top_k=top_k, top_p=top_p, seed=seed, max_new_tokens=max_new_tokens
    )
    if params is None:
        params = shared_params(len(prompts), **shared)
    else:
        check_params(params)
        check_not_both(shared)
    spec = SpeculativeConfig(
        num_speculative_tokens,
        draft_sample_method,
        rejection_sample_method,
        proposer,
        tree_branching=tree_branching,
    )
    if decoder is None:
        # Before the shipped pair loads (seconds): the values need no model. A given decoder
        # checks every argument itself, once, with what only it knows (its proposers, its
        # context).
        spec.validate()
        for p in params:
            p.validate()
        decoder = load_decoder(draft=default_draft(proposer))
    out = decoder.generate(prompt_ids, params, spec, on_tokens, warm_up=warm_up)
    texts = [tokenizer.decode(ids) for ids in out.token_ids]
    return GenerateResult(texts, out.token_ids, out.origins, out.stats)


def default_draft(proposer: str) -> Path:
    """The shipped draft `proposer` drafts with (the parallel ones: their own fine-tune)."""
    return DEFAULT_PARALLEL_DRAFT if proposer in PARALLEL_PROPOSERS else DEFAULT_DRAFT


def shared_params(
    count: int, temperature: float, top_k: int, top_p: float, seed: int | None, max_new_tokens: int
) -> list[SamplingParams]:
    """One SamplingParams per prompt from generate's shared arguments; request i's seed is
    seed + i when seeded, else each request draws its own."""
    seeds = [None] * count
    if seed is not None:
        check_int("seed", seed, "an int or None")
        check_seed_count(seed, count)
        seeds = [seed + i for i in range(count)]
    return [SamplingParams(temperature, top_k, top_p, s, max_new_tokens) for s in seeds]


def check_not_both(shared: dict) -> None:
    """ValueError when generate's shared sampling arguments are given beside `params`, which
    sets each request's own: one of them would be ignored without a word."""
    defaults = inspect.signature(generate).parameters
    given = [name for name, value in shared.items() if value != defaults[name].default]
    if given:
        raise ValueError(
            f"give params or {', '.join(given)}, not both: params sets each request's sampling"
        )


def check_tokenizer(tokenizer) -> None:
    """TypeError unless `tokenizer` has encode and decode methods (model.tokenizer or a
    hf_tokenizer.load_tokenizer result)."""
    if not all(callable(getattr(tokenizer, m, None)) for m in ("encode", "decode")):
        raise TypeError(
            f"tokenizer must have encode and decode methods (model.tokenizer, or "
            f"hf_tokenizer.load_tokenizer(folder)), got {type(tokenizer).__name__}"
        )


def encode_prompts(prompts: list[str], tokenizer: TextTokenizer) -> list[list[int]]:
    """Each prompt's token ids, after checking that `prompts` is a non-empty list of texts."""
    if isinstance(prompts, str) or not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of strings, got {type(prompts).__name__}")
    if not prompts:
        raise ValueError("prompts is empty: give at least one prompt")
    ids = []
    for i, text in enumerate(prompts):
        if not isinstance(text, str):
            raise TypeError(f"prompts[{i}] must be a str, got {type(text).__name__}")
        if not text:
            raise ValueError(f"prompts[{i}] is empty")
        try:
            text.encode("utf-8")  # what every tokenizer needs; a lone surrogate has no form
        except UnicodeEncodeError:
            raise ValueError(
                f"prompts[{i}] is not valid Unicode text (it has no UTF-8 form)"
            ) from None
        ids.append(tokenizer.encode(text))
    return ids
