"""One round of tree speculation: the round of minispec/round.py with a tree of drafts in place of
a chain (chosen by `--proposer tree`; the chain's round does not change for it).

  noise    one draft row, one uniform per node and one target row        (sampling/noise.py)
  propose  the draft model's tree, one draft step per depth      (minispec/proposers/tree.py;
           the parallel drafter's in one forward, minispec/proposers/parallel.py)
  verify   the target's logits at the root and at every node, in one (N+1)-token forward,
           each node attending to the row's earlier tokens and its own ancestors
  accept   the tree rule: the accepted path, then a corrective or bonus token (sampling/tree.py)
  move     both caches copy the accepted path's keys and values to the slots of its positions
  advance  as a chain round: each row moves by its kept count             (minispec/state.py)

K is the tree's depth (the most drafts a round can accept) and the tree's shape is
SpeculativeConfig.tree_branching, padded with 1s to depth K (SpeculativeConfig.tree). The round
keeps the chain round's signature, so the loop and the compile back ends take it unchanged.
"""

from __future__ import annotations

import torch

from minispec.proposers import (
    DraftSampling,
    FeatureHeadTreeProposer,
    ParallelTreeProposer,
    TreeProposer,
)
from minispec.proposers.tree import tree_layout
from minispec.round import RoundSettings
from minispec.state import LoopState, advance, alpha_statistics
from model.gpt import GPT
from sampling.constraints import RowConstraints, distribution
from sampling.noise import round_noise
from sampling.tree import TreeOutput, TreeShape, tree_rejection_sample, tree_shape


def move_accepted_path(
    models: list[GPT], state: LoopState, tree: TreeShape, output: TreeOutput
) -> None:
    """Copy the accepted nodes' cache entries, in slots seq_len - 1 + node, to the slots of
    their positions, seq_len .. seq_len + n - 1. Past n the copies land beyond the row's new
    last position, where nothing reads them before the row writes them again."""
    source = state.seq_len[:, None] - 1 + output.path
    destination = state.seq_len[:, None] + torch.arange(tree.max_depth, device=source.device)
    for model in models:
        model.move_cache(source, destination)


def path_acceptance(
    target_logits: torch.Tensor,
    draft_probs: torch.Tensor | None,
    draft_token_ids: torch.Tensor,
    tree: TreeShape,
    output: TreeOutput,
    constraints: RowConstraints,
) -> torch.Tensor:
    """beta [B, D] along the accepted path: at depth d, sum_v min(p, q) of the path node's
    first child (Leviathan Def. 3.1, as the chain round measures it), so that alpha keeps its
    meaning, a property of the pair. Past the path's last node: that node's, never counted."""
    depth = torch.arange(tree.max_depth, device=output.path.device)
    parents = torch.cat([torch.zeros_like(output.path[:, :1]), output.path[:, :-1]], 1)
    parents = torch.where(depth <= output.num_accepted[:, None], parents, 0)  # [B, D]
    first_child = [(tree.children(j) or (0,))[0] for j in range(tree.num_nodes + 1)]
    first_draft = torch.tensor(first_child, device=parents.device)[parents] - 1  # its column
    vocab = target_logits.shape[-1]
    p = distribution(target_logits.gather(1, parents[..., None].expand(-1, -1, vocab)), constraints)
    if draft_probs is None:
        x = draft_token_ids.gather(1, first_draft)
        return p.gather(-1, x[..., None]).squeeze(-1)
    q = draft_probs.gather(1, first_draft[..., None].expand(-1, -1, vocab))
    return torch.minimum(p, q).sum(-1)


def tree_round(
    target: GPT,
    proposer: TreeProposer | FeatureHeadTreeProposer | ParallelTreeProposer,
    state: LoopState,
    constraints: RowConstraints,
    key_positions: torch.Tensor | None = None,
    *,
    num_speculative_tokens: int,
    settings: RoundSettings,
    tree_branching: tuple[int, ...],
) -> tuple[LoopState, torch.Tensor]:
    """The tree's round for every row (module docstring): the next LoopState and the
    snapshot the host reads, laid out as a chain round's with K = the tree's depth
    num_speculative_tokens = len(tree_branching) (SpeculativeConfig.tree, padded to K)."""
    vocab_size = target.config.vocab_size
    tree = tree_shape(tree_branching)
    noise = round_noise(state.seeds, state.seq_len, tree.num_nodes, vocab_size)
    sampling = DraftSampling(constraints, noise.draft, settings.draft_sample_method)
    proposal = proposer.propose(state, tree, sampling, key_positions)
    last = state.tokens.gather(1, state.seq_len[:, None] - 1)
    tokens = torch.cat([last, proposal.draft_token_ids], 1)
    nodes = list(range(tree.num_nodes + 1))
    positions, layout = tree_layout(
        state.seq_len, tree, nodes, target.config.max_seq_len, key_positions
    )
    hidden = target.hidden(tokens, positions, layout)
    target_logits = target.logits(hidden)
    output = tree_rejection_sample(
        target_logits,
        proposal.draft_token_ids,
        proposal.draft_probs,
        tree,
        **constraints._asdict(),
        uniforms=noise.uniforms,
        exponentials=noise.target,
        method=settings.rejection_sample_method,
        compiled=False,
        check_values=False,
    )
    # The draft model's cache holds the tree too; a head's is rewritten by follow_target, and
    # a parallel drafter's re-feeds the kept tokens itself.
    drafter = [proposer.model] if isinstance(proposer, TreeProposer) else []
    move_accepted_path([target, *drafter], state, tree, output)
    beta = path_acceptance(
        target_logits, proposal.draft_probs, proposal.draft_token_ids, tree, output, constraints
    )
    depth = torch.full_like(state.seq_len, tree.max_depth)
    alpha_stats = alpha_statistics(state, output.num_accepted, depth, beta)
    before = state
    state, snapshot = advance(
        state, output.token_ids, output.num_accepted, depth, alpha_stats, settings.eos_token_id
    )
    if getattr(proposer, "reads_hidden", False):  # the round's hook, along the accepted path
        path = torch.cat([torch.zeros_like(output.path[:, :1]), output.path], 1)  # root first
        states = hidden.gather(1, path[..., None].expand(-1, -1, hidden.shape[-1]))
        followed = proposer.follow_target(
            before, states, output.token_ids, output.num_accepted, key_positions
        )
        state = state._replace(proposer_state=followed)
    return state, snapshot
