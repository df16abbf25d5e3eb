"""The parallel drafter (minispec/proposers/parallel.py, minispec/commands/train_parallel.py).

- What it trains on is what it sees when it drafts: a training row's outputs at an anchor and
  its mask group equal the proposer's cached forward after that anchor.
- Its cache never keeps a mask's entry under a kept token, whatever K did before (a deeper
  round, rounds at K = 0): every draft forward of a decode returns the logits of a fresh
  cache-free forward over the committed tokens and the masks. Power: without the catch-up a
  deeper round calls for, it does not.
- The q contract: draft_probs is exactly the distribution each draft was drawn from, after the
  row's temperature, top-k and top-p; the inputs are left as they were.
The whole-sequence law and greedy equality: tests/test_decode_exactness.py, with the others.
"""

from __future__ import annotations

import pytest
import torch
from _enumerate import full_logits, one_thread, random_gpt  # noqa: F401 (a fixture)
from test_decode_loop import Recorder, pair, widths_in_turn

import minispec.proposers.parallel
from minispec.commands.train_parallel import draw_anchors, training_rows
from minispec.decode import SpeculativeDecoder
from minispec.params import AdaptiveConfig, SamplingParams, SpeculativeConfig
from minispec.proposers import DraftSampling, ParallelDraftProposer
from minispec.state import LoopState
from model.gpt import CacheLayout
from sampling.constraints import distribution, normalize_params

pytestmark = pytest.mark.usefixtures("one_thread")
VOCAB, MASK = 32, 31  # a tiny vocabulary's last id stands in for the byte 0xFF
CPU = torch.device("cpu")


@pytest.fixture(autouse=True)
def tiny_mask(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(minispec.proposers.parallel, "MASK_TOKEN_ID", MASK)


def test_training_rows_see_what_a_decode_forward_sees() -> None:
    """Each anchor's group in a training row gives the logits the proposer's forward gives
    when that anchor is a row's last token (float64: equal to rounding)."""
    model = random_gpt(VOCAB, seed=3, scale=1.5, dtype=torch.float64, max_seq_len=32, n_layer=2)
    depth, x = 4, torch.randint(0, MASK, (2, 20), generator=torch.Generator().manual_seed(4))
    anchors = draw_anchors(torch.Generator().manual_seed(5), 2, 20, 5, depth)
    tokens, positions, depths, visible = training_rows(x, anchors, depth, MASK)
    trained = model(tokens, positions, CacheLayout(None, visible))
    assert depths.max() == depth and bool((depths[:, :20] == 1).all())
    for b in range(2):
        for i, t in enumerate(anchors[b].tolist()):
            group = 20 + i * (depth - 1) + torch.arange(depth - 1)
            seen = torch.cat([x[b, : t + 1], torch.full((depth - 1,), MASK)])[None]
            fresh = full_logits(model, seen)[0, t:]  # the anchor's output, then the masks'
            expected = torch.cat([trained[b, t : t + 1], trained[b, group]])
            torch.testing.assert_close(expected, fresh, rtol=0, atol=1e-10)
            # Power: one position off is another prediction.
            shifted = full_logits(model, seen[:, 1:])[0, t - 1 :] if t else fresh.flip(0)
            assert (shifted - fresh).abs().max() > 1e-3


def run_parallel(decoder: SpeculativeDecoder, log: list) -> tuple[list[list[int]], list]:
    """Three ragged rows at T = 1 under a K that falls (3 -> 1), returns from K = 0 and rises;
    every draft forward recorded."""
    decoder.draft.forward = Recorder("draft", decoder.draft.forward, log)
    prompts = [[1, 2], [3, 4, 5, 6, 7], [8, 9, 10]]
    params = [SamplingParams(1.0, seed=40 + i, max_new_tokens=14) for i in range(3)]
    spec = SpeculativeConfig(
        "auto", "probabilistic", proposer="parallel", adaptive=AdaptiveConfig(widths=(0, 1, 3))
    )
    out = decoder.generate(prompts, params, spec)
    del decoder.draft.forward
    assert set(out.stats.k_histogram) == {0, 1, 3}
    return [p + o for p, o in zip(prompts, out.token_ids)], log


def draft_mismatch(decoder: SpeculativeDecoder, sequences: list[list[int]], log: list) -> float:
    """Largest |logit - fresh| over the draft forwards: each row of a call is its committed
    tokens up to the call's last real position, then the call's masks."""
    worst = 0.0
    for _, tokens, positions, logits in log:
        for b, sequence in enumerate(sequences):
            real = tokens[b] != MASK
            last = int(positions[b][real].max())
            for p, token in zip(positions[b][real].tolist(), tokens[b][real].tolist()):
                assert token == sequence[p]  # what it feeds below a row's end is committed
            seen = torch.tensor([sequence[: last + 1] + [MASK] * int((~real).sum())])
            fresh = full_logits(decoder.draft, seen)[0]
            worst = max(worst, float((logits[b] - fresh[positions[b]]).abs().max()))
    return worst


def test_no_mask_entry_outlives_its_round(monkeypatch: pytest.MonkeyPatch) -> None:
    widths_in_turn(monkeypatch, [2, 1, 2, 0, 0, 2, 1, 1, 2])
    decoder = SpeculativeDecoder(*pair(vocab=VOCAB), compile=False)
    assert draft_mismatch(decoder, *run_parallel(decoder, [])) <= 1e-4
    # Power: the catch-up after a deeper round (or rounds at K = 0) left out.
    monkeypatch.setattr(ParallelDraftProposer, "tokens_behind", staticmethod(lambda *a: 0))
    assert draft_mismatch(decoder, *run_parallel(decoder, [])) > 1e-2


def test_draft_probs_are_the_law_each_draft_came_from() -> None:
    """Rows at T = 0, 0.7 with top-k 3, 1.3 with top-p 0.8: each q_i equals the constraints'
    distribution of the fresh forward's logits at its position, each draft has q > 0 (a T = 0
    row's is its argmax), and neither the state nor the noise is changed."""
    _, draft = pair(vocab=VOCAB)
    k, prompts = 4, [[1, 2, 3], [4, 5, 6, 7, 8], [9, 10, 11, 12]]
    draft.setup_cache(3)
    width = max(map(len, prompts))
    tokens = torch.tensor([p + [0] * (20 - len(p)) for p in prompts])
    with torch.no_grad():
        draft.prefill(tokens[:, :width])
    state = LoopState.start(tokens, list(map(len, prompts)), [8] * 3, [1, 2, 3], k)
    constraints = normalize_params(
        torch.tensor([0.0, 0.7, 1.3]),
        torch.tensor([0, 3, 0]),
        torch.tensor([1.0, 1.0, 0.8]),
        3,
        CPU,
    )
    noise = torch.empty(3, k, VOCAB).exponential_(generator=torch.Generator().manual_seed(6))
    before = (state.tokens.clone(), noise.clone())
    sampling = DraftSampling(constraints, noise, "probabilistic")
    with torch.no_grad():
        proposal = ParallelDraftProposer(draft).propose(state, k, sampling)
    assert torch.equal(state.tokens, before[0]) and torch.equal(noise, before[1])
    for b, prompt in enumerate(prompts):
        seen = torch.tensor([prompt + [MASK] * (k - 1)])
        logits = full_logits(draft, seen)[0, len(prompt) - 1 :]  # [K, V]
        row = normalize_params(*(c[b : b + 1].expand(k) for c in constraints), k, CPU)
        torch.testing.assert_close(proposal.draft_probs[b], distribution(logits, row))
        chosen = proposal.draft_probs[b].gather(-1, proposal.draft_token_ids[b, :, None])
        assert bool((chosen > 0).all())
        if b == 0:  # T = 0: the argmax, drafted greedily
            assert torch.equal(proposal.draft_token_ids[b], logits.argmax(-1))
