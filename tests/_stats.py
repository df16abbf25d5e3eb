"""Helpers for the sampling tests: exact frequency checks with a stated false-alarm rate, the
expected target distribution computed independently of the sampler, and a way to run small
inputs through the compiled sampler without compiling a graph per shape.

The frequency check. A count X of N draws with cell probability p is Binomial(N, p). That
holds for a later position j too, given the N rows that reach it: reaching j depends only on
the earlier positions' drafts and uniforms, and the token emitted at j, given that, is a fresh
draw from p_j. Bernstein's inequality bounds
P(|X - Np| >= t) <= 2 exp(-t^2 / (2 (Np(1-p) + t/3))). Solving for t at a per-cell rate
delta gives the radius below; a test checks all its cells at delta = 1e-6 / (number of cells),
so by the union bound the whole test raises a false alarm with probability at most 1e-6.
Cells with p = 0 must be exactly empty: that is a certainty, not a statistic.
"""

import math

import numpy as np
import torch

import sampling
from sampling import reference

FALSE_ALARM = 1e-6


def bernstein_radius(num_draws: int, prob: float, delta: float) -> float:
    """t with P(|X - N p| >= t) <= delta for X ~ Binomial(N, p)."""
    log_term = math.log(2 / delta)
    variance = num_draws * prob * (1 - prob)
    return log_term / 3 + math.sqrt((log_term / 3) ** 2 + 2 * log_term * variance)


class FrequencyCheck:
    """Collects (counts, probabilities) groups, then reports every cell outside its radius."""

    def __init__(self, false_alarm: float = FALSE_ALARM):
        self.false_alarm = false_alarm
        self.groups: list[tuple[str, np.ndarray, np.ndarray]] = []

    def add(self, label: str, counts, probs) -> None:
        counts = np.asarray(counts, dtype=np.int64)
        probs = np.asarray(probs, dtype=np.float64)
        assert counts.shape == probs.shape and abs(probs.sum() - 1) < 1e-6, label
        self.groups.append((label, counts, probs))

    def failures(self) -> list[str]:
        num_cells = sum(len(p) for _, _, p in self.groups)
        delta = self.false_alarm / max(num_cells, 1)
        bad = []
        for label, counts, probs in self.groups:
            total = int(counts.sum())
            for cell, (count, prob) in enumerate(zip(counts, probs)):
                expected = total * prob
                if prob == 0:
                    ok = count == 0
                else:
                    ok = abs(count - expected) < bernstein_radius(total, prob, delta)
                if not ok:
                    bad.append(f"{label} cell {cell}: {count} of {total}, expected {expected:.1f}")
        return bad


def constrained_probs(
    p_raw, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0
) -> np.ndarray:
    """The target distribution after temperature -> top-k -> top-p, in float64 numpy, written
    independently of sampling/: p_raw are probabilities (logits = log p_raw); top-k keeps every
    logit >= the k-th largest, top-p the logits >= the last of the shortest top prefix whose
    mass reaches top_p."""
    with np.errstate(divide="ignore"):
        scaled = np.log(np.asarray(p_raw, dtype=np.float64)) / temperature
    probs = np.exp(scaled - scaled.max())
    probs /= probs.sum()
    order = np.argsort(-scaled, kind="stable")
    keep = np.ones_like(probs, dtype=bool)
    if top_k:
        keep &= scaled >= scaled[order[min(top_k, len(order)) - 1]]
    if top_p < 1:
        kept_probs = np.where(keep, probs, 0) / probs[keep].sum()
        mass = np.cumsum(kept_probs[order])
        last = order[min(int(np.sum(mass < top_p)), len(order) - 1)]
        keep &= scaled >= scaled[last]
    probs = np.where(keep, probs, 0)
    return probs / probs.sum()


def as_logits(probs) -> torch.Tensor:
    """float32 logits whose softmax is ``probs`` (zeros become -inf)."""
    return torch.as_tensor(np.asarray(probs, dtype=np.float64)).log().float()


# --- shared compiled shapes ---------------------------------------------------------------------
# Each Inductor graph costs 10-60 s to compile on a small CPU, and one is compiled per shape and
# variant (one-hot or not, filters on or off, method). So tests with small inputs embed them in
# one of two shapes that the statistical tests compile anyway: extra rows repeat row 0 and are
# cut off again; extra vocabulary entries get logit -inf and draft probability 0, so they are
# never drawn and change nothing.
SMALL = dict(rows=1 << 17, drafts=3, vocab=19)  # [B, K, V] of the many-case batches
LARGE = dict(rows=1024, drafts=1, vocab=32000)  # the large-vocabulary case


def shared_shape(num_drafts: int, vocab_size: int) -> dict | None:
    for shape in (SMALL, LARGE):
        if num_drafts == shape["drafts"] and vocab_size <= shape["vocab"]:
            return shape
    return None


def pad_to_shape(
    shape: dict,
    target_logits,
    draft_token_ids,
    draft_probs,
    uniforms,
    exponentials,
    temperature=1.0,
    top_k=None,
    top_p=None,
    num_draft_tokens=None,
) -> dict:
    """The rejection_sample arguments of a small problem, padded to ``shape``. When any filter
    is on, both become [B] tensors (0 and 1.0 meaning off), so one filtering graph serves all."""
    batch_size = draft_token_ids.shape[0]
    extra_vocab = shape["vocab"] - target_logits.shape[-1]
    assert batch_size <= shape["rows"]

    def rows(t):
        if not isinstance(t, torch.Tensor):
            return t
        if t.dim() == 0:
            t = t.expand(batch_size)
        filler = t[:1].expand(shape["rows"] - batch_size, *t.shape[1:])
        return torch.cat([t, filler]).contiguous()

    if top_k is not None or top_p is not None:
        top_k = torch.as_tensor(0 if top_k is None else top_k, dtype=torch.int64)
        top_p = torch.as_tensor(1.0 if top_p is None else top_p, dtype=torch.float64)
    pad = torch.nn.functional.pad
    return dict(
        target_logits=rows(pad(target_logits, (0, extra_vocab), value=float("-inf"))),
        draft_token_ids=rows(draft_token_ids),
        draft_probs=None if draft_probs is None else rows(pad(draft_probs, (0, extra_vocab))),
        uniforms=rows(uniforms),
        exponentials=rows(pad(exponentials, (0, extra_vocab), value=1.0)),
        temperature=rows(temperature),
        top_k=rows(top_k),
        top_p=rows(top_p),
        num_draft_tokens=rows(num_draft_tokens),
    )


def all_implementations(
    target_logits,
    draft_token_ids,
    draft_probs=None,
    *,
    uniforms,
    exponentials,
    temperature=1.0,
    top_k=None,
    top_p=None,
    method="standard",
    num_draft_tokens=None,
) -> sampling.RejectionOutput:
    """Run the compiled sampler (padded to a shared shape), the same code eagerly and the
    plain reference; assert that all three agree exactly and return the result."""
    kwargs = dict(
        uniforms=uniforms,
        exponentials=exponentials,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        num_draft_tokens=num_draft_tokens,
    )
    batch_size, num_drafts = draft_token_ids.shape
    shape = shared_shape(num_drafts, target_logits.shape[-1])
    assert shape is not None, "pick K and V to fit a shared shape, or compile a new graph"
    padded = pad_to_shape(shape, target_logits, draft_token_ids, draft_probs, **kwargs)
    compiled = sampling.rejection_sample(**padded, method=method)
    compiled = sampling.RejectionOutput(
        compiled.token_ids[:batch_size], compiled.num_accepted[:batch_size]
    )
    eager = sampling.rejection_sample(
        target_logits, draft_token_ids, draft_probs, method=method, compiled=False, **kwargs
    )
    plain = reference.rejection_sample(
        target_logits, draft_token_ids, draft_probs, method=method, **kwargs
    )
    for name, out in [("eager", eager), ("plain", plain)]:
        assert torch.equal(compiled.token_ids, out.token_ids), f"compiled != {name}"
        assert torch.equal(compiled.num_accepted, out.num_accepted), f"compiled != {name}"
    return compiled
