"""The emitted tokens follow the target distribution exactly: frequency tests over many (p, q)
cases, with probabilistic and one-hot drafts, through the default (compiled) sampler.

Every row of a batch is one independent round with K = 3 drafts. A case fixes p_1..p_4 (target)
and q_1..q_3 (draft) per position. For each case and position j, the tokens emitted at j (in the
rows that reach j) must follow p_j, and the number of accepted drafts n must follow the law
P(n = i) = a_1 ... a_i (1 - a_{i+1}), P(n = K) = a_1 ... a_K, with a_j = sum(min(p_j, q_j)) for
a probabilistic draft and p_j(x_j) for a one-hot draft x_j. All cells of one test together have
a false-alarm rate <= 1e-6 (tests/_stats.py).
"""

from dataclasses import dataclass, field

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sampling
from tests._stats import LARGE, SMALL, FrequencyCheck, as_logits, constrained_probs

K = SMALL["drafts"]
V = SMALL["vocab"]
CHUNK = SMALL["rows"]
DRAWS = 200_000
SEED_DRAWS = 2_000_000
SEED_P = [0.50, 0.25, 0.15, 0.07, 0.03]
SEED_Q = [0.30, 0.40, 0.10, 0.15, 0.05]


@dataclass
class Case:
    name: str
    p: list  # K + 1 raw target distributions (before temperature/top-k/top-p)
    q: list  # K draft distributions
    draws: int = DRAWS
    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    stop: str | None = None  # a name in STOPS: rows propose fewer than K drafts
    target: list = field(init=False)  # the constrained p the output must follow

    def __post_init__(self):
        pad = lambda d: np.pad(np.asarray(d, dtype=np.float64), (0, V - len(d)))  # noqa: E731
        self.p = [pad(d) for d in self.p]
        self.q = [pad(d) for d in self.q]
        self.target = [
            constrained_probs(p, self.temperature, self.top_k, self.top_p) for p in self.p
        ]

    @property
    def filtered(self) -> bool:
        return self.top_k > 0 or self.top_p < 1


def _random(rng, size, zeros=0):
    d = rng.dirichlet(np.ones(size))
    d[rng.choice(size, zeros, replace=False)] = 0
    return d / d.sum()


def _cases() -> list[Case]:
    rng = np.random.default_rng(2211_17192)
    same = lambda d: [d] * K  # noqa: E731
    p8, q8 = _random(rng, 8), _random(rng, 8)
    sparse_p, sparse_q = _random(rng, 10, zeros=4), _random(rng, 10, zeros=4)
    raw = _random(rng, 9)
    return [
        Case("seed example", [SEED_P] * (K + 1), same(SEED_Q), draws=SEED_DRAWS),
        Case("random pair", [p8] * (K + 1), same(q8)),
        Case("random sparse pair", [sparse_p] * (K + 1), same(sparse_q)),
        Case("identical", [p8] * (K + 1), same(p8)),
        Case("disjoint supports", [[0.5, 0.3, 0.2]] * (K + 1), same([0, 0, 0, 0.6, 0.4])),
        Case("zeros in p", [[0.6, 0.4]] * (K + 1), same([0.25, 0.25, 0.25, 0.25])),
        Case("zeros in q", [[0.2, 0.2, 0.3, 0.3]] * (K + 1), same([0.5, 0.5])),
        Case("one-hot q", [p8] * (K + 1), same([0, 0, 1.0])),
        Case("one-hot q where p is 0", [[0.5, 0.5]] * (K + 1), same([0, 0, 0, 0, 0, 1.0])),
        Case("one-hot p", [[0, 1.0]] * (K + 1), same(q8)),
        Case("temperature 2", [raw] * (K + 1), same(q8), temperature=2.0),
        Case(
            "chain of different pairs",
            [_random(rng, 12) for _ in range(K + 1)],
            [_random(rng, 12, zeros=2) for _ in range(K)],
        ),
        Case("top-k 3", [raw] * (K + 1), same(q8), top_k=3),
        Case("top-p 0.6", [raw] * (K + 1), same(q8), top_p=0.6),
        Case(
            "T 0.7, top-k 5, top-p 0.8",
            [raw] * (K + 1),
            same(p8),
            temperature=0.7,
            top_k=5,
            top_p=0.8,
        ),
    ]


CASES = _cases()

# Draft-dependent early stops, each as (prefix -> stop drafting here?, the same rule on a batch of
# drafts [N, K] -> num_draft_tokens [N]). They depend on the drafts only, never on the
# verification's noise, as exactness requires.
STOPS = {
    "after a 0": (
        lambda prefix: bool(prefix) and prefix[-1] == 0,
        lambda drafts: torch.where((drafts == 0).any(-1), (drafts == 0).long().argmax(-1) + 1, K),
    ),
    "two drafts": (
        lambda prefix: len(prefix) == 2,
        lambda drafts: torch.full_like(drafts[:, 0], 2),
    ),
    "no drafts": (lambda prefix: True, lambda drafts: torch.zeros_like(drafts[:, 0])),
}


@dataclass
class Tally:
    counts: np.ndarray  # [cases, K + 1, V]: emitted token counts per position
    accepted: np.ndarray  # [cases, K + 1]: counts of n = 0..K


def _run(cases: list[Case], one_hot: bool, method: str = "standard") -> Tally:
    """Run every case's draws through sampling.rejection_sample in CHUNK-row calls (one shape,
    so one compiled graph per variant: filters on or off, method, short proposals or not) and
    tally the output."""
    gen = torch.Generator().manual_seed(7 + one_hot)
    case_of_row = torch.cat([torch.full((c.draws,), i) for i, c in enumerate(cases)])
    logits = torch.stack([torch.stack([as_logits(p) for p in c.p]) for c in cases])
    q = torch.tensor(np.stack([np.stack(c.q) for c in cases]), dtype=torch.float32)
    q_cdf = q.double().cumsum(-1)
    q_cdf /= q_cdf[..., -1:].clone()  # so that u < 1 never lands past the support
    # A one-hot draft (a greedy drafter: the argmax of q) goes in as a dense one-hot q, so both
    # draft kinds share a compiled graph; test_sampling_compiled shows that draft_probs=None
    # gives identical output.
    greedy_drafts = q.argmax(-1)
    one_hot_q = F.one_hot(greedy_drafts, V).float()
    params = {
        name: torch.tensor([getattr(c, name) for c in cases], dtype=dtype)
        for name, dtype in [
            ("temperature", torch.float32),
            ("top_k", torch.int64),
            ("top_p", torch.float64),
        ]
    }
    filters = (
        {}
        if not any(c.filtered for c in cases)
        else {"top_k": params["top_k"], "top_p": params["top_p"]}
    )
    counts = torch.zeros(len(cases), K + 1, V, dtype=torch.int64)
    accepted = torch.zeros(len(cases), K + 1, dtype=torch.int64)
    for start in range(0, len(case_of_row), CHUNK):
        case = case_of_row[start : start + CHUNK]
        valid = len(case)
        case = torch.cat([case, case[:1].expand(CHUNK - valid)])  # pad the last chunk
        if one_hot:
            drafts, draft_probs = greedy_drafts[case], one_hot_q[case]
        else:  # x_j ~ q_j by inverse CDF
            u = torch.rand(CHUNK, K, 1, dtype=torch.float64, generator=gen)
            drafts, draft_probs = (u >= q_cdf[case]).sum(-1), q[case]
        short = {}
        if any(c.stop for c in cases):  # past its last draft a row holds the placeholder id
            num_drafts = torch.full_like(case, K)
            for i, c in enumerate(cases):
                if c.stop:
                    num_drafts[case == i] = STOPS[c.stop][1](drafts[case == i])
            drafts = drafts.masked_fill(
                torch.arange(K) >= num_drafts[:, None], sampling.PLACEHOLDER_TOKEN_ID
            )
            short = dict(num_draft_tokens=num_drafts)
        out = sampling.rejection_sample(
            logits[case],
            drafts,
            draft_probs,
            temperature=params["temperature"][case],
            **{name: value[case] for name, value in filters.items()},
            uniforms=torch.rand(CHUNK, K, dtype=torch.float64, generator=gen),
            exponentials=torch.empty(CHUNK, V).exponential_(generator=gen),
            method=method,
            **short,
        )
        case, tokens, n = case[:valid], out.token_ids[:valid], out.num_accepted[:valid]
        emitted = tokens >= 0
        cell = (case[:, None] * (K + 1) + torch.arange(K + 1)) * V + tokens
        counts += torch.bincount(cell[emitted], minlength=counts.numel()).view_as(counts)
        accepted += torch.bincount(case * (K + 1) + n, minlength=accepted.numel()).view_as(accepted)
    return Tally(counts.numpy(), accepted.numpy())


def _acceptance(case: Case, one_hot: bool) -> list[float]:
    if one_hot:
        return [p[np.argmax(q)] for p, q in zip(case.target, case.q)]
    return [np.minimum(p, q).sum() for p, q in zip(case.target, case.q)]


def _length_law(alphas: list[float]) -> np.ndarray:
    law, reach = [], 1.0
    for a in alphas:
        law.append(reach * (1 - a))
        reach *= a
    return np.array(law + [reach])


def _check(cases: list[Case], tally: Tally, one_hot: bool) -> FrequencyCheck:
    check = FrequencyCheck()
    for i, case in enumerate(cases):
        for j in range(K + 1):
            if tally.counts[i, j].sum():
                check.add(f"{case.name}, position {j}", tally.counts[i, j], case.target[j])
        check.add(
            f"{case.name}, accepted-length law",
            tally.accepted[i],
            _length_law(_acceptance(case, one_hot)),
        )
    return check


@pytest.fixture(scope="module", params=[False, True], ids=["probabilistic", "one-hot"])
def tallies(request):
    """Both batches, the unfiltered cases and the filtered ones (a graph each), per draft kind."""
    one_hot = request.param
    plain = [c for c in CASES if not c.filtered]
    filtered = [c for c in CASES if c.filtered]
    return one_hot, [(plain, _run(plain, one_hot)), (filtered, _run(filtered, one_hot))]


def test_output_follows_target_and_length_law(tallies):
    """15 cases x 4 positions x 19 tokens + the law of n; false-alarm rate <= 1e-6 in all."""
    one_hot, batches = tallies
    check = FrequencyCheck()
    for cases, tally in batches:
        check.groups += _check(cases, tally, one_hot).groups
    assert len(check.groups) > 60
    assert check.failures() == []


def test_seed_example(tallies):
    """Acceptance 0.75 (probabilistic) / 0.25 (one-hot argmax draft) and L1 < 0.005 over 2M.

    Rates: the acceptance tolerance is wider than its Bernstein radius at 1e-7 (0.0018).
    L1 = 2 max over the 2^5 token subsets S of (freq(S) - p(S)); one-sided Bernstein at
    9e-7 / 32 per subset bounds it by 0.0042 < 0.005 at N = 2M. In all, <= 1e-6.
    """
    one_hot, batches = tallies
    cases, tally = batches[0]
    seed = [c.name for c in cases].index("seed example")
    counts, n_law = tally.counts[seed, 0, :5], tally.accepted[seed]
    assert counts.sum() == SEED_DRAWS
    freq = counts / SEED_DRAWS
    assert np.abs(freq - SEED_P).sum() < 0.005
    accept_rate = 1 - n_law[0] / SEED_DRAWS  # the first draft accepted
    expected = 0.25 if one_hot else 0.75
    assert abs(accept_rate - expected) < 0.0025  # radius at 1e-7: 0.0017 (0.75), 0.0017 (0.25)


def test_naive_resampling_is_biased_and_fails_the_test():
    """Power: the naive rule (resample from p after a rejection) gives token 0 about 0.425 and
    L1 about 0.175 on the seed example, exactly its predicted law min(p, q) + (1 - a) p, and so
    fails the frequency test the exact rule passes. False-alarm rate of the law check <= 1e-6;
    the two tolerances below are wider than the Bernstein radii at 1e-7 (0.0018 and 0.0042)."""
    seed = CASES[0]
    tally = _run([seed], one_hot=False, method="naive")
    counts = tally.counts[0, 0, :5]
    freq = counts / counts.sum()
    p, q = np.array(SEED_P), np.array(SEED_Q)
    naive_law = np.minimum(p, q) + (1 - np.minimum(p, q).sum()) * p
    assert abs(naive_law[0] - 0.425) < 1e-12
    assert abs(freq[0] - 0.425) < 0.0025
    assert abs(np.abs(freq - p).sum() - 0.175) < 0.005
    law_check = FrequencyCheck()
    law_check.add("naive, position 0", counts, naive_law)
    assert law_check.failures() == []
    # The same check that the exact rule passes (test_output_follows_target_and_length_law):
    assert _check([seed], tally, one_hot=False).failures() != []


def test_large_vocabulary():
    """V = 32000, K = 1: 200k emitted tokens, 100k with a probabilistic draft and 100k with a
    one-hot draft, follow p cell by cell (32000 cells at each of the 2 positions); false-alarm
    rate <= 1e-6 over all cells. Each draw at this size costs three passes over 32000 logits,
    so the 200k are split between the kinds to keep the test under a minute on two cores.

    p puts 0.85 on one token and spreads the rest Zipf-like over 999 tokens scattered across the
    vocabulary (the first and last ids included); q mixes p with noise on 1000 other tokens.
    Outside both supports every race weight is 0, so the noise there cannot matter (the guard
    is tested in test_sampling_edge_cases): it is set to 1, and only the supports get fresh
    Exp(1) noise. The one-hot draft is passed as a dense one-hot q so both kinds share one
    compiled graph; test_sampling_compiled shows draft_probs=None gives identical output.
    """
    vocab, rows = LARGE["vocab"], LARGE["rows"]
    rng = np.random.default_rng(32000)
    tokens = rng.permutation(vocab)[:2000]
    tokens[:2] = [0, vocab - 1]
    p_support, q_only = tokens[:1000], tokens[1000:]
    p = np.zeros(vocab)
    p[p_support[1:]] = 0.15 * _zipf(999)
    p[p_support[0]] = 0.85
    q = 0.85 * p
    q[q_only] = 0.15 * rng.dirichlet(np.ones(1000))
    one_hot = np.zeros(vocab)
    one_hot[p_support[0]] = 1.0  # a greedy drafter's choice: the target's mode
    kinds = {"probabilistic": q, "one-hot": one_hot}
    noisy = torch.as_tensor(np.sort(tokens))
    logits = as_logits(p).expand(rows, 2, vocab).contiguous()
    gen = torch.Generator().manual_seed(5)
    noise = torch.ones(rows, vocab)
    check = FrequencyCheck()  # all cells of both kinds share the 1e-6 false-alarm budget
    for kind, draft in kinds.items():
        q_rows = torch.tensor(draft, dtype=torch.float32).expand(rows, 1, vocab).contiguous()
        q_cdf = torch.tensor(np.cumsum(draft) / draft.sum())
        counts = np.zeros((2, vocab), dtype=np.int64)
        while counts.sum() < 100_000:
            u = torch.rand(rows, 1, dtype=torch.float64, generator=gen)
            drafts = torch.searchsorted(q_cdf, u, right=True)
            noise[:, noisy] = torch.empty(rows, len(noisy)).exponential_(generator=gen)
            out = sampling.rejection_sample(
                logits,
                drafts,
                q_rows,
                exponentials=noise,
                uniforms=torch.rand(rows, 1, dtype=torch.float64, generator=gen),
            )
            for j in range(2):
                emitted = out.token_ids[:, j][out.token_ids[:, j] >= 0]
                counts[j] += np.bincount(emitted.numpy(), minlength=vocab)
        check.add(f"{kind}, position 0", counts[0], p)
        check.add(f"{kind}, position 1 (bonus or corrective)", counts[1], p)
    assert check.failures() == []


def _zipf(size: int) -> np.ndarray:
    weights = 1.0 / np.arange(1, size + 1) ** 1.1
    return weights / weights.sum()
