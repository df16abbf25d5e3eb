"""The rules of a request's values, written once: K's range, the sampling ranges, the seed per
prompt, the draft methods, the tree proposer's limits, with its node count computed from the
numbers, never by building the tree, and a feature head's fit to its target.

SamplingParams and SpeculativeConfig (params.py) check their values by these rules, and
`minispec decode` checks its flags by them while parsing (minispec/commands/args.py's
`in_range`). Nothing here imports torch, so that a bad flag is one line before torch's second of
start-up; for the same reason the names of three registries whose modules import torch are
copied here, and tests/test_argument_errors.py holds each copy equal to its registry.
"""

from __future__ import annotations

import math
from typing import Callable

MAX_SPECULATIVE_TOKENS = 16  # beyond this alpha**K is negligible for any pair we ship
MAX_TREE_NODES = 64  # a verify of more tokens costs several target steps on any device we run
DEFAULT_TREE_BRANCHING = (2,)  # two candidates for the first token, a chain below each

# "greedy": every row drafts the draft model's argmax (a one-hot q), whatever its temperature.
# "probabilistic": every row samples from its own filtered q, which for a row at T = 0 is one-hot
# at the argmax, so such a row drafts greedily: the choice is made per row, inside the round.
# "auto" (the default) is "probabilistic" under the name of what it does: greedy drafts at
# T = 0, sampled ones at T > 0 (accepted far more often than argmax ones), in one graph for
# every mix of temperatures.
DRAFT_SAMPLE_METHODS = ("auto", "greedy", "probabilistic")

# Copies of the names of registries whose modules import torch (the module docstring):
# sampling/rules.py's REJECTION_SAMPLE_METHODS and TREE_SAMPLE_METHODS (its package imports
# torch) and minispec/proposers/'s PROPOSERS.
REJECTION_SAMPLE_METHOD_NAMES = ("standard", "block", "drafter_invariant", "naive")
TREE_SAMPLE_METHOD_NAMES = ("standard", "naive")
PROPOSER_NAMES = (
    "draft_model",
    "feature_head",
    "head_tree",
    "ngram",
    "parallel",
    "parallel_tree",
    "suffix",
    "tree",
)
# The proposers that draft a tree (minispec/tree_round.py's round): the draft model's, the head's
TREE_PROPOSERS = ("tree", "head_tree", "parallel_tree")
# The proposers that draft all K tokens in one forward: their default draft is the parallel one
PARALLEL_PROPOSERS = ("parallel", "parallel_tree")
# The proposers that draft with a feature head (PROPOSERS' needs == "head")
HEAD_PROPOSERS = ("feature_head", "head_tree")

# name -> (the rule in words, whether a number keeps it; a NaN keeps none)
RANGES: dict[str, tuple[str, Callable[[float], bool]]] = {
    "num_speculative_tokens": (
        f"'auto' or an int in [0, {MAX_SPECULATIVE_TOKENS}]",
        lambda k: 0 <= k <= MAX_SPECULATIVE_TOKENS,
    ),
    "temperature": ("finite and >= 0 (0 means greedy)", lambda t: 0 <= t < math.inf),
    "top_k": ("in [0, 2**63) (0 means off)", lambda k: 0 <= k < 2**63),
    "top_p": ("in (0, 1] (1 means off)", lambda p: 0 < p <= 1),
    "seed": ("in [0, 2**32)", lambda s: 0 <= s < 2**32),
    "max_new_tokens": (">= 1", lambda n: n >= 1),
}


def check_range(name: str, value: float) -> None:
    """ValueError naming `name` unless `value` keeps its rule in RANGES (its type is the
    caller's to check)."""
    rule, keeps = RANGES[name]
    if not keeps(value):
        raise ValueError(f"{name} must be {rule}, got {value}")


def check_seed_count(seed: int, count: int) -> None:
    """ValueError unless the seeds of `count` requests, seed + i for request i, all stay below
    2**32 (the seed itself is RANGES' to check)."""
    if seed + count > 2**32:
        raise ValueError(
            f"seed must be in [0, 2**32 - {count}] for {count} prompts (request i uses "
            f"seed + i), got {seed}"
        )


def head_problem(width: int, context: int, target_width: int, target_context: int) -> str | None:
    """Why a feature head that reads states of `width` and holds `context` tokens cannot draft
    for a target of `target_width` and `target_context`, or None: it reads the target's states,
    and a round reads as many cache slots in the head as in the target."""
    if width != target_width:
        return f"reads states of width {width}, the target's are {target_width}"
    if context < target_context:
        return (
            f"has a context of {context} tokens, shorter than the target's {target_context}: "
            f"train one on this target (minispec train-head)"
        )
    return None


def tree_nodes(branching: tuple[int, ...], depth: int, bound: int) -> int:
    """The drafted nodes of a tree `depth` deep whose first depths branch as `branching` and the
    rest as a chain, from the numbers alone: the count stops as soon as it passes `bound`, so a
    result above `bound` means "too many", and a tree of 64**5 or 2**70 nodes costs a few
    multiplications, not its memory."""
    nodes, width = 0, 1
    for d in range(depth):
        width *= branching[d] if d < len(branching) else 1
        nodes += width
        if nodes > bound:
            break
    return nodes


def check_tree(num_speculative_tokens: int | str, rejection_sample_method: str, branching) -> None:
    """The tree proposers' rules, ValueError naming the argument: a fixed depth K, a rule that
    verifies trees, at least one candidate per node, a branching no deeper than K, and at most
    MAX_TREE_NODES nodes, counted before any tree is built. The types are the caller's to check
    (K an int or "auto", the branching a tuple of ints)."""
    k = num_speculative_tokens
    if k == "auto":
        raise ValueError("a tree proposer needs a fixed num_speculative_tokens (its depth)")
    if rejection_sample_method not in TREE_SAMPLE_METHOD_NAMES:
        raise ValueError(
            f"a tree proposer verifies with rejection_sample_method "
            f"{' or '.join(map(repr, TREE_SAMPLE_METHOD_NAMES))}, not {rejection_sample_method!r}"
        )
    if not branching or min(branching) < 1:
        raise ValueError(f"tree_branching must be a non-empty tuple of ints >= 1, got {branching}")
    if k and len(branching) > k:
        raise ValueError(f"tree_branching {branching} is deeper than the tree's depth K = {k}")
    if tree_nodes(branching, k, MAX_TREE_NODES) > MAX_TREE_NODES:
        raise ValueError(
            f"tree_branching {branching} at K = {k} has more than {MAX_TREE_NODES} nodes, "
            f"the most a tree may have"
        )
