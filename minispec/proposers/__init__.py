"""Proposers: where draft tokens come from. Any of them keeps decoding exact (see proposal.py).

- ``DraftModelProposer``: a small model drafts, greedily or by sampling (draft_model.py).
- ``NgramProposer``: the request's own prompt and output (prompt lookup), tensor ops.
- ``SuffixProposer``: the longest match of the recent context in a corpus (``SuffixIndex``), the
  most frequent continuation; looked up on the host, between rounds.
- ``HostLookup``: the n-gram and suffix lookups together, on the host, the longer match per row.
- ``HybridProposer``: per row, the host lookup's proposal where it matched enough context, a
  draft model's elsewhere.
"""

from minispec.proposers.draft_model import DraftModelProposer
from minispec.proposers.lookup import HostLookup
from minispec.proposers.ngram import NgramProposer, ngram_propose
from minispec.proposers.proposal import (
    HostLookupProposer,
    HybridProposer,
    Proposal,
    Proposer,
    hybrid,
    longest_match,
    one_hot_probs,
)
from minispec.proposers.suffix import SuffixIndex, SuffixProposer

__all__ = [
    "DraftModelProposer",
    "HostLookup",
    "HostLookupProposer",
    "HybridProposer",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "SuffixIndex",
    "SuffixProposer",
    "hybrid",
    "longest_match",
    "ngram_propose",
    "one_hot_probs",
]
