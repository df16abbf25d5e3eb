"""What a decoder accepts, checked once: its models and settings when it is built, and each
request before anything is computed. Every bad input raises one ValueError (TypeError for a
wrong type) that names it; the API and the command line rely on these checks."""

from __future__ import annotations

import numbers

import torch

from minispec.params import SamplingParams, SpeculativeConfig
from minispec.proposers import PROPOSERS
from minispec.rules import TREE_PROPOSERS
from model.gpt import GPT
from model.head import FeatureHead
from model.tokenizer import BOS_TOKEN_ID, VOCAB_SIZE


def check_decoder(
    target: GPT, draft: GPT | None, head, compile, eos_token_id, prefill_threads
) -> None:
    """SpeculativeDecoder's arguments."""
    for name, model in (("target", target), ("draft", draft)):
        if not (isinstance(model, GPT) or (name == "draft" and model is None)):
            kind = "a GPT" + (" or None" if name == "draft" else "")
            raise TypeError(f"{name} must be {kind}, got {type(model).__name__}")
    for name, model in (("target", target), ("draft", draft)):
        if model is not None and any(t.is_meta for t in (*model.parameters(), *model.buffers())):
            raise ValueError(
                f"{name} is on the meta device, which holds shapes but no weights: load its "
                f"weights (model.checkpoint.load_checkpoint) or build it on cpu or cuda"
            )
    if compile not in (True, False, "aot", "auto"):
        raise ValueError(f'compile must be True, False, "aot" or "auto", got {compile!r}')
    if eos_token_id is not None and (
        isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int) or eos_token_id < 0
    ):
        raise ValueError(f"eos_token_id must be an int >= 0 or None, got {eos_token_id!r}")
    if prefill_threads is not None and (
        isinstance(prefill_threads, bool)
        or not isinstance(prefill_threads, int)
        or prefill_threads < 1
    ):
        raise ValueError(f"prefill_threads must be an int >= 1 or None, got {prefill_threads!r}")
    if draft is not None and draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) differs from the "
            f"target's ({target.config.vocab_size})"
        )
    if isinstance(head, FeatureHead) and head.config.target_width != target.config.d_model:
        raise ValueError(
            f"head reads states of width {head.config.target_width}, the target's are "
            f"{target.config.d_model}"
        )
    loads_head = callable(head) and not isinstance(head, torch.nn.Module)
    if not (head is None or isinstance(head, FeatureHead) or loads_head):
        raise TypeError(
            f"head must be a FeatureHead, a function that loads one, or None, got "
            f"{type(head).__name__}"
        )


def check_request(
    prompts: list[list[int]],
    params: list[SamplingParams],
    spec: SpeculativeConfig,
    on_tokens,
    warm_up,
    decoder,
) -> None:
    """One generate() call's prompts (token ids), SamplingParams, SpeculativeConfig, on_tokens
    (callable or None) and warm_up (a bool: "no" would be truthy, and a call would warm up and
    decode nothing), against what the decoder holds: the models and index its proposer needs,
    the target's vocabulary and the context in tokens."""
    if not isinstance(spec, SpeculativeConfig):
        raise TypeError(f"spec must be a SpeculativeConfig, got {type(spec).__name__}")
    check_params(params)
    check_prompt_lists(prompts)
    if on_tokens is not None and not callable(on_tokens):
        raise TypeError(f"on_tokens must be callable or None, got {type(on_tokens).__name__}")
    if not isinstance(warm_up, bool):
        raise TypeError(f"warm_up must be a bool (True or False), got {type(warm_up).__name__}")
    spec.validate()
    k, needs = max(spec.widths), PROPOSERS[spec.proposer].needs
    head = decoder.head if decoder.head is not None else decoder.load_head  # read on first use
    held = {"draft": decoder.draft, "suffix_index": decoder.suffix_index, "head": head}
    if k > 0 and needs is not None and held[needs] is None:
        raise ValueError(f"proposer {spec.proposer!r} needs SpeculativeDecoder(..., {needs}=...)")
    if not prompts or len(params) != len(prompts):
        raise ValueError(
            f"params must hold one SamplingParams per prompt: got {len(params)} for "
            f"{len(prompts)} prompts"
        )
    target, context = decoder.target, decoder.max_seq_len
    vocab = target.config.vocab_size
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        p.validate()
        if len(prompt) < 2:  # BOS plus at least one token
            raise ValueError(f"prompt {i} is empty")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            raise ValueError(f"prompt {i} has token ids that are not ints")
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
        if (bos := known_bos(target)) is not None and prompt[0] != bos:
            raise ValueError(
                f"prompt {i} does not start with BOS (id {bos}): encode text with "
                f"model.tokenizer.encode, which puts BOS first"
            )
        if len(prompt) + p.max_new_tokens + spec.verify_width > context:
            drafts = "tree nodes" if spec.proposer in TREE_PROPOSERS else "num_speculative_tokens"
            raise ValueError(
                f"prompt {i}: {len(prompt)} prompt tokens + max_new_tokens "
                f"{p.max_new_tokens} + {drafts} {spec.verify_width} exceed the "
                f"context of {context} tokens"
            )


def check_params(params: list[SamplingParams]) -> None:
    """TypeError unless `params` is a list of SamplingParams (one per prompt: check_request)."""
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"params must be a list of SamplingParams, got {type(params).__name__}")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")


def check_prompt_lists(prompts: list[list[int]]) -> None:
    """TypeError unless `prompts` is a list of token id lists (their ids: check_request)."""
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of token id lists, got {type(prompts).__name__}")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(
                f"prompts[{i}] must be a list of token ids, got {type(prompt).__name__}"
            )


def known_bos(target: GPT) -> int | None:
    """The BOS a prompt must start with on the byte vocabulary, else None (docs/reliability.md)."""
    return BOS_TOKEN_ID if target.config.vocab_size == VOCAB_SIZE else None
