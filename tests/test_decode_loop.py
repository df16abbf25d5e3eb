"""The decode loop's mechanics (issue 4, "Tests"): seeds, stopping, the caches, stats, host
reads, and the compiled path.

Exactness of the output law is tests/test_decode_exactness.py's job; here the questions are
whether each row gets its own reproducible randomness, stops where it must, and whether every
logit the loop computes is the logit a fresh, cache-free forward over the row's real sequence
gives.
"""

from __future__ import annotations

import functools
import sys
import time

import numpy as np
import pytest
import torch
from _enumerate import (
    full_logits,
    one_thread,  # noqa: F401 (a fixture, used by pytestmark)
    perturbed_copy,
    random_gpt,
)

import minispec.compilation.announce
import minispec.decode as decode
import minispec.policies.adaptive
import minispec.round
import minispec.state
import sampling.noise
from minispec.decode import GenerationOutput, SpeculativeDecoder
from minispec.origins import ACCEPTED, BONUS, CORRECTIVE
from minispec.params import AdaptiveConfig, SamplingParams, SpeculativeConfig, row_constraints
from minispec.policies.adaptive import AdaptivePolicy
from minispec.proposers import DraftModelProposer, SuffixIndex, SuffixProposer
from minispec.round import RoundSettings
from minispec.state import LoopState, Snapshot, advance, alpha_statistics
from model.gpt import GPT
from model.tokenizer import EOS_TOKEN_ID, VOCAB_SIZE

pytestmark = pytest.mark.usefixtures("one_thread")


def pair(
    vocab: int = 32, max_seq_len: int = 32, seed: int = 0, mix: float = 0.15, cls: type[GPT] = GPT
) -> tuple[GPT, GPT]:
    """A float32 target with O(1) logits and a draft that agrees with it often, not always."""
    target = random_gpt(vocab, seed, scale=1.5, max_seq_len=max_seq_len, cls=cls)
    return target, perturbed_copy(target, seed + 1, mix)


# ---------------------------------------------------------------------------------------------
# Seeds


def request(seed: int, prompt_len: int = 3) -> tuple[list[int], SamplingParams]:
    return [1 + i % 30 for i in range(prompt_len)], SamplingParams(
        temperature=1.0, seed=seed, max_new_tokens=16
    )


@pytest.mark.parametrize("k,method", [(0, "greedy"), (3, "probabilistic"), (2, "greedy")])
def test_seeded_request_is_reproducible_and_independent_of_its_batch(k: int, method: str) -> None:
    decoder = SpeculativeDecoder(*pair(max_seq_len=128), compile=False)
    spec = SpeculativeConfig(k, method)
    prompt, params = request(seed=1234)

    def tokens_in(batch: list[tuple[list[int], SamplingParams]]) -> list[int]:
        prompts, row_params = zip(*batch)
        out = decoder.generate(list(prompts), list(row_params), spec)
        return out.token_ids[[p for p, _ in batch].index(prompt)]

    alone = tokens_in([(prompt, params)])
    assert tokens_in([(prompt, params)]) == alone  # same seed, same tokens
    # Other rows: a 70-token prompt (a wider prefill: 128 instead of 64 columns), top-k and top-p
    # switched on for the batch (off for our row), other lengths and seeds, our row moved around.
    long_prompt, other = request(seed=7, prompt_len=70)
    other.top_k, other.max_new_tokens = 5, 30
    short_prompt, third = request(seed=99, prompt_len=2)
    third.top_p = 0.9
    assert tokens_in([(long_prompt, other), (prompt, params), (short_prompt, third)]) == alone
    assert tokens_in([(short_prompt, third), (long_prompt, other), (prompt, params)]) == alone
    # ... and the seed matters: another seed gives other tokens.
    assert (
        tokens_in([(prompt, SamplingParams(temperature=1.0, seed=1235, max_new_tokens=16))])
        != alone
    )


# ---------------------------------------------------------------------------------------------
# Stopping


def test_advance_truncates_at_eos_and_max_new_tokens() -> None:
    """The bookkeeping in isolation, K = 3: each row's emitted ids [n accepted + 1, -1 ...]."""
    e, k = EOS_TOKEN_ID, 3
    emitted = torch.tensor(
        [
            [5, 6, e, 7],  # n = 3 but EOS third: keep 3 tokens, done
            [5, 6, 7, 8],  # n = 3, only 2 tokens left under max_new: keep 2, done
            [5, e, e, e],  # n = 0: only the corrective counts; the EOS after it is not emitted
            [5, 6, 7, 8],  # already done: nothing changes
            [e, -1, -1, -1],
        ]
    )  # n = 0, the corrective is EOS: keep it, done
    num_accepted = torch.tensor([3, 3, 0, 3, 0])
    b = len(num_accepted)
    seq_len = torch.tensor([2, 3, 4, 5, 2])
    tokens = torch.zeros(b, 12, dtype=torch.long)
    state = LoopState(
        tokens=tokens,
        seq_len=seq_len,
        generated=torch.tensor([0, 3, 1, 2, 0]),
        max_new=torch.tensor([8, 5, 8, 8, 8]),
        done=torch.tensor([False, False, False, True, False]),
        seeds=torch.zeros(b, dtype=torch.long),
        rounds=torch.zeros(b, dtype=torch.long),
        drafted=torch.zeros(b, dtype=torch.long),
        accepted=torch.zeros(b, dtype=torch.long),
        position_accepted=torch.zeros(b, k, dtype=torch.long),
        alpha_sum=torch.zeros(b, dtype=torch.float64),
        alpha_count=torch.zeros(b, dtype=torch.long),
    )
    num_drafts = torch.full((b,), k)
    alpha_stats = alpha_statistics(state, num_accepted, num_drafts, torch.full((b, k), 0.5))
    new, snapshot = advance(state, emitted, num_accepted, num_drafts, alpha_stats, e)
    counts = [3, 2, 1, 0, 1]
    assert new.seq_len.tolist() == [s + c for s, c in zip(seq_len.tolist(), counts)]
    assert new.generated.tolist() == [3, 5, 2, 2, 1]
    assert new.done.tolist() == [True, True, False, True, True]
    result = Snapshot.read(snapshot, k)
    assert [len(row.token_ids) for row in result.rows] == counts
    assert [row.done for row in result.rows] == new.done.tolist()
    for row in range(b):
        kept = emitted[row, : counts[row]].tolist()
        assert result.rows[row].token_ids == kept
        assert snapshot[row, : k + 1].tolist() == kept + [-1] * (k + 1 - counts[row])
        start = int(seq_len[row])
        assert new.tokens[row, start : start + counts[row]].tolist() == kept
        assert (new.tokens[row, start + counts[row] :] == 0).all()  # nothing written past the count
    assert new.rounds.tolist() == [1, 1, 1, 0, 1]  # the done row is not counted
    assert new.alpha_count.tolist() == [3, 3, 1, 0, 1]  # n + 1 tested, at most K


def test_each_row_stops_at_its_max_new_tokens() -> None:
    """No EOS in a vocabulary of 32: each row runs to exactly its own budget, whatever K+1 does
    not divide and however many tokens its last round would have brought."""
    decoder = SpeculativeDecoder(*pair(), compile=False)
    budgets = [1, 2, 3, 5, 7, 11]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_new_tokens=m) for i, m in enumerate(budgets)
    ]
    out = decoder.generate(
        [[1, 2, 3]] * len(budgets), params, SpeculativeConfig(3, "probabilistic")
    )
    assert [len(t) for t in out.token_ids] == budgets
    assert out.stats.emitted == sum(budgets)


class EOSLeaningGPT(GPT):
    """A GPT whose EOS logit is raised by a constant, so that random rows end on their own."""

    eos_bias = 5.0

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        logits = super().logits(hidden)
        return logits + torch.where(
            torch.arange(logits.shape[-1]) == EOS_TOKEN_ID, self.eos_bias, 0.0
        )


def test_each_row_stops_right_after_its_first_eos() -> None:
    decoder = SpeculativeDecoder(*pair(vocab=VOCAB_SIZE, cls=EOSLeaningGPT), compile=False)
    budgets = [1 + i % 12 for i in range(64)]
    params = [
        SamplingParams(temperature=1.0, seed=i, max_new_tokens=m) for i, m in enumerate(budgets)
    ]
    out = decoder.generate(
        [[256, 1 + i % 7] for i in range(64)], params, SpeculativeConfig(3, "probabilistic")
    )
    ended_on_eos = ran_out = eos_mid_round = 0
    for ids, origins, budget in zip(out.token_ids, out.origins, budgets):
        assert EOS_TOKEN_ID not in ids[:-1]  # nothing follows the first EOS
        assert 1 <= len(ids) <= budget
        if ids[-1] == EOS_TOKEN_ID:
            ended_on_eos += len(ids) < budget
            # An accepted draft EOS: the round's later tokens were cut off.
            eos_mid_round += origins[-1] == ACCEPTED
        else:
            assert len(ids) == budget  # no EOS: the row ran to its budget, not short of it
            ran_out += 1
    # The test has teeth: rows end both ways, and some EOS came in the middle of a round.
    assert ended_on_eos >= 5 and ran_out >= 5 and eos_mid_round >= 1


# ---------------------------------------------------------------------------------------------
# Caches


class Recorder:
    """Wraps a model's forward (or its `hidden`, with `to_logits` its head: the target's verify
    reads final states) and logs (model, tokens, positions, logits) per call."""

    def __init__(self, name: str, forward, log: list, to_logits=None) -> None:
        self.name, self.forward, self.log, self.to_logits = name, forward, log, to_logits

    def __call__(
        self, tokens: torch.Tensor, positions: torch.Tensor, key_positions: torch.Tensor
    ) -> torch.Tensor:
        out = self.forward(tokens, positions, key_positions)
        logits = out if self.to_logits is None else self.to_logits(out)
        self.log.append((self.name, tokens.clone(), positions.clone(), logits.clone()))
        return out


def cache_mismatch(
    decoder: SpeculativeDecoder, prompts: list[list[int]], outputs: list[list[int]], log: list
) -> float:
    """Largest |logit - fresh recompute| over every draft and target call after the prefills.

    A round's calls (the draft steps, then the target's verify) see one sequence per row and
    model: its committed tokens (prompt + final output) up to seq_len, then this round's drafts
    as that model was fed them: the verify's for the target, the draft model's own for it

    Every call must feed the committed tokens where it reaches below seq_len, and return the
    logits of a cache-free forward over its sequence. (A draft call between rounds, catching up
    after rounds without drafts, counts with the next round.)
    """
    worst = 0.0
    models = {"target": decoder.target, "draft": decoder.draft}
    round_calls: list = []
    for call in log:  # the prefills are not forward calls (GPT.prefill)
        round_calls.append(call)
        if call[0] != "target":
            continue
        verify_positions = call[2]
        for b in range(len(prompts)):
            seq_len = int(verify_positions[b, 0]) + 1
            committed = (prompts[b] + outputs[b])[:seq_len]
            seen = {name: list(committed) for name in models}
            for name, tokens, positions, _ in round_calls:
                # Consecutive positions, those below 0 (a catch-up longer than the row) at 0.
                end, t = int(positions[b, -1]), tokens.shape[1]
                assert positions[b].tolist() == [max(p, 0) for p in range(end - t + 1, end + 1)]
                for p, token in zip(positions[b].tolist(), tokens[b].tolist()):
                    if p < len(seen[name]):
                        assert token == seen[name][p], (name, b, p)
                    else:
                        assert p == len(seen[name]), (name, b, p)
                        seen[name].append(token)
            fresh = {
                name: full_logits(model, torch.tensor([seen[name]]))[0]
                for name, model in models.items()
            }
            for name, _, positions, logits in round_calls:
                worst = max(worst, float((logits[b] - fresh[name][positions[b]]).abs().max()))
        round_calls = []
    return worst


def run_recorded(
    decoder: SpeculativeDecoder,
    k: int | str,
    draft_wrapper=None,
    proposer: str = "draft_model",
    prompts: list[list[int]] | None = None,
    temperature: float = 1.0,
) -> tuple[list[list[int]], GenerationOutput, list]:
    """Generate for three ragged rows with both forwards recorded; `draft_wrapper` may alter
    what reaches the draft (the recording sees what the model really got)."""
    log: list = []
    target = decoder.target
    target.hidden = Recorder("target", target.hidden, log, target.logits)
    draft_forward = Recorder("draft", decoder.draft.forward, log)
    decoder.draft.forward = draft_wrapper(draft_forward) if draft_wrapper else draft_forward
    prompts = prompts or [[1, 2], [3, 4, 5, 6, 7], [8, 9, 10]]
    params = [
        SamplingParams(temperature=temperature, seed=20 + i, max_new_tokens=m)
        for i, m in enumerate([14, 9, 12])
    ]
    spec = SpeculativeConfig(
        k, "probabilistic", proposer=proposer, adaptive=AdaptiveConfig(widths=(0, 2, 3))
    )
    out = decoder.generate(prompts, params, spec)
    del decoder.target.hidden, decoder.draft.forward  # back to the models' own
    return prompts, out, log


def test_logits_after_rejections_and_full_acceptance_equal_a_fresh_recompute() -> None:
    decoder = SpeculativeDecoder(*pair(), compile=False)
    k = 3
    prompts, out, log = run_recorded(decoder, k)
    # Both kinds of round happened and were followed by another round of the same row.
    assert any(BONUS in o[:-1] for o in out.origins)
    assert any(CORRECTIVE in o[:-1] for o in out.origins)
    assert cache_mismatch(decoder, prompts, out.token_ids, log) <= 1e-4
    assert max(float(c[3].std()) for c in log) > 0.5  # logits are O(1): the bound is not vacuous


def test_cache_check_catches_a_draft_that_never_sees_its_last_accepted_token() -> None:
    """Power: a loop that fed the draft only [last] (not [previous, last]) would leave x_K out
    of the draft's cache after a round that accepted all K drafts."""

    def last_only(draft_forward):
        return lambda t, p, s: (
            draft_forward(t[:, -1:], p[:, -1:], s) if t.shape[1] == 2 else draft_forward(t, p, s)
        )

    decoder = SpeculativeDecoder(*pair(), compile=False)
    prompts, out, log = run_recorded(decoder, 3, last_only)
    assert any(BONUS in o[:-1] for o in out.origins)
    assert cache_mismatch(decoder, prompts, out.token_ids, log) > 1e-2


def widths_in_turn(monkeypatch: pytest.MonkeyPatch, schedule: list[int]) -> None:
    """Adaptive K's choice replaced by a fixed cycle of width indices (the first round too)."""
    turn = iter(schedule * 100)
    pick = lambda policy: policy.widths[next(turn)]  # noqa: E731
    monkeypatch.setattr(minispec.policies.adaptive.AdaptivePolicy, "choose", pick)


def test_after_rounds_without_drafts_the_draft_catches_up(monkeypatch: pytest.MonkeyPatch) -> None:
    """num_speculative_tokens="auto" with runs of K = 0 rounds between drafting rounds: before
    drafting again, the draft is fed the tokens it missed, so its logits stay those of a fresh
    forward; without the catch-up they would not (the check's power)."""
    widths_in_turn(monkeypatch, [1, 0, 0, 2, 0, 2, 2])
    decoder = SpeculativeDecoder(*pair(), compile=False)
    prompts, out, log = run_recorded(decoder, "auto")
    assert set(out.stats.k_histogram) == {0, 2, 3}
    assert cache_mismatch(decoder, prompts, out.token_ids, log) <= 1e-4
    monkeypatch.setattr(DraftModelProposer, "catch_up", lambda self, state, *args: state)
    prompts, out, log = run_recorded(decoder, "auto")
    assert cache_mismatch(decoder, prompts, out.token_ids, log) > 1e-2


# ---------------------------------------------------------------------------------------------
# Stats and host reads


def test_a_warm_up_runs_each_width_once_and_stops() -> None:
    """warm_up=True compiles every graph a call can use: one round at each adaptive width, in
    order, whatever the rounds choose, and one round for a fixed K; then it stops, with the
    rows far from done."""
    decoder = SpeculativeDecoder(*pair(max_seq_len=40), compile=False)
    params = [SamplingParams(temperature=1.0, seed=i, max_new_tokens=20) for i in range(2)]
    widths = (0, 2, 3)
    for k, expected in (("auto", {0: 1, 2: 1, 3: 1}), (2, {2: 1})):
        spec = SpeculativeConfig(k, adaptive=AdaptiveConfig(widths=widths))
        out = decoder.generate([[1, 2], [3, 4, 5]], params, spec, warm_up=True)
        assert dict(out.stats.k_histogram) == expected, k
        assert all(len(ids) < 20 for ids in out.token_ids)


def test_k0_is_one_token_per_target_forward_and_one_host_sync_per_round() -> None:
    decoder = SpeculativeDecoder(*pair(), compile=False)
    params = [
        SamplingParams(temperature=1.0, seed=i, max_new_tokens=m) for i, m in enumerate([5, 9])
    ]
    stats = decoder.generate([[1, 2], [3, 4, 5]], params, SpeculativeConfig(0)).stats
    assert stats.tokens_per_target_forward == 1.0
    assert stats.rounds == stats.emitted == 14 and stats.batch_rounds == 9
    assert stats.host_syncs == stats.batch_rounds
    assert stats.alpha is None and stats.draft_acceptance_rate is None


def test_a_draft_equal_to_the_target_is_always_accepted() -> None:
    """Greedy, draft == target: every draft passes, so alpha = acceptance rate = 1 and each
    round brings K + 1 tokens (eq. (1) at alpha = 1)."""
    target = random_gpt(32, 3, scale=1.5, max_seq_len=32)
    decoder = SpeculativeDecoder(target, perturbed_copy(target, 4, mix=0.0), compile=False)
    k = 3
    params = [SamplingParams(temperature=0.0, max_new_tokens=12) for _ in range(2)]
    stats = decoder.generate([[1, 2], [3, 4, 5]], params, SpeculativeConfig(k)).stats
    assert stats.alpha == 1.0 and stats.draft_acceptance_rate == 1.0
    assert stats.per_position_acceptance == [1.0] * k
    assert stats.tokens_per_target_forward == stats.mean_acceptance_length == k + 1
    assert stats.host_syncs == stats.batch_rounds == 3


HOST_READS = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__", "nonzero", "numpy")


@pytest.mark.parametrize("k,proposer", [(0, "draft_model"), (3, "draft_model"), ("auto", "suffix")])
def test_the_loop_reads_the_device_once_per_round(
    k: int | str, proposer: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Count every tensor-to-host read made by the loop's modules (minispec/decode.py, round.py,
    state.py, sampling/noise.py) inside generate's rounds (prefill and the final stats copy are
    outside them). sampling/ checks its CPU inputs' values on the host unless told not to, as
    the round tells it, so reads made there do not count. Adaptive K chooses from the snapshot
    the round's read brings, on the host; the suffix lookup reads the host's own tokens."""
    reads: list[str] = []
    modules = (decode, minispec.round, minispec.state, sampling.noise, minispec.policies.adaptive)
    loop_files = {m.__file__ for m in modules}
    for name in HOST_READS:
        method = getattr(torch.Tensor, name)

        def counted(self, *args, _method=method, **kwargs):
            caller = sys._getframe(1).f_code
            if caller.co_filename in loop_files and caller.co_name not in ("prefill", "collect"):
                reads.append(caller.co_name)
            return _method(self, *args, **kwargs)

        monkeypatch.setattr(torch.Tensor, name, counted)
    index = SuffixIndex.build(np.arange(30) % 7, min_match=2)
    decoder = SpeculativeDecoder(*pair(), compile=False, suffix_index=index)
    params = [
        SamplingParams(temperature=1.0, seed=i, max_new_tokens=m) for i, m in enumerate([6, 10])
    ]
    spec = SpeculativeConfig(
        k, "probabilistic", proposer=proposer, adaptive=AdaptiveConfig(widths=(0, 2, 3))
    )
    stats = decoder.generate([[1, 2], [3, 4, 5]], params, spec).stats
    monkeypatch.undo()
    assert stats.batch_rounds > 1 and len(reads) == stats.batch_rounds == stats.host_syncs, reads


# ---------------------------------------------------------------------------------------------
# Parameters reach the sampler as given


class ConstantLogitsGPT(GPT):
    """Logits [log 9 - 1 ulp, 0] at every position: the top token's mass is 0.89999998."""

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        top = torch.nextafter(torch.tensor(9.0).log(), torch.tensor(0.0))
        return torch.stack([top, torch.tensor(0.0)]).expand(*hidden.shape[:-1], 2).clone()


def test_top_p_is_not_rounded_to_float32_on_its_way_to_the_sampler() -> None:
    """top_p = 0.9 must keep the second token here (mass 0.89999998 < 0.9), so it is drawn
    with probability 0.1. In float32, 0.9 is 0.89999998 and that token was never drawn."""
    decoder = SpeculativeDecoder(random_gpt(2, 0, cls=ConstantLogitsGPT), compile=False)
    rows = 400
    params = [
        SamplingParams(temperature=1.0, top_p=0.9, seed=i, max_new_tokens=1) for i in range(rows)
    ]
    out = decoder.generate([[0, 1]] * rows, params, SpeculativeConfig(0))
    # Binomial(400, 0.1): mean 40; fewer than 8 has probability 4e-11.
    assert sum(t == [1] for t in out.token_ids) >= 8


def test_no_compile_means_no_compiled_sampler(monkeypatch: pytest.MonkeyPatch) -> None:
    """compile=False (the CLI's --no-compile) runs sampling/ eagerly too, not through its
    torch.compile'd graphs (which also cost minutes of compiling on a small CPU)."""
    import sampling.constraints

    def refuse(*args, **kwargs):
        raise AssertionError("a compiled sampler graph ran under compile=False")

    monkeypatch.setattr(sampling.constraints, "_compiled", refuse)
    decoder = SpeculativeDecoder(*pair(), compile=False)
    params = [SamplingParams(temperature=1.0, seed=1, max_new_tokens=4)]
    for k in (0, 2):
        assert (
            len(
                decoder.generate([[1, 2]], params, SpeculativeConfig(k, "probabilistic")).token_ids[
                    0
                ]
            )
            == 4
        )


# ---------------------------------------------------------------------------------------------
# The compiled path


def float64_pair() -> tuple[GPT, GPT]:
    target = random_gpt(16, 3, scale=1.5, dtype=torch.float64, max_seq_len=16)
    return target, perturbed_copy(target, 4, mix=0.3)


@pytest.mark.parametrize("k,method", [(0, "greedy"), (2, "greedy"), (3, "probabilistic")])
def test_the_round_is_one_graph(k: int, method: str) -> None:
    """Dynamo traces the whole round (noise, draft steps, verify, sampler, advance) as one
    graph with no break, K = 0 included (tracing only: nothing is compiled)."""
    decoder = SpeculativeDecoder(*float64_pair(), compile=False)
    params = [SamplingParams(temperature=t, top_k=3, seed=1) for t in (0.0, 1.0)]
    state = decoder.prefill([[1, 2], [3, 4, 5]], params, k)
    explained = torch._dynamo.explain(minispec.round.speculative_round)(
        decoder.target,
        decoder.compiled_round("draft_model")[0],
        state,
        row_constraints(params, decoder.device),
        num_speculative_tokens=k,
        settings=RoundSettings(method, "standard", EOS_TOKEN_ID),
    )
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_the_round_with_a_host_proposal_is_one_graph() -> None:
    """A host proposer's lookup in the state, read back by its propose: one graph, no break."""
    index = SuffixIndex.build(np.arange(30) % 7, min_match=2)
    decoder = SpeculativeDecoder(*float64_pair(), compile=False, suffix_index=index)
    params = [SamplingParams(temperature=t, top_k=3, seed=1) for t in (0.0, 1.0)]
    state = decoder.prefill([[1, 2], [3, 4, 5]], params, 2)
    proposer = SuffixProposer(index)
    lookup = proposer.host_propose([[1, 2], [3, 4, 5]], 2)
    explained = torch._dynamo.explain(minispec.round.speculative_round)(
        decoder.target,
        proposer,
        state._replace(proposer_state=lookup),
        row_constraints(params, decoder.device),
        num_speculative_tokens=2,
        settings=RoundSettings("probabilistic", "block", EOS_TOKEN_ID),
    )
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_compiled_round_matches_eager_and_never_recompiles() -> None:
    """The round under torch.compile(fullgraph=True) gives the eager round's tokens on a tiny
    float64 pair (a greedy and a random row, a probabilistic drafter); it compiles one graph,
    and later rounds and calls of the same shape reuse it: one compiled call (one guard check)
    and one host read per round. The rows cross a KV_BUCKET boundary, so the rounds read 64,
    then 128 cache slots: the live length is a dynamic size of the one graph."""
    target = random_gpt(16, 3, scale=1.5, dtype=torch.float64, max_seq_len=160)
    draft = perturbed_copy(target, 4, mix=0.3)
    prompts = [[1, 2] * 29, [3, 4, 5] * 20]  # 58 and 60 tokens: K = 1 reaches slot 64 at once
    assert decode.KV_BUCKET == 64

    def params():
        return [SamplingParams(temperature=t, seed=5, max_new_tokens=8) for t in (0.0, 1.0)]

    spec = SpeculativeConfig(1, "probabilistic")
    eager = SpeculativeDecoder(target, draft, compile=False).generate(prompts, params(), spec)
    compiled = SpeculativeDecoder(target, draft, compile=True)
    lengths: list[int] = []  # the slots each round's forwards read

    def key_positions(longest: int, k: int) -> torch.Tensor:
        lengths.append(len(SpeculativeDecoder.key_positions(compiled, longest, k)))
        return SpeculativeDecoder.key_positions(compiled, longest, k)

    compiled.key_positions = key_positions
    torch._dynamo.utils.counters.clear()
    first = compiled.generate(prompts, params(), spec)
    assert first.token_ids == eager.token_ids
    assert set(lengths) == {64, 128}
    assert torch._dynamo.utils.counters["stats"]["unique_graphs"] == 1
    assert not torch._dynamo.utils.counters["graph_break"]
    with torch._dynamo.config.patch(error_on_recompile=True):
        again = compiled.generate(prompts, params(), spec)
    assert again.token_ids == eager.token_ids
    stats = again.stats
    assert stats.batch_rounds > 1
    assert stats.compiled_calls == stats.host_syncs == stats.batch_rounds


def test_a_tiny_temperature_is_greedy_not_nan() -> None:
    """temperature 1e-39 (1 / T overflows float32) behaves as its limit, greedy decoding:
    same tokens as temperature 0, and a finite alpha."""
    decoder = SpeculativeDecoder(*float64_pair(), compile=False)
    spec = SpeculativeConfig(2, "probabilistic")
    out = {
        t: decoder.generate(
            [[1, 2]], [SamplingParams(temperature=t, seed=1, max_new_tokens=8)], spec
        )
        for t in (0.0, 1e-39)
    }
    assert out[1e-39].token_ids == out[0.0].token_ids
    assert out[1e-39].stats.alpha == pytest.approx(out[0.0].stats.alpha)


def record_round_times(monkeypatch: pytest.MonkeyPatch) -> list[tuple[int, float]]:
    """Every (width, seconds) the round-time table is given, not just its smoothed state."""
    observed: list[tuple[int, float]] = []
    observe = minispec.policies.adaptive.RoundTimes.observe

    def recording_observe(self, k: int, seconds: float, context: float = 0.0) -> None:
        observed.append((k, seconds))
        observe(self, k, seconds, context)

    monkeypatch.setattr(minispec.policies.adaptive.RoundTimes, "observe", recording_observe)
    return observed


def test_auto_k_never_times_a_round_that_compiled(monkeypatch: pytest.MonkeyPatch) -> None:
    """The round-time table that "auto" chooses K by holds round times only: one round that
    compiled (seconds, against a millisecond round) would price its width out for good. Here a
    call with greedy drafts then one with sampled drafts compile one graph family each, in one
    decoder. The compile is
    a stand-in that takes 2 s on the first call of each graph, so that the test costs seconds,
    not Inductor's minutes; what is tested is the loop's bookkeeping around it."""
    monkeypatch.setattr(minispec.compilation.announce.Announced, "seen", set())
    graphs: set[tuple] = set()

    def slow_first_call(fn, **options):
        @functools.wraps(fn)  # fn's signature, as torch.compile keeps it
        def run(*args, **kwargs):
            key = minispec.compilation.announce.describe(args, kwargs)
            if key not in graphs:
                graphs.add(key)
                time.sleep(2.0)
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(torch, "compile", slow_first_call)
    observed = record_round_times(monkeypatch)
    decoder = SpeculativeDecoder(*pair(max_seq_len=40), compile=True)
    prompt, _ = request(0)
    for temperature, method in ((0.0, "greedy"), (1.0, "probabilistic")):
        spec = SpeculativeConfig("auto", method, adaptive=AdaptiveConfig(widths=(2,)))  # K = 2
        params = SamplingParams(temperature=temperature, seed=1, max_new_tokens=12)
        decoder.generate([prompt], [params], spec)
    assert len(graphs) == 2  # the stand-in compiled each family once
    tables = [family.times for family in decoder.families.values()]
    assert len(tables) == 2  # one per family: greedy and probabilistic drafting
    assert all(t.rounds for t in tables)  # both families timed their rounds
    assert observed and max(s for _, s in observed) < 0.5, observed  # no 2 s compile among them


def test_greedy_and_sampled_calls_share_the_round_graph(monkeypatch: pytest.MonkeyPatch) -> None:
    """Under draft_sample_method "auto" each row drafts greedily or by sampling inside the round,
    so a T = 0 call, a T = 1 call and a batch mixing both run one compiled round graph (per
    batch size); explicit "greedy" drafts stay a graph of their own. Adaptive K keeps the
    greedy calls' measurements apart from the others'. The compile is a stand-in that records
    each call's graph key (nothing is compiled)."""
    monkeypatch.setattr(minispec.compilation.announce.Announced, "seen", set())
    keys: list[tuple] = []

    def recording_compile(fn, **options):
        @functools.wraps(fn)  # fn's signature, as torch.compile keeps it
        def run(*args, **kwargs):
            keys.append(minispec.compilation.announce.describe(args, kwargs))
            return fn(*args, **kwargs)

        return run

    monkeypatch.setattr(torch, "compile", recording_compile)
    decoder = SpeculativeDecoder(*pair(max_seq_len=40), compile=True)
    prompt, _ = request(0)

    def graphs(temperatures: tuple[float, ...], method: str = "auto") -> set[tuple]:
        keys.clear()
        params = [SamplingParams(t, seed=1, max_new_tokens=6) for t in temperatures]
        spec = SpeculativeConfig("auto", method, adaptive=AdaptiveConfig(widths=(2,)))  # K = 2
        decoder.generate([prompt] * len(params), params, spec)
        return set(keys)

    assert len(graphs((0.0,))) == 1
    assert graphs((1.0,)) == graphs((0.0,))
    assert graphs((0.0, 1.0)) == graphs((1.0, 1.0)) == graphs((0.0, 0.0))
    assert graphs((0.0,), "greedy").isdisjoint(graphs((0.0,)))
    # Families: (B = 1, T = 0), (B = 1, T = 1), (B = 2, mixed and T = 1), (B = 2, T = 0), greedy.
    assert len(decoder.families) == 5


def test_a_familys_acceptance_carries_over_to_its_next_call() -> None:
    """A draft equal to the target (every draft passes): after one "auto" call the family's
    per-depth acceptance is near 1 at every depth the call ran, and the next call of the family
    starts from it; a fixed K measures nothing."""
    target = random_gpt(32, 3, scale=1.5, max_seq_len=40)
    decoder = SpeculativeDecoder(target, perturbed_copy(target, 4, mix=0.0), compile=False)
    params = [SamplingParams(temperature=0.0, max_new_tokens=12)]
    decoder.generate([[1, 2]], params, SpeculativeConfig(2))
    assert not decoder.families
    spec = SpeculativeConfig("auto", adaptive=AdaptiveConfig(widths=(2, 4)))  # it drafts
    assert decoder.generate([[1, 2]], params, spec).stats.alpha == 1.0
    (family,) = decoder.families.values()
    counts = family.acceptance
    assert counts.reached[0] > 0 and counts.passed == counts.reached  # every draft passed
    rates = counts.rates(spec.adaptive.prior_alpha, spec.adaptive.prior_weight)
    assert min(rates) > spec.adaptive.prior_alpha
    policy = AdaptivePolicy.for_call(
        decoder.families, spec, params, False, target=target, draft=decoder.draft
    )
    assert policy.family is family


def test_auto_k_leaves_the_drafts_catch_up_out_of_round_times(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """After K = 0 rounds the draft model catches up on the tokens it missed (one eager call
    before the next drafting round). That cost is paid once per return from K = 0: timed as
    the round's, it priced K = 2 out at B = 16 (its one timing probe came right after the K = 0
    probe). Here the catch-up takes 0.5 s more; the rounds' times stay milliseconds, while the
    call's stats still count it."""
    catch_up = DraftModelProposer.catch_up
    calls: list[int] = []

    def slow_catch_up(self, state, tokens_behind, key_positions):
        calls.append(tokens_behind)
        time.sleep(0.5)
        return catch_up(self, state, tokens_behind, key_positions)

    monkeypatch.setattr(DraftModelProposer, "catch_up", slow_catch_up)
    widths_in_turn(monkeypatch, [0, 0, 1, 1])  # each width twice in a row: each is timed
    observed = record_round_times(monkeypatch)
    decoder = SpeculativeDecoder(*pair(max_seq_len=40), compile=False)
    spec = SpeculativeConfig("auto", adaptive=AdaptiveConfig(widths=(0, 2)))
    prompt, _ = request(0)
    params = SamplingParams(temperature=0.0, seed=1, max_new_tokens=12)
    stats = decoder.generate([prompt], [params], spec).stats
    assert calls, "no round at K = 2 followed one at K = 0"
    assert {k for k, _ in observed} == {0, 2}
    assert max(s for _, s in observed) < 0.5, observed
    assert stats.time_round >= 0.5 * len(calls)
