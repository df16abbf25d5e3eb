"""Argument validation of the Python API: each bad argument is one TypeError (wrong type) or
ValueError (wrong value) that names it, and everything else decodes.

- A table of the misuses users hit (issue 13, section 3), each with its exception and name.
- A property-based fuzz (hypothesis, derandomized: the same examples every run) of every
  argument of `minispec.generate`, `SamplingParams`, `SpeculativeConfig` and
  `sampling.rejection_sample`: random values, valid or of any type, for up to two arguments at
  once. Each call must raise a one-line TypeError/ValueError naming an argument, or return a
  valid result (ids in range, lengths within budget, no NaN figure): any other exception fails.
  The fuzz can fail: a probe with the old checks (bool accepted as an int, a str temperature
  compared with 0) ends in AttributeError or a comparison's TypeError that names nothing.
"""

from __future__ import annotations

import math
import os
from functools import cache

import pytest
import torch
from _enumerate import one_thread, random_gpt  # noqa: F401 (one_thread: a fixture)
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import minispec
from minispec.decode import SpeculativeDecoder
from minispec.params import (
    DRAFT_SAMPLE_METHODS,
    MAX_SPECULATIVE_TOKENS,
    SamplingParams,
    SpeculativeConfig,
    row_constraints,
)
from model import tokenizer
from sampling import PLACEHOLDER_TOKEN_ID, REJECTION_SAMPLE_METHODS, rejection_sample

pytestmark = pytest.mark.usefixtures("one_thread")

# FUZZ_EXAMPLES=5000 fuzzes harder (still derandomized); 120 keeps the file under a minute.
FUZZ = settings(
    derandomize=True,
    deadline=None,
    max_examples=int(os.environ.get("FUZZ_EXAMPLES", 120)),
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)
CONTEXT = 64


@cache
def decoder() -> SpeculativeDecoder:
    """A tiny random byte-vocabulary pair, eager: each fuzzed generate() costs milliseconds."""
    target = random_gpt(tokenizer.VOCAB_SIZE, seed=0, max_seq_len=CONTEXT)
    draft = random_gpt(tokenizer.VOCAB_SIZE, seed=1, max_seq_len=CONTEXT)
    return SpeculativeDecoder(target, draft, compile=False)


def expect_clear_error(exc: Exception, names: list[str]) -> None:
    """A TypeError/ValueError of one line that names one of `names`."""
    assert isinstance(exc, (TypeError, ValueError)), f"{type(exc).__name__}: {exc}"
    message = str(exc)
    assert "\n" not in message, message
    assert any(name in message for name in names), message


# ---- the table of misuses ----------------------------------------------------------------------

MISUSES = [
    (dict(prompts=[123]), TypeError, "prompts[0]"),
    (dict(prompts=[b"x"]), TypeError, "prompts[0]"),
    (dict(prompts="hello"), TypeError, "prompts"),
    (dict(prompts=[]), ValueError, "prompts is empty"),
    (dict(prompts=["ok", ""]), ValueError, "prompts[1] is empty"),
    (dict(prompts=["\ud800"]), ValueError, "prompts[0]"),
    (dict(params=[{}]), TypeError, "params[0]"),
    (dict(params=[None]), TypeError, "params[0]"),
    (dict(params=SamplingParams()), TypeError, "params"),
    (dict(params=[SamplingParams()] * 2), ValueError, "params"),
    (dict(decoder="x"), TypeError, "decoder"),
    (dict(on_tokens="x"), TypeError, "on_tokens"),
    (dict(temperature="0.5"), TypeError, "temperature"),
    (dict(temperature=float("nan")), ValueError, "temperature"),
    (dict(temperature=float("inf")), ValueError, "temperature"),
    (dict(seed="1"), TypeError, "seed"),
    (dict(seed=1.0), TypeError, "seed"),
    (dict(seed=2**32 - 1, prompts=["a", "b"]), ValueError, "seed"),
    (dict(top_k=True), TypeError, "top_k"),
    (dict(top_k=2**64), ValueError, "top_k"),
    (dict(top_p=None), TypeError, "top_p"),
    (dict(max_new_tokens=True), TypeError, "max_new_tokens"),
    (dict(max_new_tokens=0), ValueError, "max_new_tokens"),
    (dict(num_speculative_tokens=True), TypeError, "num_speculative_tokens"),
    (dict(num_speculative_tokens=2.0), TypeError, "num_speculative_tokens"),
    (dict(draft_sample_method=None), TypeError, "draft_sample_method"),
    (dict(rejection_sample_method="exact"), ValueError, "rejection_sample_method"),
]


@pytest.mark.parametrize("kwargs,error,name", MISUSES)
def test_each_misuse_is_one_error_naming_the_argument(kwargs: dict, error: type, name: str) -> None:
    kwargs = {"prompts": ["hi"], "decoder": decoder(), "max_new_tokens": 2, **kwargs}
    with pytest.raises(error) as info:
        minispec.generate(kwargs.pop("prompts"), **kwargs)
    expect_clear_error(info.value, [name])


# SpeculativeDecoder.generate(prompts, params, spec): each argument of the wrong type, and each
# SpeculativeConfig field that is not what it holds, is a TypeError naming it (issue 54: some
# were AttributeErrors from deep inside).
PROMPT, PARAMS = [[tokenizer.BOS_TOKEN_ID, 97]], [SamplingParams(max_new_tokens=2)]
DECODER_MISUSES = [
    ((PROMPT, PARAMS, "x"), "spec"),
    ((PROMPT, PARAMS, None), "spec"),
    ((PROMPT, "x", SpeculativeConfig(2)), "params"),
    ((PROMPT, [None], SpeculativeConfig(2)), "params[0]"),
    ((None, PARAMS, SpeculativeConfig(2)), "prompts"),
    (("ab", PARAMS, SpeculativeConfig(2)), "prompts"),
    ((["ab"], PARAMS, SpeculativeConfig(2)), "prompts[0]"),
    ((PROMPT, PARAMS, SpeculativeConfig(adaptive="x")), "adaptive"),
    ((PROMPT, PARAMS, SpeculativeConfig(2, adaptive=None)), "adaptive"),
    ((PROMPT, PARAMS, SpeculativeConfig(2, tree_branching=2)), "tree_branching"),
    ((PROMPT, PARAMS, SpeculativeConfig(2, tree_branching="2")), "tree_branching"),
    ((PROMPT, PARAMS, SpeculativeConfig(2, proposer="tree", tree_branching=[2])), "tree_branching"),
    (
        (PROMPT, PARAMS, SpeculativeConfig(2, proposer="tree", tree_branching=(2.0,))),
        "tree_branching",
    ),
]


@pytest.mark.parametrize("args,name", DECODER_MISUSES)
def test_each_decoder_misuse_is_a_type_error_naming_the_argument(args: tuple, name: str) -> None:
    with pytest.raises(TypeError) as info:
        decoder().generate(*args)
    expect_clear_error(info.value, [name])


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(proposer="tree", num_speculative_tokens=4, tree_branching=(2**70,)),
        dict(temperature=-1),
        dict(num_speculative_tokens=17),
    ],
)
def test_bad_values_are_refused_before_the_shipped_pair_is_loaded(
    monkeypatch: pytest.MonkeyPatch, kwargs: dict
) -> None:
    def load_decoder() -> None:
        raise AssertionError("the shipped pair was loaded before the arguments were checked")

    monkeypatch.setattr("minispec.api.load_decoder", load_decoder)
    with pytest.raises(ValueError) as info:
        minispec.generate(["hi"], **kwargs)
    expect_clear_error(info.value, list(kwargs))


def test_numpy_and_other_number_types_are_accepted() -> None:
    np = pytest.importorskip("numpy")
    out = minispec.generate(
        ["hi"],
        decoder=decoder(),
        temperature=np.float32(0.5),
        top_k=np.int64(5),
        seed=np.int64(3),
        max_new_tokens=np.int64(2),
        num_speculative_tokens=np.int64(1),
    )
    assert 1 <= len(out.token_ids[0]) <= 2


# ---- the fuzz ---------------------------------------------------------------------------------

JUNK = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(-(2**70), 2**70),
    st.floats(),
    st.text(max_size=3),
    st.binary(max_size=3),
    st.just("\ud800"),
    st.just(object()),
    st.lists(st.integers(-3, 300), max_size=3),
    st.dictionaries(st.text(max_size=2), st.integers(), max_size=1),
    st.just(SamplingParams()),
    st.builds(torch.zeros, st.integers(0, 3)),
)
TEMPERATURES = st.one_of(st.floats(0, 4), st.sampled_from([0, 0.0, 1e-39, 1e30, 2]))
SAMPLING = {
    "temperature": TEMPERATURES,
    "top_k": st.integers(0, 300),
    "top_p": st.one_of(st.floats(0, 1, exclude_min=True), st.just(1e-12)),
    "seed": st.one_of(st.none(), st.integers(0, 2**32 - 4)),
    "max_new_tokens": st.integers(1, 4),
}
SPECULATIVE = {
    "num_speculative_tokens": st.integers(0, 4),  # the range's end: test_fuzz_speculative_config
    "draft_sample_method": st.sampled_from(DRAFT_SAMPLE_METHODS),
    "rejection_sample_method": st.sampled_from(REJECTION_SAMPLE_METHODS),
}


def draw_arguments(draw: st.DrawFn, valid: dict[str, st.SearchStrategy]) -> dict:
    """A valid value for each argument, then junk for up to two of them."""
    values = {name: draw(strategy) for name, strategy in valid.items()}
    bad = draw(st.lists(st.sampled_from(sorted(valid)), max_size=2, unique=True))
    values.update({name: draw(JUNK) for name in bad})
    return values


def no_nan(value) -> bool:
    if isinstance(value, float):
        return not math.isnan(value)
    if isinstance(value, dict):
        return all(map(no_nan, value.values()))
    if isinstance(value, (list, tuple)):
        return all(map(no_nan, value))
    return True


@FUZZ
@given(st.data())
def test_fuzz_generate(data: st.DataObject) -> None:
    prompts = st.lists(st.text(min_size=1, max_size=6), min_size=1, max_size=3)
    with_params = data.draw(st.booleans(), label="with params")
    valid = {
        "prompts": prompts,
        **SAMPLING,
        **SPECULATIVE,
        "on_tokens": st.sampled_from([None, "collect"]),
        "decoder": st.just(decoder()),
    }
    if with_params:
        params = st.builds(SamplingParams, **SAMPLING)
        valid["params"] = st.lists(params, min_size=1, max_size=3)
    kwargs = draw_arguments(data.draw, valid)
    if kwargs["decoder"] is None:  # the default: the shipped pair, compiled (minutes)
        kwargs["decoder"] = decoder()
    if with_params and isinstance(kwargs["prompts"], list) and isinstance(kwargs["params"], list):
        kwargs["params"] = kwargs["params"][: len(kwargs["prompts"])]  # mostly one per prompt
    streamed: dict[int, list[int]] = {}
    if kwargs["on_tokens"] == "collect":
        kwargs["on_tokens"] = lambda row, ids, origins: streamed.setdefault(row, []).extend(ids)
    prompts = kwargs.pop("prompts")
    try:
        out = minispec.generate(prompts, **kwargs)
    except Exception as exc:  # noqa: BLE001 - the property is about which exceptions
        expect_clear_error(exc, [*valid, "prompt", "context"])
        return
    params = kwargs.get("params") or [
        SamplingParams(max_new_tokens=kwargs["max_new_tokens"]) for _ in prompts
    ]
    assert len(out.texts) == len(out.token_ids) == len(prompts)
    for i, ids in enumerate(out.token_ids):
        assert 1 <= len(ids) <= params[i].max_new_tokens
        assert all(0 <= t < tokenizer.VOCAB_SIZE for t in ids)
        assert out.texts[i] == tokenizer.decode(ids)
        if streamed:
            assert streamed[i] == ids
    assert no_nan(out.stats.to_dict())


@FUZZ
@given(st.data())
def test_fuzz_sampling_params(data: st.DataObject) -> None:
    params = SamplingParams(**draw_arguments(data.draw, SAMPLING))
    try:
        params.validate()
    except Exception as exc:  # noqa: BLE001
        expect_clear_error(exc, list(SAMPLING))
        return
    assert not any(isinstance(getattr(params, name), bool) for name in SAMPLING)  # no counts
    rows = row_constraints([params, SamplingParams()], torch.device("cpu"))
    assert torch.isfinite(rows.temperature).all() and (rows.temperature >= 0).all()


@FUZZ
@given(st.data())
def test_fuzz_speculative_config(data: st.DataObject) -> None:
    spec = SpeculativeConfig(**draw_arguments(data.draw, SPECULATIVE))
    try:
        spec.validate()
    except Exception as exc:  # noqa: BLE001
        expect_clear_error(exc, list(SPECULATIVE))
        return
    k = spec.num_speculative_tokens
    assert not isinstance(k, bool) and 0 <= k <= MAX_SPECULATIVE_TOKENS


@st.composite
def sampler_arguments(draw: st.DrawFn) -> dict:
    """rejection_sample's arguments for a random [B, K, V], valid or with junk in up to two.
    Randomness includes the documented edge values: u = 0 or 1, Exp noise 0 or inf."""
    b, k, v = draw(st.integers(1, 3)), draw(st.integers(1, 3)), draw(st.integers(2, 6))
    seed = draw(st.integers(0, 2**16))
    g = torch.Generator().manual_seed(seed)
    edge = lambda shape, values, dtype: torch.tensor(values, dtype=dtype)[  # noqa: E731
        torch.randint(len(values), shape, generator=g)
    ]
    per_row = lambda scalar, tensor: st.one_of(scalar, st.just(tensor))  # noqa: E731
    valid = {
        "target_logits": st.sampled_from(
            [
                torch.randn(b, k + 1, v, generator=g) * 3,
                torch.randn(b, k + 1, v, generator=g).double(),
            ]
        ),
        "draft_token_ids": st.just(torch.randint(v, (b, k), generator=g)),
        "draft_probs": st.sampled_from(
            [None, torch.softmax(torch.randn(b, k, v, generator=g) * 3, -1)]
        ),
        "temperature": per_row(TEMPERATURES, torch.rand(b, generator=g) * 2),
        "top_k": per_row(
            st.one_of(st.none(), st.integers(0, 8)), torch.randint(v + 1, (b,), generator=g)
        ),
        "top_p": per_row(
            st.one_of(st.none(), st.floats(0, 1, exclude_min=True)),
            torch.rand(b, generator=g, dtype=torch.float64).clamp(min=0.05),
        ),
        "uniforms": st.sampled_from(
            [
                None,
                torch.rand(b, k, generator=g, dtype=torch.float64),
                edge((b, k), [0.0, 1.0, 0.5], torch.float64),
            ]
        ),
        "exponentials": st.sampled_from(
            [
                None,
                edge((b, v), [0.0, math.inf, 1.0], torch.float32),
                torch.empty(b, v).exponential_(generator=g),
            ]
        ),
        "generator": st.sampled_from([None, torch.Generator().manual_seed(seed)]),
        "method": st.sampled_from(REJECTION_SAMPLE_METHODS),
        "num_draft_tokens": st.sampled_from([None, torch.randint(k + 1, (b,), generator=g)]),
    }
    return draw_arguments(draw, valid)


@FUZZ
@given(sampler_arguments())
def test_fuzz_rejection_sample(kwargs: dict) -> None:
    """compiled=False: the same tensor code, without a compile per random shape."""
    try:
        out = rejection_sample(**kwargs, compiled=False)
    except Exception as exc:  # noqa: BLE001
        expect_clear_error(exc, list(kwargs))
        return
    b, k = kwargs["draft_token_ids"].shape
    v = kwargs["target_logits"].shape[-1]
    assert out.token_ids.shape == (b, k + 1) and out.token_ids.dtype == torch.int64
    limit = kwargs["num_draft_tokens"] if kwargs["num_draft_tokens"] is not None else k
    assert ((0 <= out.num_accepted) & (out.num_accepted <= limit)).all()
    for row, n in zip(out.token_ids.tolist(), out.num_accepted.tolist()):
        assert all(0 <= t < v for t in row[: n + 1])
        assert all(t == PLACEHOLDER_TOKEN_ID for t in row[n + 1 :])
