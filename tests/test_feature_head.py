"""The feature head as a proposer (minispec/proposers/feature_head.py), checked directly.

The whole-sequence law with the head (T = 0 and T = 1 rows in one batch, token-wise and block
rules) and its power test are in tests/test_decode_exactness.py. Here, deterministic checks of
what keeps it exact and well aimed:
- the q each draft comes with is exactly the filtered distribution of an independent,
  cache-free recomputation of the head's guesses (the exactness bug most reported elsewhere is
  a q taken from other logits than the drafts');
- after rounds, the head's carried guess equals a cache-free forward over the target's true
  states of the whole kept sequence: its cache holds true-state entries for every kept token;
- at temperature 0 its output is the K = 0 output, with and without EOS.
"""

from __future__ import annotations

import copy

import pytest
import torch
from _enumerate import one_thread, random_gpt, random_head  # noqa: F401 (one_thread: a fixture)

from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig, row_constraints
from minispec.proposers import DraftSampling
from minispec.round import RoundSettings, speculative_round
from sampling.constraints import distribution
from sampling.noise import round_noise
from sampling.tree import tree_shape

pytestmark = pytest.mark.usefixtures("one_thread")

VOCAB = 8


def pair_and_head(dtype: torch.dtype = torch.float32):
    target = random_gpt(VOCAB, seed=1, scale=1.5, dtype=dtype, max_seq_len=32)
    return target, random_head(target, seed=3, scale=2.0)


def cache_free(model: torch.nn.Module) -> torch.nn.Module:
    """A copy with no KV cache: its attention is plain causal over the tokens it is given."""
    fresh = copy.deepcopy(model)
    for module in fresh.modules():
        if hasattr(module, "kv_cache"):
            module.kv_cache = None
    return fresh


def reference_guess(target, head, tokens: list[int], extra=()) -> torch.Tensor:
    """The head's guess after a sequence, from the target's true states at every position
    but the last (a cache-free forward of each), then the guesses `extra` (state, next token)
    pairs feed in: [C]."""
    t, h = cache_free(target), cache_free(head)
    ids = torch.tensor([tokens])
    states = t.hidden(ids)[:, :-1]
    nexts = ids[:, 1:]
    for state, token in extra:
        states = torch.cat([states, state[None, None]], 1)
        nexts = torch.cat([nexts, torch.tensor([[token]])], 1)
    positions = torch.arange(states.shape[1])[None]
    return h(t, states, nexts, positions)[0, -1]


PROMPTS = [[3, 5, 1, 2, 6], [1, 6]]
PARAMS = [SamplingParams(1.0, top_k=3, seed=1), SamplingParams(0.7, top_p=0.8, seed=2)]


def started(decoder, k: int):
    proposer, _ = decoder.compiled_round("feature_head")
    return proposer, decoder.prefill(PROMPTS, PARAMS, k, uses_draft=False, proposer=proposer)


@torch.no_grad()
def test_each_q_is_the_filtered_law_of_the_guess_it_was_drawn_from() -> None:
    target, head = pair_and_head()
    decoder = SpeculativeDecoder(target, compile=False, head=head)
    k = 3
    proposer, state = started(decoder, k)
    constraints = row_constraints(PARAMS, torch.device("cpu"))
    noise = round_noise(state.seeds, state.seq_len, k, VOCAB)
    proposal = proposer.propose(state, k, DraftSampling(constraints, noise.draft, "probabilistic"))
    ids = proposal.draft_token_ids
    guesses = [[], []]
    for b, prompt in enumerate(PROMPTS):
        extra = []
        for j in range(k):
            g = reference_guess(target, head, prompt, extra)
            guesses[b].append(g)
            extra.append((g, int(ids[b, j])))
    for j in range(k):
        logits = torch.stack([target.logits(guesses[b][j]) for b in range(2)])
        expected = distribution(logits, constraints)
        torch.testing.assert_close(proposal.draft_probs[:, j], expected, atol=1e-5, rtol=1e-5)
        assert (proposal.draft_probs[:, j].sum(-1) - 1).abs().max() < 1e-5
        assert (expected.gather(1, ids[:, j : j + 1]) > 0).all()  # each draft is in q's support
    # Power: the unfiltered softmax differs, where row 0 filters to its top 3 of 8 tokens.
    raw = torch.stack([target.logits(guesses[b][0]) for b in range(2)]).softmax(-1)
    assert (raw[0] - proposal.draft_probs[0, 0]).abs().max() > 1e-2


@torch.no_grad()
def test_after_rounds_the_guess_is_read_from_true_states() -> None:
    target, head = pair_and_head()
    decoder = SpeculativeDecoder(target, compile=False, head=head)
    k = 3
    proposer, state = started(decoder, k)
    constraints = row_constraints(PARAMS, torch.device("cpu"))
    carried, accepted = state, []
    for _ in range(3):
        carried, snapshot = speculative_round(
            target,
            proposer,
            carried,
            constraints,
            num_speculative_tokens=k,
            settings=RoundSettings("probabilistic", "standard", VOCAB),
        )
        accepted += snapshot[:, k + 2].tolist()
    assert 0 < sum(accepted) < 3 * 2 * k  # rounds with rejections and acceptances
    loop = carried
    for b in range(2):
        tokens = loop.tokens[b, : int(loop.seq_len[b])].tolist()
        expected = reference_guess(target, head, tokens)
        torch.testing.assert_close(loop.proposer_state[b], expected, atol=1e-5, rtol=1e-5)


def run_rounds(proposer, state, widths, catch_up_behind=lambda behind: behind, params=PARAMS):
    """speculative_round at each K of `widths`, with the loop's catch-up before a round that
    drafts after rounds at K = 0 (on catch_up_behind(missed) of the missed positions)."""
    target = proposer.target
    constraints = row_constraints(params, torch.device("cpu"))
    settings = RoundSettings("probabilistic", "standard", VOCAB)
    behind = 0
    for k in widths:
        if k and behind:
            state = proposer.catch_up(state, catch_up_behind(behind), None)
        behind = 0 if k else behind + 1
        state, _ = speculative_round(
            target, proposer, state, constraints, num_speculative_tokens=k, settings=settings
        )
    return state, behind


def guesses_match(target, head, state) -> list[bool]:
    """Per row: is the carried guess a cache-free forward over its kept sequence's true states?"""
    matches = []
    for b in range(len(PROMPTS)):
        tokens = state.tokens[b, : int(state.seq_len[b])].tolist()
        expected = reference_guess(target, head, tokens)
        matches.append(torch.allclose(state.proposer_state[b], expected, atol=1e-5, rtol=1e-5))
    return matches


@torch.no_grad()
def test_rounds_at_k0_keep_the_states_and_catch_up_reads_them() -> None:
    """Under -k auto a round at K = 0 runs no head step: follow_target keeps the target's state
    in the head's target_states, and catch_up runs every missed position before the head drafts
    again. The guess is then read from true states, as after drafting rounds, and so is every
    later one (the catch-up wrote each missed cache entry). Power: the guess carried through
    the K = 0 rounds is stale, and a catch-up over the last position only leaves entries that
    a later round reads wrong."""
    target, head = pair_and_head()
    decoder = SpeculativeDecoder(target, compile=False, head=head)
    proposer, state = started(decoder, 3)
    state, behind = run_rounds(proposer, state, [3, 0, 0, 0])
    assert behind == 3 and not any(guesses_match(target, head, state))
    caught = proposer.catch_up(state, behind, None)
    assert all(guesses_match(target, head, caught))
    state, _ = run_rounds(proposer, caught, [3, 3, 0, 0, 3])
    assert all(guesses_match(target, head, state))
    # Power: the catch-up on the last missed position only
    proposer, state = started(decoder, 3)
    state, _ = run_rounds(proposer, state, [3, 0, 0, 0, 3], catch_up_behind=lambda n: 1)
    assert not all(guesses_match(target, head, state))


@torch.no_grad()
def test_the_caught_up_guess_is_laid_out_as_follow_targets() -> None:
    """One row: catch_up's last guess over 3 positions is a [1, C] view of a [1, 3, C] tensor,
    stride (3C, 1), which .contiguous() keeps (one row is contiguous whatever its stride); the
    compiled rounds guard on strides and compiled the K = 2 graph again for it. It has
    follow_target's layout, (C, 1)."""
    target, head = pair_and_head()
    decoder = SpeculativeDecoder(target, compile=False, head=head)
    proposer, _ = decoder.compiled_round("feature_head")
    state = decoder.prefill(PROMPTS[:1], PARAMS[:1], 3, uses_draft=False, proposer=proposer)
    followed, _ = run_rounds(proposer, state, [3], params=PARAMS[:1])
    state, behind = run_rounds(proposer, followed, [0, 0, 0], params=PARAMS[:1])
    caught = proposer.catch_up(state, behind, None).proposer_state
    assert caught.stride() == followed.proposer_state.stride() == (target.config.d_model, 1)


@torch.no_grad()
def test_each_tree_node_drafts_from_the_guess_along_its_own_path() -> None:
    """--proposer head_tree: the q of each family's first child is the filtered law of a
    cache-free recomputation of the head's guess along the family's root-to-parent path (a
    node that saw a sibling's or a cousin's entry, or missed its own, would differ)."""
    target, head = pair_and_head()
    decoder = SpeculativeDecoder(target, compile=False, head=head)
    proposer, _ = decoder.compiled_round("head_tree")
    tree = tree_shape((2, 2, 1))  # depth 3, 2 + 4 + 4 = 10 nodes
    state = decoder.prefill(PROMPTS, PARAMS, tree.max_depth, uses_draft=False, proposer=proposer)
    constraints = row_constraints(PARAMS, torch.device("cpu"))
    noise = round_noise(state.seeds, state.seq_len, tree.num_nodes, VOCAB)
    sampling = DraftSampling(constraints, noise.draft, "probabilistic")
    proposal = proposer.propose(state, tree, sampling)
    ids, checked = proposal.draft_token_ids, 0
    for parent in range(tree.num_nodes + 1):
        children = tree.children(parent)
        if not children:
            continue
        path = []  # the parent's ancestors below the root, then the parent: node ids
        node = parent
        while node:
            path.insert(0, node)
            node = tree.parent[node]
        logits = []
        for b, prompt in enumerate(PROMPTS):
            extra, guess = [], reference_guess(target, head, prompt)
            for node in path:
                extra.append((guess, int(ids[b, node - 1])))
                guess = reference_guess(target, head, prompt, extra)
            logits.append(target.logits(guess))
        expected = distribution(torch.stack(logits), constraints)
        got = proposal.draft_probs[:, children[0] - 1]
        torch.testing.assert_close(got, expected, atol=1e-5, rtol=1e-5)
        checked += 1
    assert checked == 1 + 2 + 4  # the root and every node above the last depth


@pytest.mark.parametrize("eos", [None, 5])
def test_greedy_head_output_is_the_target_only_output(eos: int | None) -> None:
    """float64, where the verify forward's rounding cannot flip a tie."""
    target, head = pair_and_head(torch.float64)
    decoder = SpeculativeDecoder(target, compile=False, head=head, eos_token_id=eos)
    prompts = [[3, 5], [1, 6, 2, 7, 0], [4, 1]]
    params = lambda: [SamplingParams(0.0, max_new_tokens=m) for m in (14, 9, 12)]  # noqa: E731
    baseline = decoder.generate(prompts, params(), SpeculativeConfig(0)).token_ids
    if eos is not None:
        assert any(eos in row and row[-1] == eos for row in baseline)  # a row stops at EOS
    for k, proposer in ((1, "feature_head"), (3, "feature_head"), (3, "head_tree")):
        spec = SpeculativeConfig(k, "auto", proposer=proposer)
        out = decoder.generate(prompts, params(), spec)
        assert out.token_ids == baseline, (k, proposer)
        assert 0 < out.stats.accepted < out.stats.drafted, (k, proposer)


def test_the_compiled_head_round_gives_the_eager_tokens() -> None:
    """The head's round compiled (torch.compile, one graph) draws what the eager round draws."""
    target, head = pair_and_head()
    params = lambda: [SamplingParams(1.0, seed=i, max_new_tokens=10) for i in range(2)]  # noqa: E731
    spec = SpeculativeConfig(3, "probabilistic", proposer="feature_head")
    outputs = [
        SpeculativeDecoder(target, compile=mode, head=head).generate(PROMPTS, params(), spec)
        for mode in (False, True)
    ]
    assert outputs[0].token_ids == outputs[1].token_ids
    assert outputs[1].stats.compiled_calls == outputs[1].stats.batch_rounds  # one graph a round


def test_the_heads_buffers_are_versioned_as_the_models_are() -> None:
    """CUDA graphs and AOT packages read the buffers of every model a round runs again only
    when its cache_version moves (minispec/compilation/): setup_cache for another batch size
    replaces the head's KV cache and target_states and counts it; for the same size it keeps
    them and does not."""
    _, head = pair_and_head()
    head.setup_cache(2)
    version, states = head.cache_version, head.target_states
    head.setup_cache(2)
    assert head.cache_version == version and head.target_states is states
    head.setup_cache(3)
    assert head.cache_version == version + 1 and head.target_states.shape[0] == 3
