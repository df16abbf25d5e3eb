"""A parallel drafter: the draft model drafts all K tokens in one forward (PARD, An et al. 2025).

The forward reads each row's last K + 1 tokens and K - 1 mask tokens after them
(model/tokenizer.py, MASK_TOKEN_ID). The last real token's output is q_1, the j-th mask's is
q_(j+1): K distributions from one pass, where the draft model's chain takes K passes. Each
x_i is drawn from exactly its q_i, which may ignore x_1..x_(i-1): the rejection rule asks only
that the q it is given is the one the draft came from (docs/extensions.md), so the output stays
the target's. The draft must have been trained for the masks (`minispec train-parallel`).

The cache: the masks' keys and values land in the slots of the positions they stand for, which
the round's kept tokens then hold. So every propose re-feeds the last K + 1 tokens, all a round
at K can keep, before the masks: no mask entry survives under a kept token. A round at a larger
K before, or rounds at K = 0, leave more than that unfed; `tokens_behind` tells the loop, and
`catch_up` (the draft model's) feeds them first.
"""

from __future__ import annotations

import torch

from minispec.proposers.draft_model import DraftModelProposer, draw, last_positions
from minispec.proposers.proposal import DraftSampling, Proposal
from minispec.proposers.tree import draft_tree
from minispec.state import LoopState
from model.gpt import GPT
from model.tokenizer import MASK_TOKEN_ID
from sampling.tree import TreeShape


class ParallelDraftProposer(DraftModelProposer):
    """The draft model's proposer with one forward for all K drafts; its catch_up is inherited."""

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        """x_i ~ q_i for i = 1..K from one draft forward over [last K + 1 tokens, K - 1 masks]."""
        k = num_speculative_tokens
        logits = parallel_logits(self.model, state, k, key_positions)
        B, _, V = logits.shape
        if sampling.method == "greedy":  # every row one-hot: draft_probs stays None
            ids, probs = logits.argmax(-1), None
        else:  # one draw over B K rows, each under its request's constraints
            per_draft = type(sampling.constraints)(
                *(None if c is None else c.repeat_interleave(k) for c in sampling.constraints)
            )
            ids, probs = draw(logits.reshape(B * k, V), per_draft, sampling.noise.reshape(B * k, V))
            ids, probs = ids.view(B, k), probs.view(B, k, V)
        return Proposal(ids, torch.full_like(state.seq_len, k), probs)

    @staticmethod
    def tokens_behind(behind: int, last_k: int, k: int) -> int:
        """catch_up's tokens_behind before a round at K (it feeds each row's last that + 2)."""
        # A round at last_k leaves its up to last_k + 1 kept tokens unfed, K = 0 rounds since
        # add `behind`, and this round's propose feeds the last K + 1 itself.
        unfed = (last_k + 1 if last_k else 0) + behind
        return unfed - 2 if unfed > k + 1 else 0


class ParallelTreeProposer(ParallelDraftProposer):
    """A tree from the same one forward (`--proposer parallel_tree`): every node at depth d
    has its children drawn from q_(d+1), whatever its own token, by the tree proposer's draws
    (minispec/proposers/tree.py: siblings without replacement, each with its exact q). The
    draft's cache never holds the tree: no path to move after the round."""

    def propose(
        self,
        state: LoopState,
        tree: TreeShape,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        """The tree's N drafts [B, N] in node order and their q_i (draft_tree)."""
        logits = parallel_logits(self.model, state, tree.max_depth, key_positions)

        def step(x: torch.Tensor, nodes: list[int], width: int) -> torch.Tensor:
            below = tree.depth[nodes[0]]  # the depth below x's, counted from 0
            return logits[:, below : below + 1].expand(-1, len(nodes), -1)

        return draft_tree(logits[:, :1], tree, sampling, step, state.seq_len)


def parallel_logits(
    model: GPT, state: LoopState, k: int, key_positions: torch.Tensor | None
) -> torch.Tensor:
    """The draft's logits [B, K, V] for x_1..x_K: one forward over each row's last K + 1 tokens
    and K - 1 masks, read at the last real token and at the masks."""
    real = last_positions(state.seq_len, k + 1)
    masks = state.seq_len[:, None] + torch.arange(k - 1, device=real.device)
    tokens = torch.cat([state.tokens.gather(1, real), torch.full_like(masks, MASK_TOKEN_ID)], 1)
    return model(tokens, torch.cat([real, masks], 1), key_positions)[:, k:]
