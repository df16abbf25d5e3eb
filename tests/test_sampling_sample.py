"""sampling.sample: plain sampling under temperature -> top-k -> top-p. The returned
probabilities are exactly the constrained distribution, and the tokens follow it."""

import numpy as np
import torch

from sampling import sample
from tests._stats import FrequencyCheck, as_logits, constrained_probs

V = 19
DRAWS = 200_000


def test_sample_follows_its_probabilities_with_mixed_rows():
    """Three row kinds in one call (per-row parameters): temperature 0.7 with top-k 5 and top-p
    0.8, temperature 1.3 with both filters off for the row, and greedy. False-alarm rate of
    the frequency check <= 1e-6 over its 2 x 19 cells."""
    rng = np.random.default_rng(5)
    raw = rng.dirichlet(np.ones(12))
    raw = np.pad(raw, (0, V - len(raw)))
    kinds = [(0.7, 5, 0.8), (1.3, 0, 1.0), (0.0, 3, 0.5)]
    rows = len(kinds) * DRAWS
    kind = torch.arange(rows) % len(kinds)
    param = lambda i, dtype: torch.tensor([k[i] for k in kinds], dtype=dtype)[kind]  # noqa: E731
    gen = torch.Generator().manual_seed(6)
    out = sample(
        as_logits(raw).expand(rows, V),
        temperature=param(0, torch.float32),
        top_k=param(1, torch.int64),
        top_p=param(2, torch.float64),
        exponentials=torch.empty(rows, V).exponential_(generator=gen),
    )
    check = FrequencyCheck()
    for i, (temperature, top_k, top_p) in enumerate(kinds[:2]):
        expected = constrained_probs(raw, temperature, top_k, top_p)
        assert np.abs(out.probs[i].double().numpy() - expected).max() < 1e-6
        check.add(f"kind {i}", np.bincount(out.token_ids[kind == i].numpy(), minlength=V), expected)
    assert check.failures() == []
    greedy = kind == 2
    assert (out.token_ids[greedy] == int(np.argmax(raw))).all()
    assert torch.equal(out.probs[2], torch.eye(V)[int(np.argmax(raw))])
    assert out.token_ids.dtype == torch.int64 and out.probs.dtype == torch.float32


def test_sample_without_filters_matches_eager_and_its_law():
    """The unfiltered graph (scalar temperature): tokens follow softmax(logits / T), false-alarm
    rate <= 1e-6; compiled and eager agree bit for bit on tokens, and probs to an ulp."""
    raw = np.pad(np.random.default_rng(8).dirichlet(np.ones(15)), (0, V - 15))
    gen = torch.Generator().manual_seed(9)
    logits = as_logits(raw).expand(DRAWS, V)
    noise = torch.empty(DRAWS, V).exponential_(generator=gen)
    out = sample(logits, temperature=0.8, exponentials=noise)
    eager = sample(logits, temperature=0.8, exponentials=noise, compiled=False)
    assert torch.equal(out.token_ids, eager.token_ids)
    assert torch.allclose(out.probs, eager.probs, rtol=1e-6, atol=1e-9)
    check = FrequencyCheck()
    check.add(
        "T = 0.8", np.bincount(out.token_ids.numpy(), minlength=V), constrained_probs(raw, 0.8)
    )
    assert check.failures() == []


def test_sample_draws_from_generator_when_no_noise_is_given():
    logits = torch.randn(4, V)
    a = sample(logits, generator=torch.Generator().manual_seed(1), compiled=False)
    b = sample(logits, generator=torch.Generator().manual_seed(1), compiled=False)
    assert torch.equal(a.token_ids, b.token_ids)
