"""The draft model as a proposer: a small model of the target's vocabulary drafts K tokens, one
single-token step each, greedily (a one-hot q) or by sampling (q = its filtered softmax).

Sampling decides per row: a row at temperature 0 has a one-hot q at the draft's argmax, so
its race drafts that argmax, and its draft_probs row is that one-hot q. A batch of greedy and
sampled rows is one draft_probs tensor [B, K, V], and one graph serves every temperature."""

from __future__ import annotations

from typing import Callable

import torch

from minispec.proposers.proposal import DraftSampling, Proposal
from minispec.state import LoopState
from model.gpt import GPT
from sampling import sample
from sampling.constraints import RowConstraints


class DraftModelProposer:
    """The first step feeds the row's last 2 tokens: after a round that accepted all K drafts,
    x_K never went through the draft, and one [B, 2] shape serves both cases (rewriting a cache
    entry with the same value is harmless). Tokens it never saw beyond that (rounds at K = 0)
    are fed by `catch_up` before it drafts again."""

    def __init__(self, model: GPT) -> None:
        self.model = model

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        """x_i ~ q_i for i = 1..K, every row K drafts; each step reads the draft's cache slots
        key_positions (all of them if None)."""
        seq_len = state.seq_len

        def step(x: torch.Tensor, j: int) -> torch.Tensor:
            return self.model(x[:, None], (seq_len + j)[:, None], key_positions)[:, 0]

        logits = first_step(self.model, state, key_positions)
        return draft_chain(logits, num_speculative_tokens, sampling, step, seq_len)

    def catch_up(
        self, state: LoopState, tokens_behind: int, key_positions: torch.Tensor | None
    ) -> LoopState:
        """After rounds at K = 0, which never ran the draft: feed it each row's last
        tokens_behind + 2 tokens (a missed token would blunt its aim, not break exactness)."""
        positions = last_positions(state.seq_len, tokens_behind + 2)
        self.model(state.tokens.gather(1, positions), positions, key_positions)
        return state


def draft_chain(
    logits: torch.Tensor,
    num_speculative_tokens: int,
    sampling: DraftSampling,
    step: Callable[[torch.Tensor, int], torch.Tensor],
    seq_len: torch.Tensor,
) -> Proposal:
    """K drafts per row, x_1 from logits [B, V] and each x_{j+2} from step(x_{j+1}, j), every
    one drawn by `draw` (or the argmax, under greedy drafts), with the q it came from."""
    ids, probs = [], []
    for j in range(num_speculative_tokens):
        if sampling.method == "greedy":
            x = logits.argmax(-1)  # every row one-hot: draft_probs stays None
        else:
            x, q = draw(logits, sampling.constraints, sampling.noise[:, j])
            probs.append(q)
        ids.append(x)
        if j + 1 < num_speculative_tokens:
            logits = step(x, j)
    return Proposal(
        torch.stack(ids, 1),
        torch.full_like(seq_len, num_speculative_tokens),
        torch.stack(probs, 1) if probs else None,
    )


def first_step(model: GPT, state: LoopState, key_positions: torch.Tensor | None) -> torch.Tensor:
    """The draft's logits [B, V] after each row's last token, from one step over the row's last
    2 tokens (the class docstring says why 2)."""
    positions = last_positions(state.seq_len, 2)
    return model(state.tokens.gather(1, positions), positions, key_positions)[:, -1]


def last_positions(seq_len: torch.Tensor, count: int) -> torch.Tensor:
    """[B, count]: each row's positions seq_len - count .. seq_len - 1; one below 0 (a short row)
    repeats 0, the same token written twice to the same slot."""
    back = torch.arange(count - 1, -1, -1, device=seq_len.device)
    return (seq_len[:, None] - 1 - back).clamp(min=0)


def draw(
    logits: torch.Tensor, constraints: RowConstraints, noise: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    """One token per row of logits [B, V] under the request's constraints, and its exact q
    (one-hot at the argmax for a row at temperature 0, which then draws the argmax). The
    uncompiled sampler: it is traced into whatever graph calls it."""
    out = sample(
        logits, **constraints._asdict(), exponentials=noise, compiled=False, check_values=False
    )
    return out.token_ids, out.probs
