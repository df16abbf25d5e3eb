"""One round of speculative decoding (Leviathan et al. 2022, Algorithm 1) for a whole batch.

`speculative_round` reads top to bottom as the algorithm, one phase per line:
  noise    all of the round's randomness, fresh for every round         (sampling/noise.py)
  propose  up to K drafts x_1..x_L per row, and the q they came from   (minispec/proposers/)
  verify   the target's logits at [last, x_1..x_K], one (K+1)-token forward
  accept   the rejection sampler: n accepted drafts + 1 corrective or bonus token
  advance  each row moves by its own kept count; statistics accumulate  (minispec/state.py)
It is a pure function of tensors (the models' KV caches aside), so the decoder compiles it into
one graph per static shape: one call, one guard check, per round. What one round hands the next
is one LoopState, its first argument and first output. With K = 0 the propose phase
is absent and accept is plain sampling of the target's next token: the baseline.
"""

from __future__ import annotations

from typing import NamedTuple

import torch

from minispec.proposers import DraftSampling, Proposal, Proposer
from minispec.state import LoopState, advance, alpha_statistics
from model.gpt import GPT
from sampling import rejection_sample, sample
from sampling.constraints import RowConstraints, distribution
from sampling.noise import round_noise


class RoundSettings(NamedTuple):
    """What a call's rounds bake in besides K (each value its own graph)."""

    draft_sample_method: str  # "greedy", "probabilistic" or "auto" (per row by temperature)
    rejection_sample_method: str  # a rule of sampling/rules.py
    eos_token_id: int  # where a row stops


def verify(
    target: GPT, state: LoopState, proposal: Proposal | None, key_positions: torch.Tensor | None
) -> torch.Tensor:
    """The target's final states [B, K+1, C] at [last, x_1..x_K], in one forward that reads the
    cache slots key_positions (GPT.hidden); its head over them gives p_1..p_{K+1}.
    Placeholders past a short proposal go in as token 0: what follows them is never read."""
    tokens = state.tokens.gather(1, state.seq_len[:, None] - 1)  # the last token
    if proposal is not None:
        tokens = torch.cat([tokens, proposal.draft_token_ids.clamp(min=0)], 1)
    positions = state.seq_len[:, None] - 1 + torch.arange(tokens.shape[1], device=tokens.device)
    return target.hidden(tokens, positions, key_positions)


def acceptance_probability(
    target_logits: torch.Tensor, proposal: Proposal, constraints: RowConstraints
) -> torch.Tensor:
    """beta_i = sum_v min(p_i(v), q_i(v)) at each draft position [B, K] (Leviathan Def. 3.1);
    with a one-hot q it is p_i(x_i). Their mean over tested positions is alpha. Values past a
    row's last draft are meaningless and never counted."""
    ids = proposal.draft_token_ids.clamp(min=0)
    p = distribution(target_logits[:, : ids.shape[1]], constraints)
    if proposal.draft_probs is None:
        return p.gather(-1, ids[..., None]).squeeze(-1)
    return torch.minimum(p, proposal.draft_probs).sum(-1)


def speculative_round(
    target: GPT,
    proposer: Proposer | None,
    state: LoopState,
    constraints: RowConstraints,
    key_positions: torch.Tensor | None = None,
    *,
    num_speculative_tokens: int,
    settings: RoundSettings,
) -> tuple[LoopState, torch.Tensor]:
    """Algorithm 1 once for every row: the next LoopState and the snapshot the host reads.
    `key_positions` [S]: the cache slots the models' forwards read, S past every position the
    round writes (max(seq_len) + K); None, all of them."""
    k, vocab_size = num_speculative_tokens, target.config.vocab_size
    rule = settings.rejection_sample_method
    noise = round_noise(state.seeds, state.seq_len, k, vocab_size, rule)
    proposal = beta = None
    if k:
        sampling = DraftSampling(constraints, noise.draft, settings.draft_sample_method)
        proposal = proposer.propose(state, k, sampling, key_positions)
    hidden = verify(target, state, proposal, key_positions)
    target_logits = target.logits(hidden)
    # accept: the emitted tokens [B, K+1] (n accepted drafts, then the corrective or bonus
    # token, then placeholders) and n [B]; with no drafts, the target's next token is sampled.
    filters = constraints._asdict()
    if proposal is None:
        token = sample(
            target_logits[:, 0],
            **filters,
            exponentials=noise.target,
            compiled=False,
            check_values=False,
        ).token_ids
        emitted, num_accepted = token[:, None], torch.zeros_like(token)
    else:
        emitted, num_accepted = rejection_sample(
            target_logits,
            proposal.draft_token_ids,
            proposal.draft_probs,
            **filters,
            uniforms=noise.uniforms,
            exponentials=noise.target,
            method=rule,
            compiled=False,
            check_values=False,
            num_draft_tokens=proposal.num_draft_tokens,
        )
        beta = acceptance_probability(target_logits, proposal, constraints)
    num_drafts = None if proposal is None else proposal.num_draft_tokens
    alpha_stats = alpha_statistics(state, num_accepted, num_drafts, beta)
    before = state
    state, snapshot = advance(
        state, emitted, num_accepted, num_drafts, alpha_stats, settings.eos_token_id
    )
    if getattr(proposer, "reads_hidden", False):  # the hook: a proposer that follows the target
        followed = proposer.follow_target(before, hidden, emitted, num_accepted, key_positions)
        state = state._replace(proposer_state=followed)
    return state, snapshot
