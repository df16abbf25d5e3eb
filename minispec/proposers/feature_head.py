"""The feature head as a proposer: drafts from the target's own final states (EAGLE).

What the round carries for it (LoopState.proposer_state) is g [B, C], the head's guess at the
target's state at each row's last token, whose logits under the target's head give x_1. Each
further draft is one head step over (g, x_j), at the row's next position. After the target's
verify, `follow_target` rewrites the head's cache over the verified positions from the target's
true states and the kept tokens, in one [B, K+1] step; its guess after the last kept token is
the next round's g. So the head's cache holds true-state entries for every kept token, and
guessed ones only within a round (model/head.py says what the head computes).

A round at K = 0 (under -k auto) runs no head step: it keeps the target's state in the head's
`target_states`, and `catch_up`, before the next round that drafts, runs one step over every
position it missed: a head step costs about a tenth of a K = 0 round at B = 64, where auto runs
K = 0 most of the time (docs/head.md).

Drafts are drawn as the draft model's are (`draw`): q is exactly the filtered distribution each
draft came from, so every rejection rule stays exact.
"""

from __future__ import annotations

import torch

from minispec.proposers.draft_model import draft_chain, last_positions
from minispec.proposers.proposal import DraftSampling, Proposal
from minispec.proposers.tree import draft_tree, tree_layout
from minispec.state import LoopState
from model.gpt import GPT
from model.head import FeatureHead
from sampling.tree import TreeShape


class FeatureHeadProposer:
    reads_hidden = True  # the round hands follow_target the target's final states

    def __init__(self, target: GPT, head: FeatureHead) -> None:
        self.target, self.head = target, head

    def prefill(self, hidden: torch.Tensor, tokens: torch.Tensor, lengths: torch.Tensor):
        """The head's cache over each prompt from the target's states hidden [B, W, C] at
        positions 0..W-1 (tokens [B, W+1]: the prompts, padded; every prompt has at least 2
        tokens, SpeculativeDecoder.generate checks), and the first g: the guess after each
        row's second-to-last token."""
        b, w, c = hidden.shape
        positions = torch.arange(w, device=tokens.device).expand(b, w)
        guesses = self.head(self.target, hidden, tokens[:, 1 : w + 1], positions)
        return guesses.gather(1, (lengths - 2)[:, None, None].expand(-1, 1, c))[:, 0]

    def propose(
        self,
        state: LoopState,
        num_speculative_tokens: int,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        """x_j ~ q_j for j = 1..K from the target's head over the head's guesses."""
        g = state.proposer_state  # the latest guess, which each step replaces

        def step(x: torch.Tensor, j: int) -> torch.Tensor:
            nonlocal g
            positions = (state.seq_len - 1 + j)[:, None]
            g = self.head(self.target, g[:, None], x[:, None], positions, key_positions)[:, 0]
            return self.target.logits(g)

        logits = self.target.logits(g)
        return draft_chain(logits, num_speculative_tokens, sampling, step, state.seq_len)

    def follow_target(
        self,
        state: LoopState,
        hidden: torch.Tensor,
        emitted: torch.Tensor,
        num_accepted: torch.Tensor,
        key_positions: torch.Tensor | None,
    ) -> torch.Tensor:
        """The next round's g [B, C]: one head step over the verified positions (the target's
        states hidden [B, K+1, C] there, the emitted tokens [B, K+1] after them), read after
        the n-th, the last kept token's predecessor. Past it the step writes entries no
        later query sees before they are rewritten. At K = 0 (one verified position): the
        state is kept for catch_up, and g stays as it was."""
        width = hidden.shape[1]
        if width == 1:
            rows = torch.arange(hidden.shape[0], device=hidden.device)
            self.head.target_states[rows, state.seq_len - 1] = hidden[:, 0]
            return state.proposer_state
        positions = state.seq_len[:, None] - 1 + torch.arange(width, device=hidden.device)
        tokens = emitted.clamp(min=0)  # placeholders past the kept ones: any id will do
        guesses = self.head(self.target, hidden, tokens, positions, key_positions)
        index = num_accepted[:, None, None].expand(-1, 1, guesses.shape[-1])
        return guesses.gather(1, index)[:, 0]

    def catch_up(
        self, state: LoopState, tokens_behind: int, key_positions: torch.Tensor | None
    ) -> LoopState:
        """After tokens_behind rounds at K = 0: one head step over their positions (each
        row's last tokens_behind but one, from the states follow_target kept, with the tokens
        after them), which writes the entries those rounds skipped; its last guess is g."""
        # A row that stopped during those rounds reads earlier positions: its output is unused.
        positions = last_positions(state.seq_len - 1, tokens_behind)
        rows = torch.arange(positions.shape[0], device=positions.device)[:, None]
        states = self.head.target_states[rows, positions]
        tokens = state.tokens.gather(1, positions + 1)
        guesses = self.head(self.target, states, tokens, positions, key_positions)
        # With follow_target's strides: the compiled rounds guard on them (and .contiguous()
        # keeps a one-row view's)
        g = guesses[:, -1].clone(memory_format=torch.contiguous_format)
        return state._replace(proposer_state=g)


class FeatureHeadTreeProposer(FeatureHeadProposer):
    """The head drafting a tree (`--proposer head_tree`): the tree proposer's shape and draws
    (minispec/proposers/tree.py: siblings without replacement, each with its own exact q), the
    root's children from g, then one head step per depth over all of its nodes, each from its
    parent's guess. The head's cache takes the target's tree layout one slot earlier: its root
    entry is the one follow_target wrote at the row's second-to-last position."""

    def propose(
        self,
        state: LoopState,
        tree: TreeShape,
        sampling: DraftSampling,
        key_positions: torch.Tensor | None = None,
    ) -> Proposal:
        """The tree's N drafts [B, N] in node order and their q_i (draft_tree)."""
        parents = state.proposer_state[:, None]  # the root's guess, then each depth's

        def step(x: torch.Tensor, nodes: list[int], width: int) -> torch.Tensor:
            nonlocal parents
            size = self.head.config.max_seq_len
            positions, layout = tree_layout(state.seq_len - 1, tree, nodes, size, key_positions)
            guesses = parents.repeat_interleave(width, 1)  # each node reads its parent's
            parents = self.head(self.target, guesses, x, positions, layout)
            return self.target.logits(parents)

        return draft_tree(self.target.logits(parents), tree, sampling, step, state.seq_len)
