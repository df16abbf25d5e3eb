"""n-gram prompt lookup (vLLM's `ngram`, transformers' `prompt_lookup_num_tokens`) in tensor ops.

Each row looks for the most recent earlier occurrence of its own last n tokens, n from n_max down
to n_min, in everything it holds (prompt and output), and proposes the tokens that followed it.
A byte-level model copies long runs (one identifier is many tokens), so this is where drafts
cost nothing and are often right. No Python loop over rows, no data-dependent shapes: it
compiles with fullgraph=True into one graph per (B, S, K) and can live inside a compiled round.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from minispec.proposers.proposal import DraftSampling, Proposal
from minispec.state import LoopState
from sampling import PLACEHOLDER_TOKEN_ID

NOT_A_TOKEN = -2  # left padding for the windows: equal to no token id and no placeholder


def ngram_match(
    tokens: torch.Tensor, seq_len: torch.Tensor, n_min: int, n_max: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """tokens [B, S] long (row b holds seq_len[b] tokens): each row's match, where it ends [B]
    and its length [B], 0 for a row without one.

    The match ending at position e (e < seq_len - 1, so at least one token follows it) has
    length l(e) = how many tokens before and at e equal the row's last tokens, capped at n_max.
    The row takes the longest match, the most recent among equals, if it is at least n_min.
    """
    b, s = tokens.shape
    last = seq_len - 1
    padded = torch.cat([tokens.new_full((b, n_max - 1), NOT_A_TOKEN), tokens], 1)
    windows = padded.unfold(1, n_max, 1)  # [B, S, n_max]: windows[b, e] = tokens[b, e-n_max+1 .. e]
    # the row's last n_max tokens, [B, 1, n_max]
    suffix = windows.gather(1, last[:, None, None].expand(b, 1, n_max))
    # Matching tokens counted backwards from e; the first mismatch ends the run. Padding never
    # matches: a window reaches it only at offset e + 1, where the suffix still has a real token.
    length = (windows == suffix).flip(-1).long().cumprod(-1).sum(-1)  # [B, S]
    position = torch.arange(s, device=tokens.device)
    length = torch.where(position < last[:, None], length, 0)
    end = (length * s + position).argmax(1)  # longest first, then most recent
    match_length = length.gather(1, end[:, None]).squeeze(1)
    return end, torch.where(match_length >= n_min, match_length, 0)


def ngram_propose(
    tokens: torch.Tensor, seq_len: torch.Tensor, k: int, n_min: int, n_max: int
) -> Proposal:
    """tokens [B, S] long (row b holds seq_len[b] tokens), k drafts per matching row: what
    followed the row's match (ngram_match), repeated with the match's period where it runs past
    the known tokens (docs/extensions.md says why)."""
    end, match_length = ngram_match(tokens, seq_len, n_min, n_max)
    matched = match_length > 0
    period = (seq_len - 1 - end).clamp(min=1)
    j = torch.arange(k, device=tokens.device)
    source = (end[:, None] + 1 + j % period[:, None]).clamp(max=tokens.shape[1] - 1)
    draft_token_ids = torch.where(matched[:, None], tokens.gather(1, source), PLACEHOLDER_TOKEN_ID)
    return Proposal(draft_token_ids, torch.where(matched, k, 0))


@dataclass(frozen=True, slots=True)
class NgramProposer:
    """Deterministic (draft_probs None). Defaults suit bytes: 3 bytes is about the shortest
    context that says anything, 16 covers an indented identifier."""

    n_min: int = 3
    n_max: int = 16

    def __post_init__(self) -> None:
        if not (
            isinstance(self.n_min, int)
            and isinstance(self.n_max, int)
            and 1 <= self.n_min <= self.n_max
        ):
            raise ValueError(
                f"need ints 1 <= n_min <= n_max, got n_min={self.n_min!r}, n_max={self.n_max!r}"
            )

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        return ngram_propose(
            state.tokens, state.seq_len, num_speculative_tokens, self.n_min, self.n_max
        )
