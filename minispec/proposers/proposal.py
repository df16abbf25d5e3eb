"""What every proposer returns, and the two kinds of proposer the round takes.

A proposer may be anything (a draft model, a lookup in the request's own tokens, an index over
a corpus): the output stays exact as long as `draft_probs`, when given, is exactly the
distribution each draft token was drawn from. A deterministic proposer passes None, which the
rejection sampler reads as a one-hot q, lossless for any token. A row with fewer than K drafts
marks the missing positions with PLACEHOLDER_TOKEN_ID and counts its drafts in
`num_draft_tokens`: the sampler never accepts past that count, so the round ends there with a
corrective or bonus token from the target.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple, Protocol, runtime_checkable

import torch

if TYPE_CHECKING:
    from minispec.state import LoopState
    from sampling.constraints import RowConstraints


class Proposal(NamedTuple):
    draft_token_ids: torch.Tensor  # [B, K] long; PLACEHOLDER_TOKEN_ID past num_draft_tokens
    num_draft_tokens: torch.Tensor  # [B] long, in [0, K]
    draft_probs: torch.Tensor | None = None  # [B, K, V] q of each draft; None: deterministic

    def to(self, device: torch.device | str) -> Proposal:
        """On `device`: a host lookup's proposal goes to the round as an input."""
        return Proposal(*(None if t is None else t.to(device) for t in self))


class DraftSampling(NamedTuple):
    """How a proposer that samples draws its drafts: the requests' constraints, the round's
    draft noise [B, K, V] and the draft_sample_method ("greedy" or "probabilistic"; "auto"
    arrives as "probabilistic", whose rows at temperature 0 draft greedily)."""

    constraints: RowConstraints
    noise: torch.Tensor
    method: str


class Proposer(Protocol):
    """Drafts up to K tokens per row inside the compiled round, from the rows' tokens
    (state.tokens [B, S], row b holding state.seq_len[b]); one that samples reads `sampling`,
    one that runs a model passes `key_positions` (the cache slots to read) to its forwards."""

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal: ...


@runtime_checkable
class HostProposer(Protocol):
    """Drafts on the host, between rounds, from each row's tokens so far (prompt and output, as
    the loop holds them after the round's one read): for a lookup too large for the device. The
    loop puts its Proposal in the round's state (proposer_state), which the proposer's own
    `propose` returns inside the round: it adds no device-to-host read, and no input."""

    def host_propose(self, histories: list[list[int]], k: int) -> Proposal: ...
