"""The decode loop: prefill, then one compiled round per iteration until every row is done.

    generate = check -> prefill -> repeat { round (one compiled call) -> emit } -> collect

A round (minispec/round.py) is Algorithm 1 for the whole batch, K = 0 being the baseline. All
shapes are static: [B, 2] and [B, 1] draft steps and a [B, K+1] verify inside the round, a
padded prefill outside it. Finished rows keep computing, frozen in place, rather than shrinking
the batch. Python's whole per-round work is one call of the round, one device->host read of its
snapshot (which also decides stopping), and the streaming callback.
"""
from __future__ import annotations

import math
import time
from functools import partial
from typing import Callable, NamedTuple

import torch

from minispec.compiled import compile_fn
from minispec.params import SamplingParams, SpeculativeConfig, row_constraints
from minispec.round import DraftModelProposer, speculative_round
from minispec.state import LoopState
from minispec.stats import DecodeStats
from model.gpt import GPT
from model.tokenizer import EOS_TOKEN_ID

ACCEPTED, CORRECTIVE, BONUS, TARGET = "accepted", "corrective", "bonus", "target"
PREFILL_BUCKET = 64  # prompts are padded to a multiple of this, so prefill sees few shapes


class GenerationOutput(NamedTuple):
    token_ids: list[list[int]]  # generated ids per request (prompt excluded)
    origins: list[list[str]]  # per token: accepted, corrective, bonus, or target (K = 0)
    stats: DecodeStats


def origins_of(count: int, num_accepted: int, k: int) -> list[str]:
    """Where each of a row's `count` kept tokens came from, in a round that accepted n."""
    if k == 0:
        return [TARGET] * count
    last = BONUS if num_accepted == k else CORRECTIVE
    return [ACCEPTED if j < num_accepted else last for j in range(count)]


class SpeculativeDecoder:
    """A target (and optionally a draft) with a compiled round, reusable across calls."""

    def __init__(self, target: GPT, draft: GPT | None = None, *, compile: bool = True,
                 eos_token_id: int | None = EOS_TOKEN_ID) -> None:
        """`eos_token_id`: the target's end-of-sequence id, where a row stops; None if it has
        none (rows then stop at max_new_tokens only, as they do for an id past the vocabulary:
        the byte tokenizer's default with a tiny test vocabulary)."""
        if eos_token_id is not None and (isinstance(eos_token_id, bool)
                                         or not isinstance(eos_token_id, int) or eos_token_id < 0):
            raise ValueError(f"eos_token_id must be an int >= 0 or None, got {eos_token_id!r}")
        # An id no row can emit (every emitted id is below the vocabulary size) stands for none.
        self.eos_token_id = target.config.vocab_size if eos_token_id is None else eos_token_id
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.config.vocab_size}) differs from the "
                             f"target's ({target.config.vocab_size})")
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None
        self.proposer = DraftModelProposer(self.draft) if draft is not None else None
        self.device = target.embed.weight.device
        self.max_seq_len = min(target.config.max_seq_len,
                               draft.config.max_seq_len if draft else math.inf)
        # One graph per (K, B, methods, filters on): the whole round, draft steps included.
        self.round = compile_fn(partial(speculative_round, self.target, self.proposer),
                                "round", compile, self.device)

    def check(self, prompts: list[list[int]], params: list[SamplingParams],
              spec: SpeculativeConfig) -> None:
        """Every bad input raises ValueError naming it, before anything is computed."""
        spec.validate()
        k = spec.num_speculative_tokens
        if k > 0 and self.draft is None:
            raise ValueError("num_speculative_tokens > 0 needs a draft model")
        if not prompts or len(params) != len(prompts):
            raise ValueError(f"need one SamplingParams per prompt, got {len(params)} for "
                             f"{len(prompts)} prompts")
        vocab = self.target.config.vocab_size
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            p.validate()
            if len(prompt) < 2:  # BOS plus at least one token
                raise ValueError(f"prompt {i} is empty")
            if any(not 0 <= t < vocab for t in prompt):
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
            if len(prompt) >= self.max_seq_len:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; the context holds "
                                 f"{self.max_seq_len}")
            if len(prompt) + p.max_new_tokens + k > self.max_seq_len:
                raise ValueError(f"prompt {i}: {len(prompt)} prompt tokens + max_new_tokens "
                                 f"{p.max_new_tokens} + num_speculative_tokens {k} exceed the "
                                 f"context of {self.max_seq_len} tokens")

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], params: list[SamplingParams],
                k: int) -> LoopState:
        """Fill both caches with every prompt token but the last (which the first round feeds).

        Eager: prefill runs once per request, so compiling its padded shapes would cost more
        start-up than it saves."""
        b = len(prompts)
        for model in (self.target, self.draft if k else None):
            if model is not None:
                model.setup_cache(b)  # kept when it already fits: the models own their caches
        tokens = torch.zeros(b, self.max_seq_len, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, :len(prompt)] = torch.tensor(prompt)
        tokens = tokens.to(self.device)
        buckets = math.ceil((max(map(len, prompts)) - 1) / PREFILL_BUCKET)
        width = min(self.max_seq_len, buckets * PREFILL_BUCKET)
        positions = torch.arange(width, device=self.device).expand(b, width)
        # Right padding is harmless: pad entries sit past each row's prompt, where keys are
        # masked until the row's own tokens overwrite them.
        for model in (self.target, self.draft if k else None):
            if model is not None:
                model(tokens[:, :width], positions)
        seeds = [p.seed if p.seed is not None else int(torch.randint(2**31, ())) for p in params]
        return LoopState.start(tokens, [len(p) for p in prompts],
                               [p.max_new_tokens for p in params], seeds, k)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: list[SamplingParams],
                 spec: SpeculativeConfig,
                 on_tokens: Callable[[int, list[int], list[str]], None] | None = None
                 ) -> GenerationOutput:
        """Decode every prompt (token ids, BOS first) until EOS or its max_new_tokens.

        `on_tokens(row, ids, origins)` is called as tokens are accepted, for streaming.
        """
        self.check(prompts, params, spec)
        k = spec.num_speculative_tokens
        stats = DecodeStats(k, position_accepted=[0] * k)
        start = time.perf_counter()
        state = self.prefill(prompts, params, k)
        constraints = row_constraints(params, self.device)
        stats.time_prefill = time.perf_counter() - start
        outputs, origins = [[] for _ in prompts], [[] for _ in prompts]
        run_round = partial(self.round, num_speculative_tokens=k,
                            draft_sample_method=spec.draft_sample_method,
                            rejection_sample_method=spec.rejection_sample_method,
                            eos_token_id=self.eos_token_id)
        done = False
        while not done:
            start = time.perf_counter()
            state, snapshot = run_round(state, constraints)
            rows = snapshot.tolist()  # the round's one host read
            stats.count_round(time.perf_counter() - start, host_reads=1,
                              compiled_calls=int(self.round.compiled))
            start = time.perf_counter()
            done = self.emit(rows, k, outputs, origins, on_tokens)
            stats.time_emit += time.perf_counter() - start
        self.collect(state, stats)
        return GenerationOutput(outputs, origins, stats)

    @staticmethod
    def emit(rows: list[list[int]], k: int, outputs: list[list[int]], origins: list[list[str]],
             on_tokens: Callable[[int, list[int], list[str]], None] | None) -> bool:
        """Hand each row's new tokens to the caller; True once every row is done."""
        for i, row in enumerate(rows):
            count, num_accepted = row[k + 1], row[k + 2]
            if count:
                kinds = origins_of(count, num_accepted, k)
                outputs[i] += row[:count]
                origins[i] += kinds
                if on_tokens:
                    on_tokens(i, row[:count], kinds)
        return all(row[k + 3] for row in rows)

    @staticmethod
    def collect(state: LoopState, stats: DecodeStats) -> None:
        """Copy the device-side counters into stats: one read, after the last round."""
        counters = [state.rounds, state.accepted, state.generated, state.alpha_count,
                    state.alpha_sum]
        totals = torch.cat([torch.stack([c.sum().double() for c in counters]),
                            state.position_accepted.sum(0).double()]).tolist()
        stats.rounds, stats.accepted, stats.emitted, stats.alpha_count = map(int, totals[:4])
        stats.drafted = stats.rounds * stats.num_speculative_tokens
        stats.alpha_sum = totals[4]
        stats.position_accepted = [int(a) for a in totals[5:]]
