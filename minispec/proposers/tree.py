"""The draft model as a tree proposer: at each depth every node gets b_d candidate children
(sampling/tree.py's TreeShape, e.g. 2 at the first depth and a chain below), all drafted in one
draft-model step per depth, and all verified in one target forward (minispec/tree_round.py).

Candidates of one family are drawn without replacement from the draft's q (the exponential
race's top b: keys q(x) / E(x) with one Exp(1) row per family, whose order is that of
successive draws without replacement), so q_i, the distribution the i-th sibling was drawn
from, is q with the earlier siblings' tokens removed and renormalised: what the tree rule
needs (the q contract of proposal.py, per sibling). A row at temperature 0, and every row under
"greedy" drafts, takes the draft's top b tokens instead, each with a one-hot q. A family of one
is drawn exactly as the chain proposer draws, so a tree with branching (1, 1, ...) is the chain.

The cache layout (`tree_layout`: positions and a model/gpt.py CacheLayout): node j of a round
that starts at seq_len (the root, node 0, being the row's last token at position seq_len - 1)
is written to slot seq_len - 1 + j and rotated by its position seq_len - 1 + depth(j); it
attends to the row's earlier tokens and to its own ancestors (`tree_visibility`). After the
round the accepted path is moved to the slots of its positions (tree_round.py), so the cache
again holds one sequence.
"""

from __future__ import annotations

from typing import Callable

import torch

from minispec.proposers.draft_model import first_step
from minispec.proposers.proposal import DraftSampling, Proposal
from minispec.state import LoopState
from model.gpt import GPT, CacheLayout
from sampling.constraints import distribution
from sampling.noise import race
from sampling.tree import TreeShape


def tree_visibility(
    seq_len: torch.Tensor, tree: TreeShape, nodes: list[int], num_slots: int
) -> torch.Tensor:
    """[B, len(nodes), num_slots] bool: the cache slots each of `nodes` attends to, in the
    layout of the module docstring: every slot before the root's, and its ancestors' (itself
    and the root included)."""
    ancestors = tree.ancestors(seq_len.device)[nodes]  # [T, N+1]
    relative = torch.arange(num_slots, device=seq_len.device) - (seq_len[:, None] - 1)  # [B, S]
    in_tree = (relative >= 0) & (relative <= tree.num_nodes)
    on_path = ancestors[:, relative.clamp(0, tree.num_nodes)].permute(1, 0, 2)  # [B, T, S]
    return (relative < 0)[:, None] | (in_tree[:, None] & on_path)


def tree_layout(
    seq_len: torch.Tensor,
    tree: TreeShape,
    nodes: list[int],
    max_seq_len: int,
    key_positions: torch.Tensor | None,
) -> tuple[torch.Tensor, CacheLayout]:
    """Where tree nodes `nodes` sit in a forward (the module docstring): their positions [B, T]
    and their CacheLayout (the slots they write, the slots each sees), the arguments of
    GPT.hidden and FeatureHead.forward; key_positions: the slots read (all max_seq_len if None)."""
    device = seq_len.device
    node = torch.tensor(nodes, device=device)
    depth = torch.tensor([tree.depth[j] for j in nodes], device=device)
    num_slots = max_seq_len if key_positions is None else key_positions.shape[0]
    slots = seq_len[:, None] - 1 + node
    visible = tree_visibility(seq_len, tree, nodes, num_slots)
    return seq_len[:, None] - 1 + depth, CacheLayout(slots, visible)


def tree_forward(
    model: GPT,
    tokens: torch.Tensor,
    seq_len: torch.Tensor,
    tree: TreeShape,
    nodes: list[int],
    key_positions: torch.Tensor | None,
) -> torch.Tensor:
    """The logits [B, T, V] of tree nodes `nodes` (tokens [B, T]) in one forward of `model`,
    reading the cache slots key_positions (all of them if None)."""
    positions, layout = tree_layout(seq_len, tree, nodes, model.config.max_seq_len, key_positions)
    return model(tokens, positions, layout)


class TreeProposer:
    """Drafts a TreeShape per row: one draft step per depth, every node of the depth at once.
    The first step feeds the row's last 2 tokens, as the chain proposer's does."""

    def __init__(self, model: GPT) -> None:
        self.model = model

    def propose(
        self,
        state: LoopState,
        tree: TreeShape,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        """The tree's N drafts [B, N] in node order, and their q_i (draft_tree)."""
        seq_len = state.seq_len

        def step(x: torch.Tensor, nodes: list[int], width: int) -> torch.Tensor:
            return tree_forward(self.model, x, seq_len, tree, nodes, key_positions)

        root = first_step(self.model, state, key_positions)[:, None]  # [B, 1, V]
        return draft_tree(root, tree, sampling, step, seq_len)

    @staticmethod
    def children(
        logits: torch.Tensor, width: int, noise: torch.Tensor, sampling: DraftSampling
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`width` children for each parent of logits [B, P, V], in node order [B, P * width],
        with their q_i [B, P * width, V] (None under greedy drafts); noise [B, P, V] holds one
        Exp(1) row per family."""
        if sampling.method == "greedy":  # a family of one: the argmax, as the chain's
            top = logits.argmax(-1, keepdim=True) if width == 1 else logits.topk(width, -1).indices
            return top.flatten(1), None
        q = distribution(logits, sampling.constraints)  # [B, P, V]; one-hot at T = 0
        if width == 1:  # one draw from q: the chain proposer's
            return race(q, noise), q
        # The race's top `width` keys q(x) / E(x) are `width` draws without replacement; a row
        # at temperature 0 takes the draft's top tokens, each with a one-hot q.
        greedy = (sampling.constraints.temperature == 0)[:, None, None]
        keys = torch.where(greedy, logits, torch.where(q > 0, q / noise, -1.0))
        x = keys.topk(width, -1).indices  # [B, P, width], in draw order
        vocab = torch.arange(logits.shape[-1], device=logits.device)
        drawn = x[..., None] == vocab  # [B, P, width, V]: one-hot rows
        earlier = drawn.cumsum(2) > drawn.long()  # drawn by an earlier sibling
        remaining = torch.where(earlier, 0.0, q[:, :, None])
        mass = remaining.sum(-1, keepdim=True)
        # A family wider than q's support runs out of mass: q_i = 0, a draft never accepted.
        q_i = torch.where(mass > 0, remaining / mass.clamp(min=1e-30), 0.0)
        q_i = torch.where(greedy[..., None], drawn.float(), q_i)
        return x.flatten(1), q_i.flatten(1, 2)


def draft_tree(
    logits: torch.Tensor,
    tree: TreeShape,
    sampling: DraftSampling,
    step: Callable[[torch.Tensor, list[int], int], torch.Tensor],
    seq_len: torch.Tensor,
) -> Proposal:
    """The tree's N drafts [B, N] in node order, and their q_i [B, N, V] (None under greedy
    drafts): the root's children from logits [B, 1, V], each deeper depth's from
    step(x, nodes, width), the logits after the depth above (nodes `nodes`, tokens x, `width`
    children a parent). sampling.noise [B, N, V] holds one Exp(1) row per node, of which a
    family reads its first child's."""
    ids, probs = [], []
    for depth, width in enumerate(tree.branching, start=1):
        first = 1 + sum(t.shape[1] for t in ids)  # the depth's first node id
        parents = logits.shape[1]
        # One Exp(1) row per family: its first child's (node ids count from 1).
        rows = sampling.noise[:, first - 1 : first - 1 + parents * width]
        noise = rows.unflatten(1, (parents, width))[:, :, 0]
        x, q = TreeProposer.children(logits, width, noise, sampling)  # [B, parents * width]
        ids.append(x)
        probs.append(q)
        if depth < len(tree.branching):
            logits = step(x, list(range(first, first + x.shape[1])), width)
    draft_probs = None if sampling.method == "greedy" else torch.cat(probs, 1)
    return Proposal(torch.cat(ids, 1), torch.full_like(seq_len, tree.num_nodes), draft_probs)
