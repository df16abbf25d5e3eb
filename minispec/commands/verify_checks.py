"""The five checks of `minispec verify` (verify.py says what each one shows and expects).

Each runs the compiled sampler, or the decode loop, many times and records in a `Verdict`
whether its figures lie within SIGMAS standard deviations of their exact expected values.
"""

from __future__ import annotations

import math
import sys
from collections import Counter
from contextlib import contextmanager
from fractions import Fraction
from functools import lru_cache

import numpy as np
import torch

from minispec.decode import SpeculativeDecoder
from minispec.machine import device_problem
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.stats import expected_tokens_per_round
from model.gpt import GPT, GPTConfig
from sampling import exact_law, rejection_sample
from sampling.tree import tree_rejection_sample, tree_shape

P = np.array([0.50, 0.25, 0.15, 0.07, 0.03])
Q = np.array([0.30, 0.40, 0.10, 0.15, 0.05])
SIGMAS = 6.0
LOOP_VOCAB, LOOP_PROMPT, LOOP_K, LOOP_NEW = 5, (1, 3), 3, 3
LOOP_FALSE_ALARM = 1e-6


@contextmanager
def device_or_exit(name: str):
    """Make `name` the default device for the checks; one line and exit 2 if it is not here."""
    if (problem := device_problem(name)) is not None:
        print(f"minispec verify: --device {name}: {problem}", file=sys.stderr)
        raise SystemExit(2)
    with torch.device(name):
        yield


def generator(seed: int) -> torch.Generator:
    """A seeded generator on the device the checks run on (verify --device: the default)."""
    return torch.Generator(device=torch.get_default_device()).manual_seed(seed)


def _logits(probs: np.ndarray) -> torch.Tensor:
    """float32 logits whose softmax is ``probs`` (a zero becomes -inf)."""
    return torch.tensor(probs, dtype=torch.float64).log().float()


class Verdict:
    """Collects measured-vs-expected figures and whether each is within SIGMAS sigma."""

    def __init__(self) -> None:
        self.failures: list[str] = []

    def check(self, name: str, measured: float, expected: float, sigma: float) -> str:
        ok = abs(measured - expected) <= SIGMAS * sigma + 1e-12
        if not ok:
            self.failures.append(
                f"{name}: measured {measured:.5f}, expected {expected:.5f} +- {SIGMAS * sigma:.5f}"
            )
        return " " if ok else "!"


def worked_example(draws: int, seed: int, verdict: Verdict) -> None:
    gen = generator(seed)
    logits = _logits(P).expand(draws, 2, len(P)).contiguous()
    q = torch.tensor(Q, dtype=torch.float32).expand(draws, 1, len(Q)).contiguous()
    alpha = np.minimum(P, Q).sum()
    naive_law = np.minimum(P, Q) + (1 - alpha) * P
    methods = [  # name, draft ids, draft_probs, method, expected acceptance, expected output
        (
            "probabilistic",
            torch.multinomial(q[:, 0], 1, replacement=True, generator=gen),
            q,
            "standard",
            alpha,
            P,
        ),
        (
            "one-hot argmax",
            torch.full((draws, 1), int(Q.argmax())),
            None,
            "standard",
            P[Q.argmax()],
            P,
        ),
        (
            "naive",
            torch.multinomial(q[:, 0], 1, replacement=True, generator=gen),
            q,
            "naive",
            alpha,
            naive_law,
        ),
    ]
    print(f"1. p = {P.tolist()}, q = {Q.tolist()}; {draws:,} rounds of one draft each\n")
    print(
        f"{'method':<15} {'accept':>7} {'expect':>7}  {'output frequencies':<36} "
        f"{'L1 to p':>7} {'expect':>7}"
    )
    for name, drafts, draft_probs, method, expected_accept, expected_out in methods:
        out = rejection_sample(logits, drafts, draft_probs, generator=gen, method=method)
        accept = out.num_accepted.double().mean().item()
        freq = np.bincount(out.token_ids[:, 0].cpu().numpy(), minlength=len(P)) / draws
        l1, expected_l1 = np.abs(freq - P).sum(), np.abs(expected_out - P).sum()
        cell_sigma = np.sqrt(expected_out * (1 - expected_out) / draws)
        marks = verdict.check(
            f"{name} acceptance",
            accept,
            expected_accept,
            np.sqrt(expected_accept * (1 - expected_accept) / draws),
        )
        marks += "".join(
            verdict.check(f"{name} frequency of token {i}", f, e, s)
            for i, (f, e, s) in enumerate(zip(freq, expected_out, cell_sigma))
        )
        # |L1 - expected L1| <= sum |freq - expected|, so the cells' sigmas bound its error.
        marks += verdict.check(f"{name} L1 to p", l1, expected_l1, cell_sigma.sum())
        print(
            f"{name:<15} {accept:7.4f} {expected_accept:7.4f}  "
            f"{' '.join(f'{f:.4f}' for f in freq):<36} {l1:7.4f} {expected_l1:7.4f}"
            f"{'  <- off' if marks.strip() else ''}"
        )
    print(f"\nnaive's token 0: {naive_law[0]:.3f} expected (min(p, q) + (1 - alpha) p)")


def pair_with_acceptance(alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """p and q over 4 tokens with sum min(p, q) = alpha: they share alpha on tokens 0 and 1
    and put the rest on different tokens."""
    p = np.array([alpha / 2, alpha / 2, 1 - alpha, 0.0])
    q = np.array([alpha / 2, alpha / 2, 0.0, 1 - alpha])
    return p, q


def tokens_per_round(rounds: int, seed: int, verdict: Verdict) -> None:
    print(
        "\n2. Eq. (1): expected tokens per round (1 - a^(g+1)) / (1 - a), against rounds "
        f"simulated through the sampler ({rounds:,} rounds each)\n"
    )
    print(f"{'alpha':>5} {'gamma':>5} {'eq. (1)':>8} {'measured':>9} {'6 sigma':>8}")
    gen = generator(seed + 1)
    for alpha in (0.75, 0.9):
        p, q = pair_with_acceptance(alpha)
        for gamma in (3, 7):
            logits = _logits(p).expand(rounds, gamma + 1, 4)
            q_rows = torch.tensor(q, dtype=torch.float32).expand(rounds, gamma, 4)
            drafts = torch.multinomial(
                q_rows.reshape(-1, 4), 1, replacement=True, generator=gen
            ).view(rounds, gamma)
            out = rejection_sample(logits.contiguous(), drafts, q_rows.contiguous(), generator=gen)
            emitted = (out.num_accepted + 1).double()
            # The law of n + 1: P(n = i) = a^i (1 - a) for i < g, P(n = g) = a^g.
            n = np.arange(gamma + 1)
            law = np.where(n < gamma, alpha**n * (1 - alpha), alpha**gamma)
            mean = expected_tokens_per_round(alpha, gamma)  # eq. (1), as the decode stats use it
            assert abs((law * (n + 1)).sum() - mean) < 1e-12
            sigma = np.sqrt((law * (n + 1 - mean) ** 2).sum() / rounds)
            measured = emitted.mean().item()
            mark = verdict.check(
                f"tokens per round, alpha {alpha}, gamma {gamma}", measured, mean, sigma
            )
            print(
                f"{alpha:5.2f} {gamma:5d} {mean:8.3f} {measured:9.3f} {SIGMAS * sigma:8.3f}"
                f"{'  <- off' if mark.strip() else ''}"
            )


def block_toy_example(rounds: int, seed: int, verdict: Verdict) -> None:
    big, small = [Fraction(1, 3), Fraction(2, 3)], [Fraction(2, 3), Fraction(1, 3)]
    target, draft = (lambda prefix: big), (lambda prefix: small)
    gamma = 2
    print(
        "\n3. Block verification, toy example: V = {a, b}, Mb = (1/3, 2/3), "
        f"Ms = (2/3, 1/3), gamma = {gamma}; {rounds:,} rounds each\n"
    )
    print("expected accepted drafts, exact and measured; the first token of a round follows Mb\n")
    print(
        f"{'method':<10} {'exact':>6} {'':>7} {'measured':>9} {'6 sigma':>8}  "
        f"{'first token a, b':>16}"
    )
    gen = generator(seed + 2)
    logits = _logits(np.array([1 / 3, 2 / 3])).expand(rounds, gamma + 1, 2).contiguous()
    q_rows = torch.tensor([2 / 3, 1 / 3]).expand(rounds, gamma, 2).contiguous()
    for method in ("standard", "block"):
        law = exact_law.round_law(target, draft, gamma, 2, exact_law.RULES[method])
        expected = exact_law.expected_accepted(law)
        lengths = {
            t: float(sum(p for e, p in law.items() if len(e) == t + 1)) for t in range(gamma + 1)
        }
        sigma = np.sqrt(sum(p * (t - float(expected)) ** 2 for t, p in lengths.items()) / rounds)
        drafts = torch.multinomial(q_rows.view(-1, 2), 1, replacement=True, generator=gen).view(
            rounds, gamma
        )
        out = rejection_sample(logits, drafts, q_rows, generator=gen, method=method)
        measured = out.num_accepted.double().mean().item()
        mark = verdict.check(f"{method} accepted drafts", measured, float(expected), sigma)
        # Every round emits a first token, and it follows Mb: the rows are independent, so the
        # count of b among them is Binomial(rounds, 2/3).
        freq_b = out.token_ids[:, 0].double().mean().item()
        mark += verdict.check(f"{method} frequency of b", freq_b, 2 / 3, np.sqrt(2 / 9 / rounds))
        print(
            f"{method:<10} {str(expected):>6} {float(expected):7.4f} {measured:9.4f} "
            f"{SIGMAS * sigma:8.4f}  {1 - freq_b:>9.4f} {freq_b:.4f}"
            f"{'  <- off' if mark.strip() else ''}"
        )
    optimum = exact_law.optimum_accepted(target, draft, gamma, 2)
    print(
        f"{'optimum':<10} {str(optimum):>6} {float(optimum):7.4f}  (sum over i and x^i of "
        "min(Mb(x^i), Ms(x^i)))"
    )
    print(
        "\nWhy the LAST passing index wins: p_i, the capped likelihood ratio Mb/Ms of the whole "
        "prefix X^i,\nrises again after a draft that Mb likes more than Ms did, so a later "
        "position may keep X^i\neven where an earlier position's test, on its own, failed."
    )


def close_pair(seed: int) -> tuple[GPT, GPT]:
    """A V = 5 target with peaky conditionals (weights ~ N(0, 1.5^2 / fan_in): logits of std
    about 1.5) and a draft whose every weight matrix is sqrt(1 - 0.3^2) W + 0.3 N (alpha about
    0.65): rounds see both rejections and full acceptance, and block's tau often lies past a
    failed position."""
    config = GPTConfig(
        vocab_size=LOOP_VOCAB, n_layer=1, n_head=2, d_model=16, mlp_hidden=32, max_seq_len=16
    )
    target, draft = GPT(config).eval(), GPT(config).eval()
    gen, mix = generator(seed), 0.3
    with torch.no_grad():
        for w, d in zip(target.parameters(), draft.parameters()):
            if w.dim() >= 2:
                w.normal_(0.0, 1.5 * w.shape[-1] ** -0.5, generator=gen)
                noise = torch.randn(w.shape, generator=gen) * w.std()
                d.copy_(math.sqrt(1 - mix**2) * w + mix * noise)
            else:
                d.copy_(w)
    return target, draft


def loop_law(target: GPT) -> dict:
    """The target's law of LOOP_NEW tokens after LOOP_PROMPT: a product of its conditionals,
    each from one cache-free forward over the whole prefix."""

    @lru_cache(maxsize=None)
    def conditional(prefix: tuple) -> list[float]:
        tokens = torch.tensor([LOOP_PROMPT + prefix])
        return target(tokens)[0, -1].double().softmax(-1).tolist()

    with torch.no_grad():
        return exact_law.target_law(conditional, LOOP_NEW)


def through_the_loop(rows: int, seed: int, verdict: Verdict) -> None:
    print(
        f"\n4. Through the decode loop: V = {LOOP_VOCAB}, a draft close to the target, prompt "
        f"{list(LOOP_PROMPT)}, K = {LOOP_K}, T = 1,\n   {rows:,} seeded rows of {LOOP_NEW} new "
        f"tokens; chi-square of the {LOOP_VOCAB**LOOP_NEW} sequences against the target's law\n"
    )
    print(f"{'method':<17} {'accept':>7} {'chi2':>8} {'df':>4} {'p':>9}")
    target, draft = close_pair(seed + 3)
    law = loop_law(target)
    decoder = SpeculativeDecoder(target, draft, compile=False)
    for method in ("standard", "block", "drafter_invariant", "tree"):
        params = [
            SamplingParams(1.0, seed=seed * rows + i, max_new_tokens=LOOP_NEW) for i in range(rows)
        ]
        spec = SpeculativeConfig(LOOP_K, "probabilistic", method, "draft_model")
        if method == "tree":  # two candidates for the first token, the standard rule's tree
            spec = SpeculativeConfig(LOOP_K, "probabilistic", proposer="tree", tree_branching=(2,))
        out = decoder.generate([list(LOOP_PROMPT)] * rows, params, spec)
        stat, df = exact_law.chi_square(Counter(map(tuple, out.token_ids)), law)
        p_value = exact_law.chi_square_sf(stat, df)
        ok = p_value >= LOOP_FALSE_ALARM
        if not ok:
            verdict.failures.append(f"{method} through the loop: chi2 {stat:.1f} / {df}")
        print(
            f"{method:<17} {out.stats.accepted / out.stats.drafted:7.4f} {stat:8.1f} {df:4d} "
            f"{p_value:9.3g}{'' if ok else '  <- off'}"
        )
    print(
        "\nEvery standard or block round draws fresh numbers (sampling/noise.py): block keeps the "
        "LAST\npassing position, so the uniforms and drafts past it are conditioned on what it "
        "kept, and no\nlater round may read them. drafter_invariant's token at position t is the "
        "target's race with\nnoise keyed by t alone: the K = 0 token of that seed."
    )


TREE_SCHEMES = (  # name, how the two candidates are drawn, rule
    ("without repl.", "without_replacement", "standard"),
    ("i.i.d.", "iid", "standard"),
    ("naive", "without_replacement", "naive"),
)


def tree_law(scheme: str, rule: str) -> tuple[float, np.ndarray]:
    """Two candidates for one token, drawn from Q by `scheme` and verified against P by `rule`:
    the exact probability that one is accepted, and the exact law of the emitted token."""
    accept, law = 0.0, np.zeros(len(P))
    for tokens, prob, qs in exact_law.sibling_draws(Q.tolist(), 2, scheme):
        chosen, rest = exact_law.family_outcomes(P.tolist(), tokens, qs, rule)
        for x, c in zip(tokens, chosen):
            accept, law[x] = accept + prob * c, law[x] + prob * c
        law += prob * (1 - sum(chosen)) * np.array(rest) / sum(rest)
    return accept, law


def tree_example(draws: int, seed: int, verdict: Verdict) -> None:
    print(
        f"\n5. The tree rule (sampling/tree.py) on the worked example: two candidates for one "
        f"token,\n   drawn from q without replacement or i.i.d., verified against p in one call; "
        f"{draws:,} rounds each\n"
    )
    print(
        f"{'candidates':<15} {'accept':>7} {'expect':>7}  {'output frequencies':<36} "
        f"{'L1 to p':>7} {'expect':>7}"
    )
    gen, tree = generator(seed + 4), tree_shape((2,))
    logits = _logits(P).expand(draws, 3, len(P)).contiguous()
    q = torch.tensor(Q, dtype=torch.float32)
    for name, scheme, rule in TREE_SCHEMES:
        drafts = torch.multinomial(q.expand(draws, -1), 2, scheme == "iid", generator=gen)
        second = q.expand(draws, -1).clone()
        if scheme == "without_replacement":  # q_2: q without the first candidate, renormalised
            second.scatter_(1, drafts[:, :1], 0.0)
            second /= second.sum(1, keepdim=True)
        draft_probs = torch.stack([q.expand(draws, -1), second], 1)
        out = tree_rejection_sample(logits, drafts, draft_probs, tree, generator=gen, method=rule)
        expected_accept, expected_out = tree_law(scheme, rule)
        accept = (out.num_accepted > 0).double().mean().item()
        freq = np.bincount(out.token_ids[:, 0].cpu().numpy(), minlength=len(P)) / draws
        l1, expected_l1 = np.abs(freq - P).sum(), np.abs(expected_out - P).sum()
        cell_sigma = np.sqrt(expected_out * (1 - expected_out) / draws)
        sigma = np.sqrt(expected_accept * (1 - expected_accept) / draws)
        marks = verdict.check(f"tree {name} acceptance", accept, expected_accept, sigma)
        marks += "".join(
            verdict.check(f"tree {name} frequency of token {i}", f, e, s)
            for i, (f, e, s) in enumerate(zip(freq, expected_out, cell_sigma))
        )
        print(
            f"{name:<15} {accept:7.4f} {expected_accept:7.4f}  "
            f"{' '.join(f'{f:.4f}' for f in freq):<36} {l1:7.4f} {expected_l1:7.4f}"
            f"{'  <- off' if marks.strip() else ''}"
        )
    print(
        "\nA second candidate raises the acceptance from 0.75 to 0.85 (i.i.d.) or 0.896 (without"
        "\nreplacement) and keeps the output p; testing it against p rather than against the"
        "\nresidual the first one left (naive) biases the output."
    )
