"""What every proposer returns, and the hybrid that mixes two proposals row by row.

A proposer may be anything (a draft model, a lookup in the request's own tokens, an index over
a corpus): the output stays exact as long as `draft_probs`, when given, is exactly the
distribution each draft token was drawn from. A deterministic proposer passes None, which the
rejection sampler reads as a one-hot q, lossless for any token. A row with fewer than K drafts
marks the missing positions with PLACEHOLDER_TOKEN_ID and counts its drafts in
`num_draft_tokens`: the sampler never accepts past that count, so the round ends there with a
corrective or bonus token from the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol

import torch
import torch.nn.functional as F

from sampling import PLACEHOLDER_TOKEN_ID

if TYPE_CHECKING:
    from minispec.state import LoopState
    from sampling.constraints import RowConstraints


class Proposal(NamedTuple):
    draft_token_ids: torch.Tensor  # [B, K] long; PLACEHOLDER_TOKEN_ID past num_draft_tokens
    num_draft_tokens: torch.Tensor  # [B] long, in [0, K]
    draft_probs: torch.Tensor | None = None  # [B, K, V] q of each draft; None: deterministic
    # [B] long: how many context tokens a lookup matched (0: no match). A model's proposal
    # leaves it None. The hybrid trusts a lookup only past a threshold on it.
    match_length: torch.Tensor | None = None

    def to(self, device: torch.device | str) -> Proposal:
        """On `device`: a host lookup's proposal goes to the round as an input."""
        return Proposal(*(None if t is None else t.to(device) for t in self))

    def narrowed(self, k: int) -> Proposal:
        """The first k drafts of each row: a lookup made as wide as the widest round, for a
        narrower one. With a fresh tensor's strides: a compiled round guards on its inputs'
        strides, and a slice's would compile it again (even at B = 1, where .contiguous() keeps
        them, a dimension of size 1 being contiguous whatever its stride)."""
        fresh = lambda t: t[:, :k].clone(memory_format=torch.contiguous_format)  # noqa: E731
        probs = None if self.draft_probs is None else fresh(self.draft_probs)
        return Proposal(
            fresh(self.draft_token_ids),
            self.num_draft_tokens.clamp(max=k),
            probs,
            self.match_length,
        )


class Proposer(Protocol):
    """Anything that drafts up to K tokens per row, called inside the compiled round.

    Each implementation reads what it needs: the rows' tokens (state.tokens [B, S], row b holding
    state.seq_len[b]), the requests' constraints and the round's draft noise [B, K, V] (a model
    that samples), the draft_sample_method ("greedy" or "probabilistic"), or host_proposal, a
    Proposal the host computed before the round (a lookup too large for the device)."""

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        constraints: RowConstraints,
        noise: torch.Tensor,
        draft_sample_method: str,
        host_proposal: Proposal | None,
    ) -> Proposal: ...


class HostLookupProposer:
    """Base of the proposers that look up on the host, between rounds, in tokens the host
    already holds (`host_propose`): inside the round, `propose` passes on that Proposal, an
    input tensor, so the lookup adds no device-to-host read."""

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        constraints: RowConstraints,
        noise: torch.Tensor,
        draft_sample_method: str,
        host_proposal: Proposal | None,
    ) -> Proposal:
        if host_proposal is None:
            raise ValueError(f"{type(self).__name__} needs the host's proposal for this round")
        return host_proposal


def one_hot_probs(
    draft_token_ids: torch.Tensor, vocab_size: int, dtype: torch.dtype
) -> torch.Tensor:
    """The q a deterministic proposer draws from: one-hot at each draft, all zeros at
    placeholders (never tested: the sampler stops at num_draft_tokens)."""
    real = draft_token_ids != PLACEHOLDER_TOKEN_ID
    return (F.one_hot(draft_token_ids.clamp(min=0), vocab_size) * real[..., None]).to(dtype)


def hybrid(primary: Proposal, fallback: Proposal, use_primary: torch.Tensor) -> Proposal:
    """Row b takes `primary` where use_primary[b] (e.g. its lookup matched enough context),
    `fallback` elsewhere. Each row keeps its own q, so the mix is exact: where one side is
    deterministic and the other is not, the deterministic rows get their one-hot q explicitly."""
    if primary.draft_token_ids.shape != fallback.draft_token_ids.shape:
        raise ValueError(
            f"proposals differ in shape: {tuple(primary.draft_token_ids.shape)} and "
            f"{tuple(fallback.draft_token_ids.shape)}"
        )
    row = use_primary[:, None]
    ids = torch.where(row, primary.draft_token_ids, fallback.draft_token_ids)
    num = torch.where(use_primary, primary.num_draft_tokens, fallback.num_draft_tokens)
    probs = None
    if primary.draft_probs is not None or fallback.draft_probs is not None:
        given = primary.draft_probs if primary.draft_probs is not None else fallback.draft_probs
        q = [
            p.draft_probs
            if p.draft_probs is not None
            else one_hot_probs(p.draft_token_ids, given.shape[-1], given.dtype)
            for p in (primary, fallback)
        ]
        probs = torch.where(row[..., None], q[0], q[1])
    match = [
        p.match_length if p.match_length is not None else torch.zeros_like(num)
        for p in (primary, fallback)
    ]
    return Proposal(ids, num, probs, torch.where(use_primary, match[0], match[1]))


def longest_match(proposals: list[Proposal]) -> Proposal:
    """Row by row, the lookup proposal that matched the most context (the first among equals)."""
    best = proposals[0]
    for other in proposals[1:]:
        best = hybrid(other, best, other.match_length > best.match_length)
    return best


class HybridProposer:
    """Per row and round: the host lookup's proposal (HostLookup, passed in as host_proposal)
    where it matched at least `threshold` tokens of context, the fallback's (a draft model)
    elsewhere. Exact whatever the threshold: the choice depends on the row's tokens so far, never
    on this round's noise, and each row keeps its q."""

    def __init__(self, fallback: Proposer, threshold: int) -> None:
        if not (isinstance(threshold, int) and threshold >= 1):
            raise ValueError(f"threshold must be an int >= 1, got {threshold!r}")
        self.fallback, self.threshold = fallback, threshold

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        constraints: RowConstraints,
        noise: torch.Tensor,
        draft_sample_method: str,
        host_proposal: Proposal | None,
    ) -> Proposal:
        if host_proposal is None:
            raise ValueError("the hybrid needs the host lookup's proposal for this round")
        model = self.fallback.propose(
            state, num_speculative_tokens, constraints, noise, draft_sample_method, None
        )
        return hybrid(host_proposal, model, host_proposal.match_length >= self.threshold)
