"""What a round reads and writes: the batch's tokens and positions, and its statistics.

Every field is a [B, ...] tensor on the device, so a round is a pure function from one LoopState
to the next and compiles as one graph. Statistics accumulate here too and are read once, after
the last round.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import torch

from minispec.origins import ACCEPTED, BONUS, CORRECTIVE, TARGET

if TYPE_CHECKING:
    from minispec.stats import DecodeStats

# The snapshot's columns after a row's K + 1 token ids (see advance).
COUNT, NUM_ACCEPTED, NUM_DRAFTS, DONE = range(1, 5)


class LoopState(NamedTuple):
    """Everything a round reads and writes, as [B, ...] tensors. Build it by keywords."""

    tokens: torch.Tensor  # [B, S] prompt then generated ids
    seq_len: torch.Tensor  # [B] tokens so far; the last one is not yet in the target's cache
    generated: torch.Tensor  # [B]
    max_new: torch.Tensor  # [B]
    done: torch.Tensor  # [B] bool
    seeds: torch.Tensor  # [B]
    # statistics, accumulated on the device and read once at the end
    rounds: torch.Tensor  # [B] rounds in which the row was active
    drafted: torch.Tensor  # [B] drafts proposed (a short proposal counts its own length)
    accepted: torch.Tensor  # [B] accepted drafts
    position_accepted: torch.Tensor  # [B, K] rounds whose first i+1 drafts were all accepted
    alpha_sum: torch.Tensor  # [B] float64: sum of beta over verified positions
    alpha_count: torch.Tensor  # [B] verified positions
    # what a proposer carries from round to round (the feature head's guessed state), else ()
    proposer_state: torch.Tensor | tuple[()] = ()

    @classmethod
    def start(
        cls,
        tokens: torch.Tensor,
        prompt_lengths: list[int],
        max_new_tokens: list[int],
        seeds: list[int],
        num_speculative_tokens: int,
    ) -> LoopState:
        """The state before the first round: prompts in place, counters at zero.
        num_speculative_tokens is the widest K any round will use."""
        b, device = tokens.shape[0], tokens.device

        def zeros(*shape: int, dtype: torch.dtype = torch.long) -> torch.Tensor:
            return torch.zeros(b, *shape, dtype=dtype, device=device)

        def ints(values: list[int]) -> torch.Tensor:
            return torch.tensor(values, dtype=torch.long, device=device)

        return cls(
            tokens=tokens,
            seq_len=ints(prompt_lengths),
            generated=zeros(),
            max_new=ints(max_new_tokens),
            done=zeros(dtype=torch.bool),
            seeds=ints(seeds),
            rounds=zeros(),
            drafted=zeros(),
            accepted=zeros(),
            position_accepted=zeros(num_speculative_tokens),
            alpha_sum=zeros(dtype=torch.float64),
            alpha_count=zeros(),
        )


class AlphaStatistics(NamedTuple):
    """What one round adds to each active row's alpha (zeros for done rows): alpha is the sum
    of beta over the tested positions, over their count."""

    tested: torch.Tensor  # [B] positions the sampler tested: the first n + 1, at most L
    beta_sum: torch.Tensor  # [B] float64: sum of beta over them


def alpha_statistics(
    state: LoopState,
    num_accepted: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    beta: torch.Tensor | None,
) -> AlphaStatistics:
    """The tested positions of a round with L = num_draft_tokens drafts per row: the first
    n + 1 of them, and only n when all L passed (nothing tested the end of a proposal); and
    beta summed over them."""
    active = ~state.done
    if num_draft_tokens is None:  # K = 0
        zero = torch.zeros_like(num_accepted)
        return AlphaStatistics(zero, zero.double())
    tested = torch.where(active, torch.minimum(num_accepted + 1, num_draft_tokens), 0)
    position = torch.arange(beta.shape[1], device=beta.device)
    beta_sum = torch.where(position < tested[:, None], beta, 0).sum(1).double()
    return AlphaStatistics(tested, beta_sum)


def emitted_count(
    state: LoopState, emitted: torch.Tensor, num_accepted: torch.Tensor, eos_token_id: int
) -> torch.Tensor:
    """How many of a row's n + 1 emitted tokens it keeps [B]: up to and including its first
    EOS, within its max_new_tokens, none once it is done."""
    width = emitted.shape[1]
    j = torch.arange(width, device=emitted.device)
    count = num_accepted + 1
    is_eos = (emitted == eos_token_id) & (j < count[:, None])
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), width)
    return torch.minimum(torch.minimum(count, first_eos + 1), remaining_tokens(state))


def remaining_tokens(state: LoopState) -> torch.Tensor:
    """The tokens each row may still keep [B]: its max_new_tokens left, 0 once it is done."""
    return torch.where(state.done, 0, state.max_new - state.generated)


def advance(
    state: LoopState,
    emitted: torch.Tensor,
    num_accepted: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    alpha_stats: AlphaStatistics,
    eos_token_id: int,
) -> tuple[LoopState, torch.Tensor]:
    """Append each row's kept tokens and move it forward by their count (Algorithm 1's
    "return prefix + [x_1..x_n, t]"); the KV caches roll back by position alone.

    Returns the new state and the round's snapshot [B, K+5]: emitted ids (-1 past the count),
    then the columns COUNT, NUM_ACCEPTED (n), NUM_DRAFTS (L) and DONE. That snapshot is the one
    thing the host reads (Snapshot.read).
    """
    count = emitted_count(state, emitted, num_accepted, eos_token_id)
    j = torch.arange(emitted.shape[1], device=emitted.device)
    keep = j < count[:, None]
    index = (state.seq_len[:, None] + j).clamp(max=state.tokens.shape[1] - 1)
    written = torch.where(keep, emitted, state.tokens.gather(1, index))
    generated = state.generated + count
    done = state.done | ((emitted == eos_token_id) & keep).any(1) | (generated >= state.max_new)
    drafts = torch.zeros_like(count) if num_draft_tokens is None else num_draft_tokens
    new = accumulate_stats(state, num_accepted, drafts, alpha_stats)._replace(
        tokens=state.tokens.scatter(1, index, written),
        seq_len=state.seq_len + count,
        generated=generated,
        done=done,
    )
    snapshot = torch.cat(
        [
            torch.where(keep, emitted, -1),
            count[:, None],
            num_accepted[:, None],
            drafts[:, None],
            done[:, None],
        ],
        1,
    )
    return new, snapshot


def accumulate_stats(
    state: LoopState,
    num_accepted: torch.Tensor,
    num_draft_tokens: torch.Tensor,
    alpha_stats: AlphaStatistics,
) -> LoopState:
    """Count the round for each active row: its drafts, the accepted ones, the accepted prefix
    per position, and beta at the positions the sampler tested."""
    k = state.position_accepted.shape[1]
    active = ~state.done
    position = torch.arange(k, device=num_accepted.device)
    prefix = (position < num_accepted[:, None]) & active[:, None]
    return state._replace(
        rounds=state.rounds + active.long(),
        drafted=state.drafted + torch.where(active, num_draft_tokens, 0),
        accepted=state.accepted + torch.where(active, num_accepted, 0),
        position_accepted=state.position_accepted + prefix.long(),
        alpha_sum=state.alpha_sum + alpha_stats.beta_sum,
        alpha_count=state.alpha_count + alpha_stats.tested,
    )


class RowResult(NamedTuple):
    """What one round did for one row, as the host reads it."""

    token_ids: list[int]  # the tokens the row kept (none once it is done)
    num_accepted: int  # n
    num_drafts: int  # L: the drafts its proposal held
    done: bool

    @property
    def origins(self) -> list[str]:
        """Where each kept token came from (minispec/origins.py): the first n accepted drafts,
        then the corrective token, or the bonus one when all L passed; the target's alone in a
        round without drafts."""
        if self.num_drafts == 0:
            return [TARGET] * len(self.token_ids)
        last = BONUS if self.num_accepted == self.num_drafts else CORRECTIVE
        return [ACCEPTED if j < self.num_accepted else last for j in range(len(self.token_ids))]


class Snapshot(NamedTuple):
    """A round's snapshot on the host: one RowResult per row."""

    rows: list[RowResult]

    @classmethod
    def read(cls, snapshot: torch.Tensor, num_speculative_tokens: int) -> Snapshot:
        """The round's one device-to-host read, named."""
        k, values = num_speculative_tokens, snapshot.tolist()
        rows = [
            RowResult(
                row[: row[k + COUNT]],
                row[k + NUM_ACCEPTED],
                row[k + NUM_DRAFTS],
                bool(row[k + DONE]),
            )
            for row in values
        ]
        return cls(rows)

    @property
    def done(self) -> bool:
        """Every row is done."""
        return all(row.done for row in self.rows)


def collect(state: LoopState, stats: DecodeStats) -> None:
    """Copy the statistics into `stats`: one read, after the last round."""
    counters = [state.rounds, state.accepted, state.generated, state.alpha_count, state.drafted]
    sums = torch.stack([c.sum().double() for c in counters + [state.alpha_sum]])
    totals = torch.cat([sums, state.position_accepted.sum(0).double()]).tolist()
    stats.rounds, stats.accepted, stats.emitted, stats.alpha_count, stats.drafted = map(
        int, totals[:5]
    )
    stats.alpha_sum = totals[5]
    stats.position_accepted = [int(a) for a in totals[6:]]
