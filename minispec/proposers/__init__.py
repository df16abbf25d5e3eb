"""Proposers: where draft tokens come from. Any of them keeps decoding exact (see proposal.py).

- ``DraftModelProposer``: a small model drafts, greedily or by sampling (draft_model.py).
- ``NgramProposer``: the request's own prompt and output (prompt lookup), tensor ops.
- ``TreeProposer``: the draft model drafts a tree, several candidates where it branches
  (tree.py); its round is minispec/tree_round.py.
- ``SuffixProposer``: the longest match of the recent context in a corpus (``SuffixIndex``), the
  most frequent continuation; looked up on the host, between rounds.

PROPOSERS is the one registry: a name (what `SpeculativeConfig.proposer` and `--proposer`
take) and how to build the proposer from what the decoder holds. A new proposer is a class with
`propose` (or `host_propose`) in a file of its own, and one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from minispec.proposers.draft_model import DraftModelProposer
from minispec.proposers.ngram import NgramProposer, ngram_propose
from minispec.proposers.proposal import DraftSampling, HostProposer, Proposal, Proposer
from minispec.proposers.suffix import SuffixIndex, SuffixProposer
from minispec.proposers.tree import TreeProposer
from model.gpt import GPT


@dataclass(frozen=True, slots=True)
class Registered:
    """build(draft model, suffix index) -> the proposer; `needs`: what the decoder must hold
    for it ("draft", "suffix_index"), None for nothing."""

    build: Callable[[GPT | None, SuffixIndex | None], Proposer | HostProposer]
    needs: str | None = None


PROPOSERS: dict[str, Registered] = {
    "draft_model": Registered(lambda draft, index: DraftModelProposer(draft), needs="draft"),
    "ngram": Registered(lambda draft, index: NgramProposer()),
    "suffix": Registered(lambda draft, index: SuffixProposer(index), needs="suffix_index"),
    "tree": Registered(lambda draft, index: TreeProposer(draft), needs="draft"),
}

__all__ = [
    "PROPOSERS",
    "DraftModelProposer",
    "DraftSampling",
    "HostProposer",
    "NgramProposer",
    "Proposal",
    "Proposer",
    "Registered",
    "SuffixIndex",
    "SuffixProposer",
    "TreeProposer",
    "ngram_propose",
]
