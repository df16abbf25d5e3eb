"""Proposers: where draft tokens come from. Any of them keeps decoding exact (see proposal.py).

- ``DraftModelProposer``: a small model drafts, greedily or by sampling (draft_model.py).
- ``NgramProposer``: the request's own prompt and output (prompt lookup), tensor ops.
- ``ParallelDraftProposer``: the draft model drafts all K tokens in one forward, after mask
  tokens (parallel.py, PARD); the draft must be trained for it (`minispec train-parallel`).
  ``ParallelTreeProposer`` draws a tree from the same forward's q.
- ``TreeProposer``: the draft model drafts a tree, several candidates where it branches
  (tree.py); its round is minispec/tree_round.py.
- ``SuffixProposer``: the longest match of the recent context in a corpus (``SuffixIndex``), the
  most frequent continuation; looked up on the host, between rounds.
- ``FeatureHeadProposer``: a small head drafts from the target's own final states (EAGLE,
  feature_head.py): the first proposer to use the round's `follow_target` hook;
  ``FeatureHeadTreeProposer`` drafts a tree with it.

PROPOSERS is the one registry: a name (what `SpeculativeConfig.proposer` and `--proposer`
take) and how to build the proposer from what the decoder holds (`Held`). A new proposer is a
class with `propose` (or `host_propose`) in a file of its own, and one entry here.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, NamedTuple

from minispec.proposers.draft_model import DraftModelProposer
from minispec.proposers.feature_head import FeatureHeadProposer, FeatureHeadTreeProposer
from minispec.proposers.ngram import NgramProposer, ngram_propose
from minispec.proposers.parallel import ParallelDraftProposer, ParallelTreeProposer
from minispec.proposers.proposal import DraftSampling, HostProposer, Proposal, Proposer
from minispec.proposers.suffix import SuffixIndex, SuffixProposer
from minispec.proposers.tree import TreeProposer
from model.gpt import GPT
from model.head import FeatureHead


class Held(NamedTuple):
    """What a decoder holds, which proposers are built from."""

    target: GPT
    draft: GPT | None = None
    suffix_index: SuffixIndex | None = None
    head: FeatureHead | None = None


@dataclass(frozen=True, slots=True)
class Registered:
    """build(what the decoder holds) -> the proposer; `needs`: the field of Held it cannot
    do without ("draft", "suffix_index", "head"), None for nothing."""

    build: Callable[[Held], Proposer | HostProposer]
    needs: str | None = None


PROPOSERS: dict[str, Registered] = {
    "draft_model": Registered(lambda held: DraftModelProposer(held.draft), needs="draft"),
    "feature_head": Registered(
        lambda held: FeatureHeadProposer(held.target, held.head), needs="head"
    ),
    "head_tree": Registered(
        lambda held: FeatureHeadTreeProposer(held.target, held.head), needs="head"
    ),
    "ngram": Registered(lambda held: NgramProposer()),
    "parallel": Registered(lambda held: ParallelDraftProposer(held.draft), needs="draft"),
    "parallel_tree": Registered(lambda held: ParallelTreeProposer(held.draft), needs="draft"),
    "suffix": Registered(lambda held: SuffixProposer(held.suffix_index), needs="suffix_index"),
    "tree": Registered(lambda held: TreeProposer(held.draft), needs="draft"),
}

__all__ = [
    "PROPOSERS",
    "DraftModelProposer",
    "DraftSampling",
    "FeatureHeadProposer",
    "FeatureHeadTreeProposer",
    "Held",
    "HostProposer",
    "NgramProposer",
    "ParallelDraftProposer",
    "ParallelTreeProposer",
    "Proposal",
    "Proposer",
    "Registered",
    "SuffixIndex",
    "SuffixProposer",
    "TreeProposer",
    "ngram_propose",
]
