"""The one decode loop: speculative decoding for a batch of requests, K = 0 being the baseline.

Each round, for every row b of the batch at once (GUIDE.md section 1):
  1. the draft proposes x_1..x_K, one single-token step each (`propose`);
  2. the target scores [last, x_1..x_K] in one forward of K+1 tokens (`verify`);
  3. sampling.rejection_sample keeps n_b drafts and adds one corrective or bonus token;
  4. each row advances by its own n_b + 1 (`advance`); both KV caches "roll back" for free,
     because attention masks keys by absolute position and stale entries get overwritten.
With K = 0 steps 1 and 3 reduce to sampling the target's next token: plain decoding.

All shapes are static: [B, 2] and [B, 1] draft steps, a [B, K+1] verify, a padded prefill.
Finished rows keep computing, frozen in place, rather than shrinking the batch. The only
device->host read of a round is one snapshot of what it emitted, which also decides stopping.
"""
from __future__ import annotations

import time
from functools import partial
from typing import Callable, NamedTuple

import torch

from minispec.compiled import compile_fn
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.rng import round_noise
from minispec.stats import DecodeStats
from model.gpt import GPT
from model.tokenizer import EOS_TOKEN_ID
from sampling import rejection_sample, sample
from sampling.constraints import SampleParams, filtered_logits, normalize_params

ACCEPTED, CORRECTIVE, BONUS, TARGET = "accepted", "corrective", "bonus", "target"
PREFILL_BUCKET = 64  # prompts are padded to a multiple of this, so prefill compiles few shapes


class LoopState(NamedTuple):
    """Everything a round reads and writes, as [B, ...] tensors."""

    tokens: torch.Tensor  # [B, S] prompt then generated ids
    seq_len: torch.Tensor  # [B] tokens so far; the last one is not yet in the target's cache
    generated: torch.Tensor  # [B]
    max_new: torch.Tensor  # [B]
    done: torch.Tensor  # [B] bool
    seeds: torch.Tensor  # [B]
    # statistics, accumulated on the device and read once at the end
    rounds: torch.Tensor  # [B]
    accepted: torch.Tensor  # [B]
    position_accepted: torch.Tensor  # [B, K]
    alpha_sum: torch.Tensor  # [B] float64
    alpha_count: torch.Tensor  # [B]


class GenerationOutput(NamedTuple):
    token_ids: list[list[int]]  # generated ids per request (prompt excluded)
    origins: list[list[str]]  # per token: accepted, corrective, bonus, or target (K = 0)
    stats: DecodeStats


def acceptance_probability(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                           draft_probs: torch.Tensor | None, params: SampleParams) -> torch.Tensor:
    """beta_i = sum_v min(p_i(v), q_i(v)) at each draft position [B, K] (Leviathan Def. 3.1);
    with a one-hot q it is p_i(x_i). Their mean is alpha."""
    b, k, v = target_logits.shape
    rows = SampleParams(*(t.repeat_interleave(k) if t is not None else None for t in params))
    filtered = filtered_logits(target_logits.reshape(b * k, v), rows)
    one_hot = torch.nn.functional.one_hot(filtered.argmax(-1), v).to(filtered.dtype)  # greedy rows' p
    p = torch.where((rows.temperature == 0)[:, None], one_hot, filtered.softmax(-1)).view(b, k, v)
    if draft_probs is None:
        return p.gather(-1, draft_token_ids[..., None]).squeeze(-1)
    return torch.minimum(p, draft_probs).sum(-1)


def advance(state: LoopState, emitted: torch.Tensor, num_accepted: torch.Tensor,
            beta: torch.Tensor | None, eos_token_id: int) -> tuple[LoopState, torch.Tensor]:
    """Append each row's emitted tokens (truncated at EOS and max_new_tokens), update stats.

    Returns the new state and the round's snapshot [B, K+4]: emitted ids (-1 past the count),
    count, n, done. That snapshot is the one thing the host reads.
    """
    width = emitted.shape[1]
    j = torch.arange(width, device=emitted.device)
    active = ~state.done
    count = num_accepted + 1
    is_eos = (emitted == eos_token_id) & (j < count[:, None])
    first_eos = torch.where(is_eos.any(1), is_eos.int().argmax(1), width)
    count = torch.minimum(torch.minimum(count, first_eos + 1), state.max_new - state.generated)
    count = torch.where(active, count, 0)
    index = (state.seq_len[:, None] + j).clamp(max=state.tokens.shape[1] - 1)
    keep = j < count[:, None]
    tokens = state.tokens.scatter(1, index, torch.where(keep, emitted, state.tokens.gather(1, index)))
    generated = state.generated + count
    done = state.done | (first_eos < count) | (generated >= state.max_new)
    k = width - 1
    verified = torch.minimum(num_accepted + 1, torch.full_like(num_accepted, k))  # positions tested
    new = state._replace(
        tokens=tokens, seq_len=state.seq_len + count, generated=generated, done=done,
        rounds=state.rounds + active.long(),
        accepted=state.accepted + torch.where(active, num_accepted, 0),
        position_accepted=state.position_accepted + ((j[:k] < num_accepted[:, None]) & active[:, None]).long(),
        alpha_sum=state.alpha_sum + (torch.where((j[:k] < verified[:, None]) & active[:, None], beta, 0).sum(1).double()
                                     if beta is not None else 0),
        alpha_count=state.alpha_count + torch.where(active, verified, 0))
    snapshot = torch.cat([torch.where(keep, emitted, -1), count[:, None], num_accepted[:, None], done[:, None]], 1)
    return new, snapshot


class SpeculativeDecoder:
    """A target (and optionally a draft) with compiled step functions, reusable across calls."""

    def __init__(self, target: GPT, draft: GPT | None = None, *, compile: bool = True) -> None:
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(f"draft vocabulary ({draft.config.vocab_size}) differs from the target's "
                             f"({target.config.vocab_size})")
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None
        self.device = target.embed.weight.device
        self.max_seq_len = min(target.config.max_seq_len, draft.config.max_seq_len if draft else 10**9)
        # CUDA graphs remove launch overhead on a GPU; every compiled output below is consumed
        # before the same graph replays, so none needs cloning.
        mode = "reduce-overhead" if self.device.type == "cuda" else None
        self.target_forward = compile_fn(target, "target forward", compile, mode)
        self.draft_forward = compile_fn(draft, "draft forward", compile, mode) if draft else None
        self.noise = compile_fn(round_noise, "round noise", compile)
        self.beta = compile_fn(acceptance_probability, "acceptance probability", compile)
        self.advance = compile_fn(advance, "advance", compile)
        # sampling/ compiles its own graphs unless told compiled=False, which compile=False (the
        # CLI's --no-compile) must say too; wrapping only announces their first call per shape.
        # check() validated every request up front, so per-round value checks (host reads) are skipped.
        self.sample = compile_fn(partial(sample, compiled=compile, check_values=False), "sampler", False)
        self.rejection_sample = compile_fn(partial(rejection_sample, compiled=compile, check_values=False),
                                           "rejection sampler", False)
        self.sample.announce = self.rejection_sample.announce = compile

    def check(self, prompts: list[list[int]], params: list[SamplingParams], spec: SpeculativeConfig) -> None:
        """Every bad input raises ValueError naming it, before anything is computed."""
        spec.validate()
        if spec.num_speculative_tokens > 0 and self.draft is None:
            raise ValueError("num_speculative_tokens > 0 needs a draft model")
        if not prompts or len(params) != len(prompts):
            raise ValueError(f"need one SamplingParams per prompt, got {len(params)} for {len(prompts)} prompts")
        vocab = self.target.config.vocab_size
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            p.validate()
            if len(prompt) < 2:  # BOS plus at least one token
                raise ValueError(f"prompt {i} is empty")
            if any(not 0 <= t < vocab for t in prompt):
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
            need = len(prompt) + p.max_new_tokens + spec.num_speculative_tokens
            if len(prompt) >= self.max_seq_len:
                raise ValueError(f"prompt {i} has {len(prompt)} tokens; the context holds {self.max_seq_len}")
            if need > self.max_seq_len:
                raise ValueError(f"prompt {i}: {len(prompt)} prompt tokens + max_new_tokens {p.max_new_tokens} + "
                                 f"num_speculative_tokens {spec.num_speculative_tokens} exceed the context of "
                                 f"{self.max_seq_len} tokens")

    @torch.no_grad()
    def prefill(self, prompts: list[list[int]], params: list[SamplingParams], k: int, stats: DecodeStats) -> LoopState:
        """Fill both caches with every prompt token but the last (which the first round feeds)."""
        start = time.perf_counter()
        b, dev = len(prompts), self.device
        for model in (self.target, self.draft):
            if model is not None:
                model.setup_cache(b)  # kept when it already fits: the models own their caches
        tokens = torch.zeros(b, self.max_seq_len, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, :len(prompt)] = torch.tensor(prompt)
        tokens = tokens.to(dev)
        width = min(self.max_seq_len, -(-(max(map(len, prompts)) - 1) // PREFILL_BUCKET) * PREFILL_BUCKET)
        positions = torch.arange(width, device=dev).expand(b, width)
        # Right padding is harmless: pad entries sit past each row's prompt, where keys are masked
        # until the row's own tokens overwrite them.
        self.target_forward(tokens[:, :width], positions)
        if k:
            self.draft_forward(tokens[:, :width], positions)
        seeds = [p.seed if p.seed is not None else int(torch.randint(2**31, ())) for p in params]
        as_tensor = lambda xs, dtype=torch.long: torch.tensor(xs, dtype=dtype, device=dev)  # noqa: E731
        zeros = torch.zeros(b, dtype=torch.long, device=dev)
        stats.time_prefill = time.perf_counter() - start
        return LoopState(tokens, as_tensor([len(p) for p in prompts]), zeros, as_tensor([p.max_new_tokens for p in params]),
                         torch.zeros(b, dtype=torch.bool, device=dev), as_tensor(seeds), zeros, zeros,
                         torch.zeros(b, k, dtype=torch.long, device=dev), torch.zeros(b, dtype=torch.float64, device=dev),
                         zeros)

    def propose(self, state: LoopState, spec: SpeculativeConfig, params: SampleParams,
                draft_noise: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """K draft steps. The first feeds [previous, last]: after a round that accepted all K
        drafts, x_K never went through the draft, and one [B, 2] shape covers both cases."""
        seq_len = state.seq_len
        positions = torch.stack([seq_len - 2, seq_len - 1], 1)
        logits = self.draft_forward(state.tokens.gather(1, positions), positions)[:, -1]
        ids, probs = [], []
        for j in range(spec.num_speculative_tokens):
            if spec.draft_sample_method == "greedy":
                x = logits.argmax(-1)  # a one-hot q: draft_probs stays None
            else:
                x, q = self.sample(logits, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p,
                                   exponentials=draft_noise[:, j])
                probs.append(q)
            ids.append(x)
            if j + 1 < spec.num_speculative_tokens:
                logits = self.draft_forward(x[:, None], (seq_len + j)[:, None])[:, 0]
        return torch.stack(ids, 1), (torch.stack(probs, 1) if probs else None)

    @torch.no_grad()
    def generate(self, prompts: list[list[int]], params: list[SamplingParams], spec: SpeculativeConfig,
                 on_tokens: Callable[[int, list[int], list[str]], None] | None = None) -> GenerationOutput:
        """Decode every prompt (token ids, BOS first) until EOS or its max_new_tokens.

        `on_tokens(row, ids, origins)` is called as tokens are accepted, for streaming.
        """
        self.check(prompts, params, spec)
        k, b = spec.num_speculative_tokens, len(prompts)
        stats = DecodeStats(k, position_accepted=[0] * k)
        state = self.prefill(prompts, params, k, stats)
        # top_p stays float64, as the sampler's cumulative masses are: in float32, 0.9 would be
        # 0.89999998 and cut off a token whose prefix mass lies between the two.
        top_p = torch.tensor([p.top_p for p in params], dtype=torch.float64)
        sample_params = normalize_params(
            torch.tensor([p.temperature for p in params]),
            torch.tensor([p.top_k for p in params]) if any(p.top_k for p in params) else None,
            top_p if any(p.top_p < 1 for p in params) else None, b, self.device)
        constraints = dict(temperature=sample_params.temperature, top_k=sample_params.top_k, top_p=sample_params.top_p)
        outputs, origins = [[] for _ in range(b)], [[] for _ in range(b)]
        offsets = torch.arange(k + 1, device=self.device)
        done = [False] * b
        while not all(done):
            t_start = time.perf_counter()
            draft_noise, uniforms, target_noise = self.noise(state.seeds, state.seq_len, k, self.target.config.vocab_size)
            t0 = time.perf_counter()
            draft_ids, draft_probs = self.propose(state, spec, sample_params, draft_noise) if k else (None, None)
            t1 = time.perf_counter()
            last = state.tokens.gather(1, state.seq_len[:, None] - 1)
            verify_tokens = torch.cat([last, draft_ids], 1) if k else last
            target_logits = self.target_forward(verify_tokens, state.seq_len[:, None] - 1 + offsets)
            t2 = time.perf_counter()
            if k:
                emitted, num_accepted = self.rejection_sample(
                    target_logits, draft_ids, draft_probs, uniforms=uniforms, exponentials=target_noise,
                    method=spec.rejection_sample_method, **constraints)
                beta = self.beta(target_logits[:, :k], draft_ids, draft_probs, sample_params)
            else:
                emitted = self.sample(target_logits[:, 0], exponentials=target_noise, **constraints).token_ids[:, None]
                num_accepted, beta = torch.zeros_like(emitted[:, 0]), None
            t3 = time.perf_counter()
            state, snapshot = self.advance(state, emitted, num_accepted, beta, EOS_TOKEN_ID)
            rows = snapshot.tolist()  # the round's one host sync
            stats.host_syncs += 1
            for i, row in enumerate(rows):
                count, n, done[i] = row[k + 1], row[k + 2], bool(row[k + 3])
                if count:
                    kinds = [ACCEPTED if j < n else BONUS if n == k else CORRECTIVE for j in range(count)] if k \
                        else [TARGET]
                    outputs[i] += row[:count]
                    origins[i] += kinds
                    if on_tokens:
                        on_tokens(i, row[:count], kinds)
            stats.batch_rounds += 1
            stats.draft_calls += k
            t4 = time.perf_counter()
            stats.time_draft += t1 - t0
            stats.time_verify += t2 - t1
            stats.time_sampler += t3 - t2
            stats.time_other += t4 - t3 + t0 - t_start
        self._collect(state, stats, k)
        return GenerationOutput(outputs, origins, stats)

    @staticmethod
    def _collect(state: LoopState, stats: DecodeStats, k: int) -> None:
        """Copy the device-side counters into stats: one read, after the last round."""
        counters = [state.rounds, state.accepted, state.generated, state.alpha_count, state.alpha_sum]
        totals = torch.cat([torch.stack([c.sum().double() for c in counters]),
                            state.position_accepted.sum(0).double()]).tolist()
        rounds, accepted, emitted, alpha_count = map(int, totals[:4])
        stats.rounds, stats.drafted, stats.accepted, stats.emitted = rounds, rounds * k, accepted, emitted
        stats.alpha_count, stats.alpha_sum = alpha_count, totals[4]
        stats.position_accepted = [int(a) for a in totals[5:]]
