"""Helpers for the decode-loop tests: tiny random models, the target's exact law over whole
generated sequences (by enumeration), and (from sampling.exact_law) a chi-square goodness-of-fit
p-value.

The law is defined with sampling.constraints' own functions (filtered_logits after
normalize_params), so "the target distribution under temperature -> top-k -> top-p" means the
same thing here as in the sampler; what is independent of the loop is everything else: no KV
cache, no drafts, no batching, no rejection rule - one full causal forward per prefix.
"""

from __future__ import annotations

import copy
from collections import Counter
from collections.abc import Sequence

import pytest
import torch

from model.gpt import GPT, GPTConfig
from model.head import FeatureHead, HeadConfig
from sampling.constraints import filtered_logits, normalize_params
from sampling.exact_law import chi_square, chi_square_sf  # noqa: F401 (the tests import them here)


@pytest.fixture
def one_thread():
    """Run a test with one intra-op thread. These models are tiny: a second thread buys little,
    and on a shared 2-core machine its spin-waiting made the tests several times slower."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def random_gpt(
    vocab_size: int,
    seed: int,
    scale: float = 1.0,
    dtype: torch.dtype = torch.float32,
    max_seq_len: int = 16,
    d_model: int = 16,
    n_layer: int = 1,
    cls: type[GPT] = GPT,
) -> GPT:
    """A tiny GPT with weights ~ N(0, scale^2 / fan_in): logits have a standard deviation of
    about `scale`, so scale 1.5 already gives the peaky conditionals that make a biased sampler
    visible (the training init, std 0.02, gives near-uniform ones under which almost any rule
    looks right)."""
    config = GPTConfig(
        vocab_size=vocab_size,
        n_layer=n_layer,
        n_head=2,
        d_model=d_model,
        mlp_hidden=2 * d_model,
        max_seq_len=max_seq_len,
    )
    model = cls(config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, scale * p.shape[-1] ** -0.5, generator=generator)
    return model.to(dtype).eval()


def random_head(target: GPT, seed: int, scale: float = 1.0) -> FeatureHead:
    """A feature head for `target` with random weights ~ N(0, scale^2 / fan_in), in its dtype."""
    c = target.config
    config = HeadConfig(c.d_model, c.d_model, c.n_head, 2 * c.d_model, c.max_seq_len)
    head = FeatureHead(config, c.vocab_size)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in head.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, scale * p.shape[-1] ** -0.5, generator=generator)
    return head.to(target.embed.weight.dtype).eval()


def perturbed_copy(model: GPT, seed: int, mix: float) -> GPT:
    """A draft that resembles the target: each weight matrix becomes sqrt(1 - mix^2) W + mix N,
    N Gaussian with W's spread. mix 0 is the target itself; on these tiny models mix 0.15 gives
    alpha ~ 0.6-0.75, so rounds see both rejections and full acceptance."""
    draft = copy.deepcopy(model)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in draft.parameters():
            if p.dim() >= 2:
                noise = torch.randn(p.shape, generator=generator, dtype=p.dtype) * p.std()
                p.mul_((1 - mix**2) ** 0.5).add_(mix * noise)
    return draft


@torch.no_grad()
def full_logits(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """Cache-free logits [N, T, V] for whole sequences [N, T], on a copy so that the caller's
    model (and the decoder that owns its cache) is left as it was."""
    fresh = copy.deepcopy(model)
    fresh.drop_cache()
    return fresh(tokens)


def target_probs(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """p [N, V] in float64 for logits [N, V]: one-hot at the first argmax when temperature is
    0, else the softmax of sampling.constraints.filtered_logits."""
    n = logits.shape[0]
    filtered = filtered_logits(
        logits, normalize_params(temperature, top_k, top_p, n, logits.device)
    )
    if temperature == 0:
        return torch.nn.functional.one_hot(filtered.argmax(-1), logits.shape[-1]).double()
    return filtered.double().softmax(-1)


@torch.no_grad()
def sequence_law(
    model: GPT,
    prompt: list[int],
    new_tokens: int,
    temperature: float = 1.0,
    top_k: int = 0,
    top_p: float = 1.0,
) -> dict[tuple[int, ...], float]:
    """P(x_1..x_n | prompt) = prod_i p(x_i | prompt, x_<i) for every continuation of length n
    with nonzero probability (the vocabulary must not contain EOS, so every row runs n tokens).
    One batched full forward per depth over all live prefixes: at V = 8, n = 4 that is at most
    4096 rows."""
    prefixes = torch.tensor([prompt])
    probs = torch.ones(1, dtype=torch.float64)
    for _ in range(new_tokens):
        p = target_probs(full_logits(model, prefixes)[:, -1], temperature, top_k, top_p)
        joint = probs[:, None] * p  # [N, V]
        rows, tokens = joint.nonzero(as_tuple=True)
        prefixes = torch.cat([prefixes[rows], tokens[:, None]], 1)
        probs = joint[rows, tokens]
    assert abs(float(probs.sum()) - 1) < 1e-9
    return {tuple(seq[len(prompt) :]): prob for seq, prob in zip(prefixes.tolist(), probs.tolist())}


def law_fit(
    sequences: Sequence[Sequence[int]],
    group_of: Sequence[int],
    laws: Sequence[dict[tuple[int, ...], float]],
) -> tuple[float, float, int]:
    """(p-value, chi-square, degrees of freedom) of generated sequences against their groups'
    exact laws: sequence i belongs to group group_of[i], whose law is laws[group_of[i]]. The
    groups are independent samples, so their statistics and degrees of freedom add."""
    stat, df = 0.0, 0
    for g, law in enumerate(laws):
        counts = Counter(tuple(s) for s, h in zip(sequences, group_of) if h == g)
        s, d = chi_square(counts, law)
        stat, df = stat + s, df + d
    return chi_square_sf(stat, df), stat, df
