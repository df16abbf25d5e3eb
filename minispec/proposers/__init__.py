"""Proposers: where draft tokens come from. Any of them keeps decoding exact (see proposal.py).

- ``NgramProposer``: the request's own prompt and output (prompt lookup), tensor ops.
- ``SuffixIndex``: the longest match of the recent context in a corpus, most frequent continuation.
- ``hybrid``: per row, a lookup's proposal where it matched enough context, a fallback's elsewhere.
"""

from minispec.proposers.ngram import NgramProposer, ngram_propose
from minispec.proposers.proposal import Proposal, Proposer, hybrid, one_hot_probs
from minispec.proposers.suffix import SuffixIndex

__all__ = ["NgramProposer", "Proposal", "Proposer", "SuffixIndex", "hybrid", "ngram_propose",
           "one_hot_probs"]
