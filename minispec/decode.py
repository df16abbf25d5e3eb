"""The decode loop: prefill, then one compiled round per iteration until every row is done.

    generate = check -> start_run (prefill) -> repeat decode_round -> collect
    decode_round = [host lookup] -> round (one compiled call) -> one host read -> emit -> next K

A round (minispec/round.py) is Algorithm 1 for the whole batch, K = 0 being the baseline. All
shapes are static: draft steps and a [B, K+1] verify inside the round, a padded prefill outside
it. Finished rows keep computing, frozen in place, rather than shrinking the batch. Python's
whole per-round work is one call of the round, one device->host read of its snapshot (which
also decides stopping and, with num_speculative_tokens="auto", the next round's K), the
streaming callback, and for the suffix and hybrid proposers a lookup in tokens the host
already holds. The hybrid has three rounds: the draft model's own, when no row takes its
lookup's drafts; a lookup round without the draft model, when every row does; and its own
mixed round, when some rows do (SpeculativeDecoder.hybrid_kind).
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, replace
from functools import partial
from typing import Callable, NamedTuple

import torch

from minispec.adaptive import (
    AdaptiveConfig,
    FamilyMeasurements,
    FamilyPrior,
    LookupGate,
    RoundTimes,
    choose_width,
    would_keep,
)
from minispec.compiled import Announced, compile_fn
from minispec.origins import origins_of
from minispec.params import SamplingParams, SpeculativeConfig, row_constraints
from minispec.proposers import (
    DraftModelProposer,
    HostLookup,
    HostLookupProposer,
    HybridProposer,
    NgramProposer,
    Proposal,
    Proposer,
    SuffixIndex,
    SuffixProposer,
)
from minispec.round import speculative_round
from minispec.state import LoopState
from minispec.stats import DecodeStats
from model.gpt import GPT
from model.tokenizer import EOS_TOKEN_ID
from sampling.constraints import RowConstraints

PREFILL_BUCKET = 64  # prompts are padded to a multiple of this, so prefill sees few shapes
USES_DRAFT_MODEL = ("draft_model", "hybrid")
# The hybrid trusts a lookup that matched at least this many tokens of context: 16, the most
# either lookup reads (NgramProposer.n_max, the suffix index's DEPTH), an indented identifier
# and more. On the shipped pair shorter matches propose worse than the draft model does.
DEFAULT_HYBRID_THRESHOLD = 16


class GenerationOutput(NamedTuple):
    token_ids: list[list[int]]  # generated ids per request (prompt excluded)
    origins: list[list[str]]  # per token: accepted, corrective, bonus, or target (no drafts)
    stats: DecodeStats


def sample_methods(spec: SpeculativeConfig, params: list[SamplingParams]) -> tuple[str, str]:
    """The draft and rejection sample methods a batch runs: "auto" resolved per batch, and
    block verification as the token-wise rule when every request is greedy."""
    greedy_batch = all(p.temperature == 0 for p in params)
    draft_sample_method = spec.draft_sample_method
    if draft_sample_method == "auto":
        draft_sample_method = "greedy" if greedy_batch else "probabilistic"
    # With a greedy target everywhere, block verification accepts exactly what the token-wise
    # rule does (as for one-hot drafts, which the sampler itself sends to "standard").
    rejection_sample_method = spec.rejection_sample_method
    if rejection_sample_method == "block" and greedy_batch:
        rejection_sample_method = "standard"
    return draft_sample_method, rejection_sample_method


def every_lookup_trusted(match_length: list[int], active: list[bool], threshold: int) -> bool:
    """Whether the hybrid's round can go without the draft model: every row still decoding
    has a lookup that matched at least `threshold` tokens (and some row is: a warm-up goes on
    past its rows' end, through every width of the hybrid's own round)."""
    return any(active) and all(m >= threshold for m, a in zip(match_length, active) if a)


class WidthSchedule:
    """Which K each round of one generate() call uses. A fixed K: that K. "auto": the first
    round's from the prior (SpeculativeDecoder.first_width), then the width each round chose
    for the next (the last column of its snapshot), with round times measured per width; but a
    width that is due (RoundTimes.due: never timed by this graph family, or not lately) runs
    once first. The cost model 1 + K c that prices an untimed width is far off at large batches
    (at B = 16 a K = 8 round took 2.8 K = 0 rounds, the model says 1.6), and a width that looks
    too dear is never run, so never timed: one round each settles it. warm_up: each allowed
    width once, in order, then stop."""

    def __init__(self, widths: tuple[int, ...], times: RoundTimes | None, warm_up: bool) -> None:
        self.widths, self.times, self.warm_up = widths, times, warm_up
        self.k, *self.pending = widths
        # What the round's own choice weighs each width's time by; None without "auto".
        self.relative_times = None if times is None else times.relative(widths)
        self.previous: tuple[int, float] | None = None  # the last round's (K, seconds), if timed

    def advance(self, seconds: float | None, rows: list[list[int]], done: bool) -> bool:
        """After a round at width self.k that took `seconds` (None: it compiled, so its time says
        nothing about the round's): set the next round's K, and say whether the call is done
        (`done`: every row is)."""
        if self.times is not None:
            if seconds is not None:
                self.times.observe(self.k, seconds, self.previous)
                # Only a new step moves the fit, which costs ~0.1 ms (a B = 1 round: ~7 ms).
                if self.previous is not None and self.previous[0] != self.k:
                    self.relative_times = self.times.relative(self.widths)
            # A round that compiled breaks the chain: the rounds around it are not adjacent.
            self.previous = None if seconds is None else (self.k, seconds)
            self.k = self.widths[rows[0][-1]]
            due = None if self.warm_up else self.times.due(self.widths)
            self.k = self.k if due is None else due
        if self.warm_up:  # one round per width, whatever the rows say
            if not self.pending:
                return True
            self.k = self.pending.pop(0)
            return False
        return done


@dataclass(slots=True)
class DecodeRun:
    """One generate() call in flight: what its rounds read and write on the host."""

    # The compiled rounds by kind, each as (its static arguments bound, unbound: the unbound
    # one says whether its last call compiled): "own" for every proposer; the hybrid's "draft"
    # and "lookup" rounds too (SpeculativeDecoder.hybrid_kind chooses among its three).
    rounds: dict[str, tuple[Callable, Announced]]
    host_lookup: HostLookupProposer | None  # looks up on the host, between rounds
    gate: LookupGate | None  # the hybrid's: whether lookup rounds have paid
    uses_draft: bool  # whether the draft model's cache must follow the tokens
    state: LoopState
    constraints: RowConstraints
    schedule: WidthSchedule
    prior: FamilyPrior | None  # with "auto": what the call's measured alpha goes into
    stats: DecodeStats
    on_tokens: Callable[[int, list[int], list[str]], None] | None
    outputs: list[list[int]]  # per row: the generated ids so far
    origins: list[list[str]]  # per row: where each came from
    histories: list[list[int]]  # per row: prompt and output, what the host lookup reads
    active: list[bool]  # per row: not done yet
    draft_behind: int = 0  # tokens (the most of any row) emitted since the draft model last ran
    # this round's lookup drafts per row, when every active row trusted its lookup
    trusted_drafts: list[list[int]] | None = None
    compile_lookup_round: bool = False  # warming up: run one lookup round, whatever matched
    done: bool = False


class SpeculativeDecoder:
    """A target (and optionally a draft model and a suffix index) with compiled rounds, reusable
    across calls."""

    def __init__(
        self,
        target: GPT,
        draft: GPT | None = None,
        *,
        compile: bool | str = True,
        suffix_index: SuffixIndex | None = None,
        hybrid_threshold: int = DEFAULT_HYBRID_THRESHOLD,
        eos_token_id: int | None = EOS_TOKEN_ID,
    ) -> None:
        """`compile`: True, torch.compile each round graph; "aot", on the CPU, compile each one
        ahead of time into a package on disk that later processes load, which starts faster
        (minispec/compiled.py; on CUDA, as True); "auto", on the CPU, run each round eagerly
        while a background process builds its package, which takes over once built
        (minispec/tiers.py; on CUDA, as True); False, run eagerly.

        `eos_token_id`: the target's end-of-sequence id, where a row stops; None if it has
        none (rows then stop at max_new_tokens only, as they do for an id past the vocabulary:
        the byte tokenizer's default with a tiny test vocabulary)."""
        if compile not in (True, False, "aot", "auto"):
            raise ValueError(f'compile must be True, False, "aot" or "auto", got {compile!r}')
        if eos_token_id is not None and (
            isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int) or eos_token_id < 0
        ):
            raise ValueError(f"eos_token_id must be an int >= 0 or None, got {eos_token_id!r}")
        # An id no row can emit (every emitted id is below the vocabulary size) stands for none.
        self.eos_token_id = target.config.vocab_size if eos_token_id is None else eos_token_id
        if draft is not None and draft.config.vocab_size != target.config.vocab_size:
            raise ValueError(
                f"draft vocabulary ({draft.config.vocab_size}) differs from the "
                f"target's ({target.config.vocab_size})"
            )
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None
        self.suffix_index, self.hybrid_threshold, self.compile = (
            suffix_index,
            hybrid_threshold,
            compile,
        )
        self.device = target.embed.weight.device
        self.max_seq_len = min(
            target.config.max_seq_len, draft.config.max_seq_len if draft else math.inf
        )
        # One compiled round per proposer; inside each, one graph per (K, B, methods, filters).
        self.rounds: dict[tuple, tuple[Proposer, HostLookupProposer | None, Announced]] = {}
        # adaptive K's measurements, per graph family (proposer, batch size, sample methods)
        self.families: dict[tuple[str, int, str, str], FamilyMeasurements] = {}
        # the hybrid's lookup rounds against its own, per (batch size, sample methods)
        self.lookup_gates: dict[tuple[int, str, str], LookupGate] = {}

    def proposer(self, name: str) -> tuple[Proposer, HostLookupProposer | None, Announced]:
        """The proposer `name`, its host-side lookup if it has one, and its compiled round, built
        on first use."""
        key = (name, self.suffix_index is not None)
        if key not in self.rounds:
            suffix = SuffixProposer(self.suffix_index) if self.suffix_index else None
            lookup = HostLookup(NgramProposer(), suffix)
            proposer = {
                "draft_model": lambda: DraftModelProposer(self.draft),
                "ngram": NgramProposer,
                "suffix": lambda: suffix,
                "hybrid": lambda: HybridProposer(
                    DraftModelProposer(self.draft), self.hybrid_threshold
                ),
                "lookup": lambda: lookup,  # the hybrid's round without the draft model
            }[name]()
            host_lookup = {"suffix": suffix, "hybrid": lookup, "lookup": lookup}.get(name)
            self.rounds[key] = (
                proposer,
                host_lookup,
                compile_fn(
                    partial(speculative_round, self.target, proposer),
                    f"round[{name}]",
                    self.compile,
                    self.device,
                    torch.nn.ModuleList(m for m in (self.target, self.draft) if m is not None),
                    # what the round bakes in besides the models: the proposer's settings
                    f"{key} threshold={self.hybrid_threshold}",
                ),
            )
        return self.rounds[key]

    def check(
        self, prompts: list[list[int]], params: list[SamplingParams], spec: SpeculativeConfig
    ) -> None:
        """Every bad input raises ValueError naming it, before anything is computed."""
        spec.validate()
        k = max(spec.widths)
        if k > 0 and spec.proposer in USES_DRAFT_MODEL and self.draft is None:
            raise ValueError(f"proposer {spec.proposer!r} needs a draft model")
        if k > 0 and spec.proposer == "suffix" and self.suffix_index is None:
            raise ValueError(
                "proposer 'suffix' needs a suffix index: SpeculativeDecoder(..., suffix_index=...)"
            )
        if not prompts or len(params) != len(prompts):
            raise ValueError(
                f"need one SamplingParams per prompt, got {len(params)} for {len(prompts)} prompts"
            )
        vocab = self.target.config.vocab_size
        for i, (prompt, p) in enumerate(zip(prompts, params)):
            p.validate()
            if len(prompt) < 2:  # BOS plus at least one token
                raise ValueError(f"prompt {i} is empty")
            if any(not 0 <= t < vocab for t in prompt):
                raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
            if len(prompt) >= self.max_seq_len:
                raise ValueError(
                    f"prompt {i} has {len(prompt)} tokens; the context holds {self.max_seq_len}"
                )
            if len(prompt) + p.max_new_tokens + k > self.max_seq_len:
                raise ValueError(
                    f"prompt {i}: {len(prompt)} prompt tokens + max_new_tokens "
                    f"{p.max_new_tokens} + num_speculative_tokens {k} exceed the "
                    f"context of {self.max_seq_len} tokens"
                )

    @torch.no_grad()
    def prefill(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        k: int,
        uses_draft: bool = True,
        prior_alpha: float = AdaptiveConfig().prior_alpha,
    ) -> LoopState:
        """Fill the caches (the target's, and the draft's when it drafts) with every prompt token
        but the last (which the first round feeds). k: the widest K of any round; prior_alpha:
        adaptive K's prior for the rows.

        Eager: prefill runs once per request, so compiling its padded shapes would cost more
        start-up than it saves."""
        b = len(prompts)
        models = [self.target] + ([self.draft] if k and uses_draft else [])
        for model in models:
            model.setup_cache(b)  # kept when it already fits: the models own their caches
        tokens = torch.zeros(b, self.max_seq_len, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.tensor(prompt)
        tokens = tokens.to(self.device)
        buckets = math.ceil((max(map(len, prompts)) - 1) / PREFILL_BUCKET)
        width = min(self.max_seq_len, buckets * PREFILL_BUCKET)
        positions = torch.arange(width, device=self.device).expand(b, width)
        # Right padding is harmless: pad entries sit past each row's prompt, where keys are
        # masked until the row's own tokens overwrite them.
        for model in models:
            model(tokens[:, :width], positions)
        seeds = [p.seed if p.seed is not None else int(torch.randint(2**31, ())) for p in params]
        return LoopState.start(
            tokens,
            [len(p) for p in prompts],
            [p.max_new_tokens for p in params],
            seeds,
            k,
            prior_alpha,
        )

    @torch.no_grad()
    def catch_up_draft(self, state: LoopState, tokens_behind: int) -> None:
        """After rounds without the draft model (adaptive K = 0, the hybrid's lookup rounds), it
        missed up to tokens_behind tokens of a row: feed it the row's last tokens_behind + 2
        tokens (the 2 its own next round would), eagerly, once per switch. (A missed token would
        not break exactness, only the draft's aim.)"""
        back = torch.arange(tokens_behind + 1, -1, -1, device=self.device)
        positions = (state.seq_len[:, None] - 1 - back).clamp(min=0)
        self.draft(state.tokens.gather(1, positions), positions)

    @torch.no_grad()
    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        spec: SpeculativeConfig,
        on_tokens: Callable[[int, list[int], list[str]], None] | None = None,
        *,
        warm_up: bool = False,
    ) -> GenerationOutput:
        """Decode every prompt (token ids, BOS first) until EOS or its max_new_tokens.

        `on_tokens(row, ids, origins)` is called as tokens are accepted, for streaming.
        `warm_up`: run one round at each K the spec allows, then stop, so that every graph this
        call can use is compiled before a timed run.
        """
        self.check(prompts, params, spec)
        if warm_up and spec.proposer == "hybrid":  # its "draft" rounds are the draft model's
            self.generate(prompts, params, replace(spec, proposer="draft_model"), warm_up=True)
        run = self.start_run(prompts, params, spec, on_tokens, warm_up)
        while not run.done:
            self.decode_round(run)
        self.collect(run.state, run.stats)
        if run.prior is not None:
            run.prior.observe_call(run.stats.alpha_sum, run.stats.alpha_count, spec.adaptive)
        return GenerationOutput(run.outputs, run.origins, run.stats)

    def start_run(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        spec: SpeculativeConfig,
        on_tokens: Callable[[int, list[int], list[str]], None] | None,
        warm_up: bool,
    ) -> DecodeRun:
        """Everything the rounds of one call share: the compiled round with its static
        arguments, the prefilled state, and the schedule of widths."""
        widest = max(spec.widths)
        uses_draft = spec.proposer in USES_DRAFT_MODEL
        # K = 0 only: no proposer runs, and any proposer's round is the baseline.
        _, host_lookup, compiled_round = self.proposer(spec.proposer if widest else "draft_model")
        rounds, gate = self.hybrid_rounds(spec, params, widest)
        rounds["own"] = (self.bind_round(compiled_round, spec, params), compiled_round)
        family = self.measurements(spec, params)
        prior = None if family is None else family.prior
        prior_alpha = spec.adaptive.prior_alpha if prior is None else prior.alpha(spec.adaptive)
        stats = DecodeStats(spec.num_speculative_tokens, position_accepted=[0] * widest)
        start = time.perf_counter()
        state = self.prefill(prompts, params, widest, uses_draft, prior_alpha)
        constraints = row_constraints(params, self.device)
        stats.time_prefill = time.perf_counter() - start
        return DecodeRun(
            rounds=rounds,
            host_lookup=host_lookup,
            gate=gate,
            uses_draft=uses_draft,
            state=state,
            constraints=constraints,
            schedule=self.schedule(spec, params, warm_up, prior_alpha, family),
            prior=prior,
            stats=stats,
            on_tokens=on_tokens,
            outputs=[[] for _ in prompts],
            origins=[[] for _ in prompts],
            histories=[list(p) for p in prompts],
            active=[True] * len(prompts),
            compile_lookup_round=warm_up and gate is not None,
        )

    def hybrid_rounds(
        self, spec: SpeculativeConfig, params: list[SamplingParams], widest: int
    ) -> tuple[dict[str, tuple[Callable, Announced]], LookupGate | None]:
        """The hybrid's rounds besides its own (bound, unbound): the draft model's, for rounds
        where no row takes a lookup's drafts, and the lookup round without the draft model, for
        rounds where every row does; and its gate, kept across calls per (batch size, sample
        methods). Nothing, None for the other proposers."""
        if not (widest and spec.proposer == "hybrid"):
            return {}, None
        gate = self.lookup_gates.setdefault(
            (len(params), *sample_methods(spec, params)), LookupGate()
        )
        draft, lookup = (self.proposer(name)[2] for name in ("draft_model", "lookup"))
        return {
            "draft": (self.bind_round(draft, spec, params), draft),
            # Not adaptive: a lookup round leaves the rows' alpha (the draft model's) and the
            # next K alone, and its time is not a draft round's.
            "lookup": (self.bind_round(lookup, spec, params, False), lookup),
        }, gate

    def bind_round(
        self,
        compiled_round: Announced,
        spec: SpeculativeConfig,
        params: list[SamplingParams],
        adapts: bool = True,
    ) -> Callable:
        """The round with the call's static arguments bound: the sample methods, the EOS id and,
        with "auto" (and `adapts`), the adaptive configuration (the round then chooses the next
        K)."""
        draft_sample_method, rejection_sample_method = sample_methods(spec, params)
        return partial(
            compiled_round,
            draft_sample_method=draft_sample_method,
            rejection_sample_method=rejection_sample_method,
            eos_token_id=self.eos_token_id,
            adaptive=spec.adaptive if adapts and spec.num_speculative_tokens == "auto" else None,
        )

    def measurements(
        self, spec: SpeculativeConfig, params: list[SamplingParams]
    ) -> FamilyMeasurements | None:
        """With "auto", what adaptive K keeps across calls for the call's graph family (its
        proposer, batch size and sample methods), created on first use; None for a fixed K."""
        if spec.num_speculative_tokens != "auto":
            return None
        family = (spec.proposer, len(params), *sample_methods(spec, params))
        if family not in self.families:
            self.families[family] = FamilyMeasurements(RoundTimes(self.cost_ratio(spec.proposer)))
        return self.families[family]

    def schedule(
        self,
        spec: SpeculativeConfig,
        params: list[SamplingParams],
        warm_up: bool,
        prior_alpha: float,
        family: FamilyMeasurements | None,
    ) -> WidthSchedule:
        """The call's WidthSchedule: with "auto", timed by the family's round times, and the first
        K from the prior (unless warming up: every width in turn)."""
        if family is None:
            return WidthSchedule(spec.widths, None, warm_up)
        schedule = WidthSchedule(spec.widths, family.times, warm_up)
        if not warm_up:
            schedule.k = self.first_width(
                spec.adaptive, prior_alpha, schedule.relative_times, params
            )
        return schedule

    def decode_round(self, run: DecodeRun) -> None:
        """One iteration of the loop: the host's lookup (if any), then Algorithm 1's propose,
        verify, accept and advance in one compiled call, one host read of its snapshot, emit,
        and the next round's K."""
        start = time.perf_counter()
        k, host_proposal, kind = self.look_up(run)
        lookup_seconds = time.perf_counter() - start  # part of the width's time, unlike:
        drafts = k and run.uses_draft and kind != "lookup"  # the draft model runs this round
        if drafts and run.draft_behind:
            self.catch_up_draft(run.state, run.draft_behind)
        # The width's time leaves the catch-up out: it is paid once per return from K = 0, and
        # charged to one round it would price K > 0 out, which would keep the batch at K = 0.
        round_start = time.perf_counter()
        run_round, compiled_round = run.rounds[kind]
        relative = None if kind == "lookup" else run.schedule.relative_times
        run.state, snapshot = run_round(
            run.state,
            run.constraints,
            host_proposal,
            None if relative is None else relative.to(self.device),
            num_speculative_tokens=k,
        )
        rows = snapshot.tolist()  # the round's one host read
        end = time.perf_counter()
        # A compiled round is one guard check; an eager one, none.
        guard_checks = int(compiled_round.compiled)
        run.stats.count_round(end - start, host_reads=1, compiled_calls=guard_checks, k=k)
        run.stats.lookup_rounds += kind == "lookup"
        emitted = max(row[k + 1] for row in rows)
        # The hybrid's own round: some rows kept a lookup's drafts, which the draft never saw.
        mixed = kind == "own" and run.gate is not None
        run.draft_behind = (emitted if mixed else 0) if drafts else run.draft_behind + emitted
        # A round that compiled is not a round's time.
        seconds = None if compiled_round.compiled_last else lookup_seconds + end - round_start
        if run.gate is not None and k and seconds is not None:
            self.observe_lookup_gate(run, rows, k, kind == "lookup", seconds)
        run.active = [not row[k + 4] for row in rows]
        emit_start = time.perf_counter()
        done = self.emit(rows, k, run.outputs, run.origins, run.on_tokens, run.histories)
        run.stats.time_emit += time.perf_counter() - emit_start
        if kind == "lookup":  # K stays the draft rounds' choice, and the warm-up's plan stands
            run.compile_lookup_round = False
            run.done = done and not run.schedule.warm_up
            return
        run.done = run.schedule.advance(seconds, rows, done)

    @staticmethod
    def observe_lookup_gate(
        run: DecodeRun, rows: list[list[int]], k: int, lookup_only: bool, seconds: float
    ) -> None:
        """Tell the hybrid's gate what a round at width k with a host lookup emitted, and, for
        one of its other rounds taken while every lookup was trusted, what a lookup round would
        have (rows done before the round emit nothing and count for nothing)."""
        tokens = sum(row[k + 1] for row in rows)
        if lookup_only:
            run.gate.observe_lookup_round(seconds, tokens)
            return
        lookup_tokens = None
        if run.trusted_drafts is not None:
            lookup_tokens = sum(
                would_keep(drafts, row[: row[k + 1]])
                for drafts, row, active in zip(run.trusted_drafts, rows, run.active)
                if active
            )
        run.gate.observe_draft_round(seconds, tokens, lookup_tokens)

    def look_up(self, run: DecodeRun) -> tuple[int, Proposal | None, str]:
        """The round's K, the host lookup's proposal for the round (None without one) and the
        kind of round to run (a key of run.rounds): "own", but for the hybrid the one
        hybrid_kind chooses. A lookup round drafts the widest K, which costs it one wider
        verify only. While the hybrid's gate is shut, the lookups run in one round of
        LookupGate.probe_every only, and then only to keep the gate informed."""
        k, widest = run.schedule.k, max(run.schedule.widths)  # a lookup round's K: the widest
        if not (k and run.host_lookup is not None):
            return k, None, "own"
        start = time.perf_counter()
        if run.gate is not None and not run.gate.should_look():
            run.trusted_drafts = None
            return k, None, "draft"
        proposal = run.host_lookup.host_propose(run.histories, widest)
        kind = "own" if run.gate is None else self.hybrid_kind(run, proposal)
        if kind == "lookup":
            k = widest
        proposal = None if kind == "draft" else proposal.narrowed(k).to(self.device)
        run.stats.time_lookup += time.perf_counter() - start
        return k, proposal, kind

    def hybrid_kind(self, run: DecodeRun, proposal: Proposal) -> str:
        """Which of the hybrid's rounds this one is: "lookup", without the draft model, when
        every active row's lookup matched at least the threshold and lookup rounds have paid
        so far (LookupGate); "own", where the rows that matched take the lookup's drafts and
        the draft model drafts for the rest, when only some did; else "draft", the draft
        model's own round (also while the gate is shut: then no row takes a lookup's drafts).
        The choice depends on the rows' tokens so far and past timings: the output stays exact."""
        lengths = proposal.match_length.tolist()
        trusted = every_lookup_trusted(lengths, run.active, self.hybrid_threshold)
        # What a lookup round would have drafted, for the gate to judge by this round's tokens.
        run.trusted_drafts = proposal.draft_token_ids.tolist() if trusted else None
        gate_open = run.gate.open()
        if run.compile_lookup_round or (trusted and gate_open):
            return "lookup"
        some = any(m >= self.hybrid_threshold and a for m, a in zip(lengths, run.active))
        if run.schedule.warm_up or (some and gate_open):
            return "own"  # a warm-up compiles it at every width
        return "draft"

    @staticmethod
    def first_width(
        adaptive: AdaptiveConfig,
        prior_alpha: float,
        relative_times: torch.Tensor,
        params: list[SamplingParams],
    ) -> int:
        """The first round's K, every row at the prior alpha with all its max_new_tokens to go
        (later rounds choose inside the round). Host tensors: no device read."""
        index = choose_width(
            torch.full((len(params),), prior_alpha, dtype=torch.float64),
            torch.tensor([p.max_new_tokens for p in params]),
            adaptive.widths,
            relative_times,
            adaptive.margin,
        )
        return adaptive.widths[int(index)]

    def cost_ratio(self, proposer: str) -> float:
        """c before any round was timed: a draft step costs about its share of the parameters
        (steps are memory-bound); a lookup costs next to nothing."""
        if proposer not in USES_DRAFT_MODEL:
            return 0.0
        size = lambda model: sum(p.numel() for p in model.parameters())  # noqa: E731
        return size(self.draft) / size(self.target)

    @staticmethod
    def emit(
        rows: list[list[int]],
        k: int,
        outputs: list[list[int]],
        origins: list[list[str]],
        on_tokens: Callable[[int, list[int], list[str]], None] | None,
        histories: list[list[int]],
    ) -> bool:
        """Hand each row's new tokens to the caller; True once every row is done."""
        for i, row in enumerate(rows):
            count, num_accepted, num_drafts = row[k + 1 : k + 4]
            if count:
                kinds = origins_of(count, num_accepted, num_drafts)
                outputs[i] += row[:count]
                histories[i] += row[:count]
                origins[i] += kinds
                if on_tokens:
                    on_tokens(i, row[:count], kinds)
        return all(row[k + 4] for row in rows)

    @staticmethod
    def collect(state: LoopState, stats: DecodeStats) -> None:
        """Copy the device-side counters into stats: one read, after the last round."""
        counters = [
            state.rounds,
            state.accepted,
            state.generated,
            state.alpha_count,
            state.drafted,
            state.alpha_sum,
        ]
        totals = torch.cat(
            [
                torch.stack([c.sum().double() for c in counters]),
                state.position_accepted.sum(0).double(),
            ]
        ).tolist()
        (stats.rounds, stats.accepted, stats.emitted, stats.alpha_count, stats.drafted) = map(
            int, totals[:5]
        )
        stats.alpha_sum = totals[5]
        stats.position_accepted = [int(a) for a in totals[6:]]
