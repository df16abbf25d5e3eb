"""One round of speculative decoding (Leviathan et al. 2022, Algorithm 1) for a whole batch.

`speculative_round` reads top to bottom as the algorithm, one phase per line:
  noise    all of the round's randomness, a hash of (seed, position)   (minispec/rng.py)
  propose  the drafter's K tokens x_1..x_K, and the q they came from    (`DraftModelProposer`)
  verify   the target's logits at [last, x_1..x_K], one (K+1)-token forward
  accept   the rejection sampler: n accepted drafts + 1 corrective or bonus token
  advance  each row moves by its own kept count; statistics accumulate  (minispec/state.py)
It is a pure function of tensors (the models' KV caches aside), so the decoder compiles it into
one graph per static shape: one call, one guard check, per round. With K = 0 the propose phase
is absent and accept is plain sampling of the target's next token: the baseline.
"""
from __future__ import annotations

from typing import Protocol

import torch

from minispec.rng import round_noise
from minispec.state import LoopState, advance
from model.gpt import GPT
from sampling import rejection_sample, sample
from sampling.constraints import RowConstraints, distribution


class Proposer(Protocol):
    """Anything that drafts K tokens per row. draft_probs [B, K, V] must be exactly the
    distribution each draft was drawn from; None means a one-hot (deterministic) draft."""

    def propose(self, state: LoopState, num_speculative_tokens: int, constraints: RowConstraints,
                noise: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor | None]: ...


class DraftModelProposer:
    """A small model of the target's vocabulary drafts K tokens, one single-token step each."""

    def __init__(self, model: GPT) -> None:
        self.model = model

    def propose(self, state: LoopState, num_speculative_tokens: int, constraints: RowConstraints,
                noise: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor | None]:
        """x_i ~ q_i for i = 1..K. The first step feeds [previous, last]: after a round that
        accepted all K drafts, x_K never went through the draft, and one [B, 2] shape serves
        both cases (rewriting a cache entry with the same value is harmless)."""
        seq_len = state.seq_len
        positions = torch.stack([seq_len - 2, seq_len - 1], 1)
        logits = self.model(state.tokens.gather(1, positions), positions)[:, -1]
        ids, probs = [], []
        for j in range(num_speculative_tokens):
            if method == "greedy":
                x = logits.argmax(-1)  # a one-hot q: draft_probs stays None
            else:
                x, q = draw(logits, constraints, noise[:, j])
                probs.append(q)
            ids.append(x)
            if j + 1 < num_speculative_tokens:
                logits = self.model(x[:, None], (seq_len + j)[:, None])[:, 0]
        return torch.stack(ids, 1), (torch.stack(probs, 1) if probs else None)


def draw(logits: torch.Tensor, constraints: RowConstraints,
         noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [B, V] under the request's constraints, and its exact q.
    The uncompiled sampler: it is traced into whatever graph calls it."""
    out = sample(logits, **constraints._asdict(), exponentials=noise, compiled=False,
                 check_values=False)
    return out.token_ids, out.probs


def verify(target: GPT, state: LoopState, draft_ids: torch.Tensor | None) -> torch.Tensor:
    """p_1..p_{K+1}: the target's logits [B, K+1, V] at [last, x_1..x_K], in one forward."""
    last = state.tokens.gather(1, state.seq_len[:, None] - 1)
    tokens = last if draft_ids is None else torch.cat([last, draft_ids], 1)
    positions = state.seq_len[:, None] - 1 + torch.arange(tokens.shape[1], device=tokens.device)
    return target(tokens, positions)


def accept(target_logits: torch.Tensor, draft_ids: torch.Tensor | None,
           draft_probs: torch.Tensor | None, constraints: RowConstraints, uniforms: torch.Tensor,
           noise: torch.Tensor, method: str) -> tuple[torch.Tensor, torch.Tensor]:
    """The emitted tokens [B, K+1] (n accepted drafts, then the corrective or bonus token, then
    placeholders) and n [B]. With no drafts, the target's next token is sampled."""
    if draft_ids is None:
        token, _ = draw(target_logits[:, 0], constraints, noise)
        return token[:, None], torch.zeros_like(token)
    return rejection_sample(target_logits, draft_ids, draft_probs, **constraints._asdict(),
                            uniforms=uniforms, exponentials=noise, method=method,
                            compiled=False, check_values=False)


def acceptance_probability(target_logits: torch.Tensor, draft_ids: torch.Tensor,
                           draft_probs: torch.Tensor | None,
                           constraints: RowConstraints) -> torch.Tensor:
    """beta_i = sum_v min(p_i(v), q_i(v)) at each draft position [B, K] (Leviathan Def. 3.1);
    with a one-hot q it is p_i(x_i). Their mean over tested positions is alpha."""
    p = distribution(target_logits[:, :draft_ids.shape[1]], constraints)
    if draft_probs is None:
        return p.gather(-1, draft_ids[..., None]).squeeze(-1)
    return torch.minimum(p, draft_probs).sum(-1)


def speculative_round(target: GPT, proposer: Proposer | None, state: LoopState,
                      constraints: RowConstraints, *, num_speculative_tokens: int,
                      draft_sample_method: str, rejection_sample_method: str,
                      eos_token_id: int) -> tuple[LoopState, torch.Tensor]:
    """Algorithm 1 once for every row: returns the next state and the snapshot the host reads."""
    k, vocab_size = num_speculative_tokens, target.config.vocab_size
    draft_noise, uniforms, target_noise = round_noise(state.seeds, state.seq_len, k, vocab_size)
    draft_ids = draft_probs = beta = None
    if k:
        draft_ids, draft_probs = proposer.propose(state, k, constraints, draft_noise,
                                                  draft_sample_method)
    target_logits = verify(target, state, draft_ids)
    emitted, num_accepted = accept(target_logits, draft_ids, draft_probs, constraints, uniforms,
                                   target_noise, rejection_sample_method)
    if k:
        beta = acceptance_probability(target_logits, draft_ids, draft_probs, constraints)
    return advance(state, emitted, num_accepted, beta, eos_token_id)
