"""The API refuses, in one TypeError or ValueError naming the argument, what it would otherwise
ignore, truncate or fail on deep inside: sampling arguments beside `params`, float token ids,
something that is not a tokenizer, a device this machine lacks, a path that is not one, a
decoder built from a string, and a misspelt "auto"."""

from __future__ import annotations

from functools import cache

import pytest
from _enumerate import random_gpt

import minispec
from minispec.api import load_decoder
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
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
