"""The API refuses, in one TypeError or ValueError naming the argument, what it would otherwise
ignore, truncate or fail on deep inside: sampling arguments beside `params`, float token ids,
something that is not a tokenizer, a device this machine lacks, a path that is not one, a
decoder built from a string, a misspelt "auto", and a feature head that cannot draft for the
target (given, or returned by its loader: checked before the first round)."""

from __future__ import annotations

import dataclasses
from functools import cache
from pathlib import Path

import pytest
from _enumerate import random_gpt, random_head

import minispec
from minispec.api import DEFAULT_HEAD, load_decoder
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from model.checkpoint import save_checkpoint
from model.head import FeatureHead
from model.tokenizer import VOCAB_SIZE


@cache
def decoder() -> SpeculativeDecoder:
    target, draft = (random_gpt(VOCAB_SIZE, seed, max_seq_len=32) for seed in (0, 1))
    return SpeculativeDecoder(target, draft, compile=False)


def one_line(info: pytest.ExceptionInfo, fragment: str) -> None:
    message = str(info.value)
    assert fragment in message and "\n" not in message, message


GENERATE_MISUSES = [
    (dict(params=[SamplingParams(max_new_tokens=2)], temperature=0), ValueError, "temperature"),
    (dict(params=[SamplingParams(max_new_tokens=2)], seed=3), ValueError, "params or seed"),
    (dict(tokenizer=None), TypeError, "tokenizer must have encode and decode"),
    (dict(tokenizer="bytes"), TypeError, "tokenizer must have encode and decode"),
    (dict(num_speculative_tokens="AUTO"), ValueError, "'auto' or an int, got 'AUTO'"),
]


@pytest.mark.parametrize("kwargs,error,fragment", GENERATE_MISUSES)
def test_generate_refuses(kwargs: dict, error: type, fragment: str) -> None:
    kwargs = {"max_new_tokens": 2, **kwargs} if "params" not in kwargs else kwargs
    with pytest.raises(error) as info:
        minispec.generate(["hi"], decoder=decoder(), **kwargs)
    one_line(info, fragment)


def test_params_alone_still_decode() -> None:
    out = minispec.generate(["hi"], decoder=decoder(), params=[SamplingParams(max_new_tokens=3)])
    assert len(out.token_ids[0]) == 3


def test_float_token_ids_are_refused_not_truncated() -> None:
    params = [SamplingParams(max_new_tokens=2)]
    with pytest.raises(ValueError) as info:
        decoder().generate([[256.0, 97.5]], params, SpeculativeConfig(2))
    one_line(info, "prompt 0 has token ids that are not ints")


LOAD_MISUSES = [
    (dict(device="cuda"), ValueError, "no cuda device"),
    (dict(device=5), TypeError, "device must be a str"),
    (dict(device="gpu"), ValueError, "unknown device 'gpu'"),
    (dict(target=["a.safetensors"]), TypeError, "target must be a path"),
    (dict(draft={"x": 1}), TypeError, "draft must be a path"),
]


@pytest.mark.parametrize("kwargs,error,fragment", LOAD_MISUSES)
def test_load_decoder_refuses(kwargs: dict, error: type, fragment: str) -> None:
    if kwargs.get("device") == "cuda" and minispec.api.torch.cuda.is_available():
        pytest.skip("this machine has CUDA")
    with pytest.raises(error) as info:
        load_decoder(**kwargs, compile=False)
    one_line(info, fragment)


@pytest.mark.parametrize("args", [("t",), (None,), (random_gpt(8, 0), "d")])
def test_a_decoder_needs_models(args: tuple) -> None:
    with pytest.raises(TypeError) as info:
        SpeculativeDecoder(*args)
    one_line(info, "must be a GPT")


def short_head(head: FeatureHead) -> FeatureHead:
    """`head` with half the context: its rotary tables stop short of the target's positions."""
    config = dataclasses.replace(head.config, max_seq_len=head.config.max_seq_len // 2)
    short = FeatureHead(config, VOCAB_SIZE)
    short.load_state_dict(head.state_dict())
    return short.eval()


HEADS_THAT_DO_NOT_FIT = {
    "meta": (lambda head: head.to("meta"), "is on the meta device"),
    "float64": (lambda head: head.double(), "holds torch.float64 on cpu, the target torch.float32"),
    "short": (short_head, "has a context of 16 tokens, shorter than the target's 32"),
}


@pytest.mark.parametrize("case", HEADS_THAT_DO_NOT_FIT)
def test_a_head_that_does_not_fit_the_target_is_refused_when_given(case: str) -> None:
    change, fragment = HEADS_THAT_DO_NOT_FIT[case]
    target = decoder().target
    with pytest.raises(ValueError) as info:
        SpeculativeDecoder(target, compile=False, head=change(random_head(target, seed=3)))
    one_line(info, f"head {fragment}")


@pytest.mark.parametrize("case", ["int", *HEADS_THAT_DO_NOT_FIT])
def test_a_loaded_head_is_checked_before_the_first_round(case: str) -> None:
    target = decoder().target
    if case == "int":  # head=lambda: 5
        loaded, error, fragment = 5, TypeError, "must be a FeatureHead, got int"
    else:
        change, fragment = HEADS_THAT_DO_NOT_FIT[case]
        loaded, error = change(random_head(target, seed=3)), ValueError
    lazy = SpeculativeDecoder(target, compile=False, head=lambda: loaded)
    spec = SpeculativeConfig(2, proposer="feature_head")
    with pytest.raises(error) as info:
        lazy.generate([[256, 97]], [SamplingParams(max_new_tokens=2)], spec)
    one_line(info, f"head (as its function loaded it) {fragment}")
    assert not lazy.rounds  # refused before any round was built


def test_a_head_named_for_another_target_is_read_not_dropped(tmp_path: Path) -> None:
    """The shipped head's path, named, is the head to read, whatever the target; only the
    default (None) leaves the shipped head to the shipped target."""
    paths = [tmp_path / f"{name}.safetensors" for name in ("target", "draft")]
    for path, model in zip(paths, (decoder().target, decoder().draft)):
        save_checkpoint(path, model)
    assert load_decoder(*paths, compile=False).load_head is None
    named = load_decoder(*paths, compile=False, head=DEFAULT_HEAD)
    with pytest.raises(ValueError) as info:  # read on first use: the shipped target's width
        named.generate(
            [[256, 97]],
            [SamplingParams(max_new_tokens=2)],
            SpeculativeConfig(2, proposer="feature_head"),
        )
    one_line(info, "width 384")
