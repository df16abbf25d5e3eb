"""The hybrid's lookups, on the host: the n-gram match in the row's own tokens and, when the
decoder has one, the suffix index over a corpus; row by row, the longer match wins.

They run between rounds, on the tokens the host already holds from the round's one read, so
the match lengths are known on the host before the round starts. That is what lets the loop
skip the draft model in a round where every row's lookup is trusted (decode.py): such a round
costs one target verify, where a draft model's costs K draft steps more.
"""

from __future__ import annotations

from minispec.proposers.ngram import NgramProposer
from minispec.proposers.proposal import HostLookupProposer, Proposal, longest_match
from minispec.proposers.suffix import DEPTH, SuffixProposer


class HostLookup(HostLookupProposer):
    """Deterministic (draft_probs None); inside the round it passes on the host's Proposal."""

    def __init__(self, ngram: NgramProposer, suffix: SuffixProposer | None = None) -> None:
        self.ngram, self.suffix = ngram, suffix

    def host_propose(self, histories: list[list[int]], k: int) -> Proposal:
        """histories: each row's tokens so far (prompt and output). Host tensors."""
        ngram = self.ngram.host_propose(histories, k)
        # The index matches at most DEPTH tokens, and the n-gram wins ties: where every row's
        # n-gram matched that many, the index cannot change the proposal (and costs 0.2 ms).
        if self.suffix is None or bool((ngram.match_length >= DEPTH).all()):
            return ngram
        return longest_match([ngram, self.suffix.host_propose(histories, k)])
