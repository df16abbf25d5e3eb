"""The decode loop: Algorithm 1 for a batch, one compiled round per iteration.

    generate = check -> prefill -> repeat a round until done -> collect
    each round: plan (the policy's K) -> [host proposal, catch-up] -> round -> one host read -> emit

A round (minispec/round.py) is Algorithm 1 for the whole batch, K = 0 being the baseline. All
shapes are static: draft steps and a [B, K+1] verify inside the round, a padded prefill outside
it. Finished rows keep computing, frozen in place, rather than shrinking the batch. What the
loop does in Python per round is small: ask the policy for K (minispec/policies/), run a host
proposer's lookup (or a proposer's catch-up on rounds at K = 0), call the round, read its
snapshot once (which also decides stopping), hand the new tokens out, and tell the policy what
happened.
"""

from __future__ import annotations

import math
import threading
import time
import weakref
from contextlib import ExitStack, contextmanager
from functools import partial
from typing import Callable, NamedTuple

import torch

from minispec.compilation import Compiled, compile_round
from minispec.machine import prefill_threads
from minispec.params import (
    SamplingParams,
    SpeculativeConfig,
    check_decoder,
    check_head,
    check_request,
    row_constraints,
)
from minispec.policies import FixedK, Policy
from minispec.policies.adaptive import AdaptivePolicy, FamilyMeasurements
from minispec.proposers import PROPOSERS, Held, HostProposer, Proposer, SuffixIndex
from minispec.round import RoundSettings, speculative_round
from minispec.rules import TREE_PROPOSERS
from minispec.state import LoopState, Snapshot, collect
from minispec.stats import DecodeStats
from minispec.tree_round import tree_round
from model.gpt import GPT
from model.head import FeatureHead
from model.tokenizer import EOS_TOKEN_ID

# A round's forwards read the KV cache's first S slots, S = the batch's longest row plus K
# rounded up to a multiple of this (at most max_seq_len): the reads follow the rows' length
# rather than the cache's, and logits stay bit-equal to a whole-cache read (tests/test_model.py).
KV_BUCKET = 64
# The round function each proposer runs: speculative_round unless it has one of its own (of the
# same signature).
ROUNDS = dict.fromkeys(TREE_PROPOSERS, tree_round)

OnTokens = Callable[[int, list[int], list[str]], None]  # (row, new ids, their origins)

# The KV caches live on the models, so a model runs one generation at a time, whichever
# decoders share it: one lock per model. A call that would wait for a generation inside its
# on_tokens callback is refused instead: that callback may be waiting for it (it called
# generate itself, or started a thread that did and joins it), and then neither would end.
# A lock cannot tell such a call from an independent thread's, so both are refused; one that
# began waiting before the callback was entered waits on (it cannot be the callback's).
_MODEL_LOCKS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_LOCKS_LOCK = threading.Lock()


class ModelLock:
    """One model's lock, and whether the generation holding it is inside its on_tokens."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.in_callback = False


@contextmanager
def exclusive(models: list[torch.nn.Module]):
    """Hold every model's lock (in one global order, so two calls cannot each wait on the
    other) and yield `streaming`, bound to them, to run on_tokens through; RuntimeError
    instead of waiting for a generation inside its on_tokens."""
    with _LOCKS_LOCK:
        locks = {id(m): _MODEL_LOCKS.setdefault(m, ModelLock()) for m in models}
    locks = sorted(locks.values(), key=id)  # a pair may be one model twice
    if any(lock.in_callback for lock in locks):
        raise RuntimeError(
            "generate would wait for a generation on the same model that is inside its "
            "on_tokens callback, which may be waiting for this call (from its own thread or "
            "one it started): collect the tokens in on_tokens and call after it returns"
        )
    with ExitStack() as stack:
        for lock in locks:
            stack.enter_context(lock.lock)
        yield partial(streaming, locks)


def streaming(locks: list[ModelLock], on_tokens: OnTokens, *args) -> None:
    """on_tokens(*args), with the models' locks marked as held by a call inside it."""
    for lock in locks:
        lock.in_callback = True
    try:
        on_tokens(*args)
    finally:
        for lock in locks:
            lock.in_callback = False


class GenerationOutput(NamedTuple):
    token_ids: list[list[int]]  # generated ids per request (prompt excluded)
    origins: list[list[str]]  # per token: accepted, corrective, bonus, or target (no drafts)
    stats: DecodeStats


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
        head: FeatureHead | Callable[[], FeatureHead] | None = None,
        eos_token_id: int | None = EOS_TOKEN_ID,
        prefill_threads: int | None = None,
    ) -> None:
        """`compile`: True, torch.compile each round graph; "aot", on the CPU, compile each one
        ahead of time into a package on disk that later processes load (compilation/aot.py);
        "auto", on the CPU, run each round eagerly while a background process builds its
        package (compilation/builder.py); on CUDA both are True; False, run eagerly.
        `head`: a feature head trained on this target (model/head.py), for the "feature_head"
        and "head_tree" proposers, or a function that loads one, called by the first call that
        drafts with it (so a decode that drafts otherwise never reads the head's file).
        `eos_token_id`: the target's end-of-sequence id, where a row stops; None if it has
        none (rows then stop at max_new_tokens only).
        `prefill_threads`: the CPU threads the prefill runs on, every core this process may use
        when None; the rounds run on the caller's count (minispec/machine.py says why)."""
        check_decoder(target, draft, head, compile, eos_token_id, prefill_threads)
        self.head = head.eval() if isinstance(head, FeatureHead) else None
        self.load_head = None if isinstance(head, FeatureHead) else head
        self.head_loading = threading.Lock()  # one load, whichever threads ask for the head
        self.prefill_threads = prefill_threads
        # An id no row can emit (every emitted id is below the vocabulary size) stands for none.
        self.eos_token_id = target.config.vocab_size if eos_token_id is None else eos_token_id
        self.target, self.draft = target.eval(), draft.eval() if draft is not None else None
        self.suffix_index, self.compile = suffix_index, compile
        self.device = target.embed.weight.device
        # CUDA graphs replay fixed shapes: there the rounds attend over the whole cache, masked.
        self.static_shapes = self.device.type == "cuda"
        self.max_seq_len = min(
            target.config.max_seq_len, draft.config.max_seq_len if draft else math.inf
        )
        # One compiled round per proposer; inside each, one graph per (K, B, methods, filters).
        self.rounds: dict[tuple, tuple[Proposer | HostProposer, Compiled]] = {}
        # What policies keep across calls: adaptive K's measurements per graph family.
        self.families: dict[tuple, FamilyMeasurements] = {}

    def feature_head(self) -> FeatureHead | None:
        """The feature head, read on first use when the decoder was given a function that loads
        it, and checked against the target as a given head is; None when it has none."""
        if self.load_head is None:  # loaded, or none: without the lock, as a round asks
            return self.head
        with self.head_loading:
            if self.load_head is not None:
                head = check_head(self.load_head(), self.target, "head (as its function loaded it)")
                # A call in flight locked the decoder's models without the head, and must
                # not see it appear (its prefill sets up every model's cache): the head joins
                # them once none is in flight, and every later call locks it too.
                with exclusive([self.target]):
                    self.head, self.load_head = head.eval(), None
        return self.head

    def compiled_round(self, name: str) -> tuple[Proposer | HostProposer, Compiled]:
        """Proposer `name` (PROPOSERS) and its round function (ROUNDS) with the target and that
        proposer bound, compiled; built on first use."""
        key = (name, self.suffix_index is not None)
        if key not in self.rounds:
            needs = PROPOSERS[name].needs
            if needs == "head":
                self.feature_head()
            held = Held(self.target, self.draft, self.suffix_index, self.head)
            proposer = PROPOSERS[name].build(held)
            # The models the round runs: the target and its proposer's.
            drafter = {"draft": self.draft, "head": self.head}.get(needs)
            models = torch.nn.ModuleList(filter(None, (self.target, drafter)))
            compiled = compile_round(
                partial(ROUNDS.get(name, speculative_round), self.target, proposer),
                f"round[{name}]",
                self.compile,
                self.device,
                models,
                str(key),  # what the round bakes in besides the models
                dynamic="key_positions",
            )
            self.rounds[key] = (proposer, compiled)
        return self.rounds[key]

    def models(self) -> tuple:
        """Every model this decoder runs (None where it holds none)."""
        return (self.target, self.draft, self.head)

    @torch.no_grad()
    def prefill(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        k: int,
        uses_draft: bool = True,
        proposer: Proposer | HostProposer | None = None,
    ) -> LoopState:
        """Fill the caches (the target's, the draft's when it drafts, and through its prefill
        hook a `proposer` that reads the target's states) with every prompt token but the last
        (which the first round feeds); k: the widest K of any round. Eager: prefill runs once
        per request, at a width of its own, so compiling it would cost more start-up than it
        saves."""
        b = len(prompts)
        reads_hidden = k and getattr(proposer, "reads_hidden", False)
        models = [self.target] + ([self.draft] if k and uses_draft else [])
        # Every model gets its cache, even one this call does not run: a compiled round's key
        # includes the buffers it may read (and a CUDA graph, their addresses), so a K = 0
        # round compiled before the draft had a cache would be compiled again after it got one.
        for model in filter(None, self.models()):
            model.setup_cache(b)  # kept when it already fits: the models own their caches
        tokens = torch.zeros(b, self.max_seq_len, dtype=torch.long)
        for i, prompt in enumerate(prompts):
            tokens[i, : len(prompt)] = torch.tensor(prompt)
        tokens = tokens.to(self.device)
        # As wide as the longest prompt: eager kernels take any width, and a padded column would
        # be work for nothing. On every core by default: unlike a round, the prefill is large
        # matrix products, compute-bound, once per call.
        width = max(map(len, prompts)) - 1
        lengths, max_new = [len(p) for p in prompts], [p.max_new_tokens for p in params]
        with prefill_threads(self.device, self.prefill_threads):
            hidden = self.target.prefill(tokens[:, :width], hidden=bool(reads_hidden))
            for model in models[1:]:
                model.prefill(tokens[:, :width])
            carried = ()
            if reads_hidden:  # the proposer's hook: its state from the target's
                carried = proposer.prefill(hidden, tokens, torch.tensor(lengths).to(self.device))
        seeds = [p.seed if p.seed is not None else int(torch.randint(2**31, ())) for p in params]
        state = LoopState.start(tokens, lengths, max_new, seeds, k)
        return state._replace(proposer_state=carried)

    def key_positions(self, longest: int, k: int) -> torch.Tensor | None:
        """The cache slots a forward reads when the longest row holds `longest` tokens and the
        forward writes up to k positions past its last: arange(S), S = longest + k rounded up
        to KV_BUCKET, at most max_seq_len. On CUDA, None: the whole cache, masked, so that the
        round's shapes never change and one captured CUDA graph replays every round."""
        if self.static_shapes:
            return None
        live = math.ceil((longest + k) / KV_BUCKET) * KV_BUCKET
        return torch.arange(min(self.max_seq_len, live), device=self.device)

    def generate(
        self,
        prompts: list[list[int]],
        params: list[SamplingParams],
        spec: SpeculativeConfig,
        on_tokens: OnTokens | None = None,
        *,
        warm_up: bool = False,
    ) -> GenerationOutput:
        """Decode every prompt (token ids, BOS first) until EOS or its max_new_tokens.

        `on_tokens(row, ids, origins)` is called as tokens are accepted, for streaming.
        Calls on one model (from this decoder or another on the same model objects) run one at
        a time: a call from another thread waits for the one in flight, and one that would
        wait for a call inside its `on_tokens` (from any thread) raises RuntimeError.
        `warm_up`: run one round at each K the spec allows, then stop, so that every graph this
        call can use is compiled before a timed run.
        """
        check_request(prompts, params, spec, on_tokens, warm_up, self)
        if max(spec.widths) and PROPOSERS[spec.proposer].needs == "head":
            self.feature_head()  # read on first use (and checked) before the models are locked
        # The models' KV caches are a call's one working memory: two calls interleaving their
        # rounds would overwrite each other's entries. Calls from several threads wait (for
        # one inside its on_tokens, they are refused: exclusive).
        with exclusive([m for m in self.models() if m is not None]) as stream, torch.no_grad():
            widest = max(spec.widths)
            # K = 0 only: no proposer runs, and any proposer's round is the baseline.
            proposer, compiled = self.compiled_round(spec.proposer if widest else "draft_model")
            host_proposer = proposer if isinstance(proposer, HostProposer) else None
            uses_draft = PROPOSERS[spec.proposer].needs == "draft"  # its cache follows the tokens
            tree = spec.proposer in TREE_PROPOSERS and widest
            settings = RoundSettings(
                spec.draft_method, spec.rejection_sample_method, self.eos_token_id
            )
            tree_branching = {"tree_branching": spec.tree.branching} if tree else {}
            tree_nodes = spec.verify_width if tree else 0  # the slots it writes past a row's last
            policy = self.policy(spec, params, warm_up, list(map(len, prompts)))
            constraints = row_constraints(params, self.device)
            stats = DecodeStats(spec.num_speculative_tokens, position_accepted=[0] * widest)
            outputs, origins = [[] for _ in prompts], [[] for _ in prompts]
            histories = [list(p) for p in prompts]  # prompt and output: what a host proposer reads
            behind = 0  # tokens (the most of any row) emitted since the proposer last ran
            last_k = 0  # the K of the last round that drafted
            start = time.perf_counter()
            state = self.prefill(prompts, params, widest, uses_draft, proposer if widest else None)
            # A hint for a back end that builds graphs ahead (the AOT builder): the Ks this
            # call may run, built together.
            getattr(compiled, "expect", lambda widths: None)(spec.widths)
            stats.time_prefill = time.perf_counter() - start
            done = False
            while not done:
                # The policy's K, a host proposer's drafts (if any), then Algorithm 1's propose,
                # verify, accept and advance in one compiled call, one host read of its
                # snapshot, the tokens handed out, and the policy told what happened.
                k = policy.plan()
                start, catch_up = time.perf_counter(), 0.0
                longest = max(map(len, histories))  # the batch's largest seq_len, on the host
                if k and host_proposer is not None:  # its propose reads it in the round
                    lookup = host_proposer.host_propose(histories, k).to(self.device)
                    state = state._replace(proposer_state=lookup)
                    stats.time_lookup += time.perf_counter() - start
                # What the proposer has not seen: K = 0 rounds' tokens (and, for one that
                # drafts in parallel, a deeper round's), fed before it drafts again.
                unseen = getattr(proposer, "tokens_behind", lambda behind, *_: behind)
                missed = unseen(behind, last_k, k) if k else 0
                if missed and hasattr(proposer, "catch_up"):
                    catch_up = time.perf_counter()
                    state = proposer.catch_up(state, missed, self.key_positions(longest, 0))
                    catch_up = time.perf_counter() - catch_up
                behind, last_k = (0, k) if k else (behind, last_k)
                key_positions = self.key_positions(longest, max(k, tree_nodes) if k else 0)
                state, snapshot = compiled(
                    state,
                    constraints,
                    key_positions,
                    num_speculative_tokens=k,
                    settings=settings,
                    **tree_branching,
                )
                if host_proposer is not None:  # a lookup serves one round
                    state = state._replace(proposer_state=())
                result = Snapshot.read(snapshot, k)  # the round's one host read
                elapsed = time.perf_counter() - start
                # A compiled round is one guard check; an eager one (the eager tier's too), none.
                stats.count_round(
                    elapsed, host_reads=1, compiled_calls=int(compiled.ran_compiled), k=k
                )
                emit_start = time.perf_counter()
                for i, row in enumerate(result.rows):
                    if row.token_ids:
                        kinds = row.origins
                        outputs[i] += row.token_ids
                        histories[i] += row.token_ids
                        origins[i] += kinds
                        if on_tokens:
                            stream(on_tokens, i, row.token_ids, kinds)
                stats.time_emit += time.perf_counter() - emit_start
                if not k:
                    behind += max(len(row.token_ids) for row in result.rows)
                # The policy's time leaves out a round that compiled, which is not a round's
                # time, and the catch-up: paid once per return from K = 0, charged to one round
                # it would price K > 0 out, which would keep the batch at K = 0.
                seconds = None if compiled.compiled_last else elapsed - catch_up
                done = policy.observe(result, seconds)
            collect(state, stats)
        return GenerationOutput(outputs, origins, stats)

    def policy(
        self,
        spec: SpeculativeConfig,
        params: list[SamplingParams],
        warm_up: bool,
        prompt_lengths: list[int] | None = None,
    ) -> Policy:
        """What chooses each round's K: a fixed K, or adaptive K's policy for "auto"."""
        if spec.num_speculative_tokens != "auto":
            return FixedK(spec.num_speculative_tokens, warm_up)
        return AdaptivePolicy.for_call(
            self.families,
            spec,
            params,
            warm_up,
            prompt_lengths,
            target=self.target,
            draft=self.draft,
            head=self.head,
        )
