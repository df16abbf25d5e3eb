"""Edge cases and greedy rows, each run through the compiled sampler, the same code eagerly and
the plain reference (tests/_stats.all_implementations asserts the three agree)."""

import math

import pytest
import torch

from sampling import PLACEHOLDER_TOKEN_ID, rejection_sample
from tests._stats import all_implementations, as_logits, constrained_probs

INF = float("inf")
K = 3


def _inputs(target_probs, draft_probs, drafts, *, u=0.5, noise=1.0):
    """One request: target p per position (K+1 rows), draft q (K rows), drafts (K ids),
    uniforms u (scalar or K values) and exponentials E (scalar or V values)."""
    logits = torch.stack([as_logits(p) for p in target_probs])[None]
    vocab_size = logits.shape[-1]
    return dict(
        target_logits=logits,
        draft_token_ids=torch.tensor([drafts]),
        draft_probs=None if draft_probs is None else torch.tensor([draft_probs]).float(),
        uniforms=torch.as_tensor(u, dtype=torch.float64).expand(1, K).contiguous(),
        exponentials=torch.as_tensor(noise, dtype=torch.float32).expand(1, vocab_size).contiguous(),
    )


def test_zero_target_probability_is_never_emitted_even_with_u_zero():
    """p(x) = 0 < q(x): u = 0 would pass a p/q >= u test; the guarded test rejects x, and the
    corrective token comes from tokens with p > 0."""
    p = [0.0, 0.5, 0.5, 0.0]
    q = [0.7, 0.1, 0.1, 0.1]
    for noise in (1.0, [0.0, 1.0, 1.0, 0.0], [INF, 1.0, 1.0, INF], [0.0, INF, INF, 0.0]):
        out = all_implementations(**_inputs([p] * (K + 1), [q] * K, [0, 0, 0], u=0.0, noise=noise))
        assert out.num_accepted.item() == 0
        assert out.token_ids[0, 0].item() in (1, 2)
        out = all_implementations(**_inputs([p] * (K + 1), None, [3, 3, 3], u=0.0, noise=noise))
        assert out.num_accepted.item() == 0 and out.token_ids[0, 0].item() in (1, 2)


def test_exponentials_zero_or_inf_give_no_nan_and_no_zero_weight_token():
    """E = 0 makes a positive weight win outright (score inf); E = inf scores 0, still above
    any zero weight. The bonus row here is p = [0, 0.2, 0.8, 0] with every draft accepted."""
    p = [0.0, 0.2, 0.8, 0.0]
    accept_all = _inputs([p] * (K + 1), None, [2, 2, 2], u=0.0)  # p(2) = 0.8 >= 0
    for noise, bonus in [
        ([0.0, 1.0, 1.0, 0.0], 2),  # 0.8 / 1 beats 0.2 / 1
        ([1.0, 0.0, 1.0, 1.0], 1),  # E = 0 at token 1: score inf wins
        ([0.0, INF, INF, 0.0], 1),  # scores 0 tie: the first positive
        ([INF, INF, 0.0, 0.0], 2),  # E = 0 at a zero weight never wins
        ([0.0, 0.0, 0.0, 0.0], 1),
    ]:  # scores inf tie: the first positive
        accept_all["exponentials"] = torch.tensor([noise])
        out = all_implementations(**accept_all)
        assert out.token_ids.tolist() == [[2, 2, 2, bonus]]


def test_residual_without_mass_falls_back_to_p():
    """q = p, and the draft is a token q never proposes (q(x) = 0 rejects it): max(p - q, 0) is
    all zero, so the corrective token is drawn from p."""
    p = [0.0, 0.0, 1.0]
    out = all_implementations(**_inputs([p] * (K + 1), [p] * K, [1, 2, 2]))
    assert out.token_ids.tolist() == [
        [2, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID, PLACEHOLDER_TOKEN_ID]
    ]
    assert out.num_accepted.tolist() == [0]


def test_zero_draft_probability_rejects():
    """q(x) = 0 rejects x even when p(x) = 1 and u = 0: the draft was not drawn from q."""
    p = [0.0, 1.0, 0.0]
    q = [0.5, 0.0, 0.5]
    out = all_implementations(**_inputs([p] * (K + 1), [q] * K, [1, 1, 1], u=0.0))
    assert out.num_accepted.tolist() == [0]
    assert out.token_ids[0, 0].item() == 1  # the corrective: p - q keeps only token 1


def test_output_layout():
    """n accepted drafts, the corrective token at position n, then placeholders."""
    p = [0.25, 0.25, 0.25, 0.25]
    q = [0.0, 0.0, 0.5, 0.5]
    # p(x) = 0.25 >= u q(x) holds for u = 0.4 (0.2) and fails for u = 0.6 (0.3): two drafts
    # accepted, the third rejected.
    out = all_implementations(**_inputs([p] * (K + 1), [q] * K, [2, 3, 2], u=[0.4, 0.4, 0.6]))
    assert out.num_accepted.tolist() == [2]
    assert out.token_ids[0, :2].tolist() == [2, 3]
    assert out.token_ids[0, 2].item() in (0, 1)  # residual max(p - q, 0) lives on 0 and 1
    assert out.token_ids[0, 3].item() == PLACEHOLDER_TOKEN_ID


# --- greedy rows ------------------------------------------------------------------------------


def _greedy_logits(argmaxes, vocab_size=7, seed=0):
    """Random logits per position whose argmax is the given token."""
    gen = torch.Generator().manual_seed(seed)
    logits = torch.randn(len(argmaxes), vocab_size, generator=gen)
    for row, token in enumerate(argmaxes):
        logits[row, token] = logits[row].max() + 1.0
    return logits


def _greedy(argmaxes_per_row, drafts_per_row, draft_probs=None, temperature=0.0):
    logits = torch.stack([_greedy_logits(a, seed=i) for i, a in enumerate(argmaxes_per_row)])
    batch_size, num_drafts = len(drafts_per_row), len(drafts_per_row[0])
    gen = torch.Generator().manual_seed(9)
    return all_implementations(
        logits,
        torch.tensor(drafts_per_row),
        draft_probs,
        uniforms=torch.rand(batch_size, num_drafts, dtype=torch.float64, generator=gen),
        exponentials=torch.empty(batch_size, logits.shape[-1]).exponential_(generator=gen),
        temperature=temperature,
    )


def test_greedy_perfect_match_takes_the_bonus():
    out = _greedy([[4, 1, 6, 2]], [[4, 1, 6]])
    assert out.token_ids.tolist() == [[4, 1, 6, 2]] and out.num_accepted.tolist() == [3]


def test_greedy_early_mismatch():
    out = _greedy([[4, 1, 6, 2]], [[4, 3, 6]])
    assert out.token_ids.tolist() == [[4, 1, -1, -1]] and out.num_accepted.tolist() == [1]


def test_greedy_rows_with_different_outcomes():
    argmaxes = [[4, 1, 6, 2], [0, 0, 0, 0], [5, 5, 1, 3], [2, 6, 6, 6]]
    drafts = [[4, 1, 6], [1, 0, 0], [5, 5, 0], [2, 6, 1]]
    out = _greedy(argmaxes, drafts)
    assert out.token_ids.tolist() == [[4, 1, 6, 2], [0, -1, -1, -1], [5, 5, 1, -1], [2, 6, 6, -1]]
    assert out.num_accepted.tolist() == [3, 0, 2, 2]


def test_greedy_ignores_q_and_the_randomness():
    """The same greedy rows with an arbitrary (even inconsistent) q give the same output."""
    argmaxes, drafts = [[4, 1, 6, 2], [0, 0, 0, 0]], [[4, 1, 5], [3, 0, 0]]
    q = torch.softmax(torch.randn(2, K, 7, generator=torch.Generator().manual_seed(3)), -1)
    q[0, 2, 5] = 0.0  # even q(x) = 0 does not matter: the rule is argmax equality
    q /= q.sum(-1, keepdim=True)  # (a distribution still: the sampler refuses anything else)
    assert torch.equal(_greedy(argmaxes, drafts, q).token_ids, _greedy(argmaxes, drafts).token_ids)


def test_greedy_ties_go_to_the_first_index():
    """Like torch.argmax: a draft that ties the maximum at a later index is rejected."""
    logits = torch.zeros(1, K + 1, 5)
    logits[..., 1] = logits[..., 3] = 2.0
    kwargs = dict(
        uniforms=torch.zeros(1, K, dtype=torch.float64),
        exponentials=torch.ones(1, 5),
        temperature=0.0,
    )
    out = all_implementations(logits, torch.tensor([[1, 3, 1]]), **kwargs)
    assert out.token_ids.tolist() == [[1, 1, -1, -1]]


def test_greedy_with_one_draft():
    """K = 1 (run on the large-vocabulary shape, which has K = 1)."""
    argmaxes, q = [[3, 5], [3, 5], [2, 2]], torch.full((3, 1, 7), 1 / 7)
    out = _greedy(argmaxes, [[3], [4], [2]], draft_probs=q)
    assert out.token_ids.tolist() == [[3, 5], [3, -1], [2, 2]]
    assert out.num_accepted.tolist() == [1, 0, 1]


def test_mixed_greedy_and_random_rows():
    """Greedy rows keep their exact output next to random rows with other temperatures."""
    argmaxes = [[4, 1, 6, 2], [0, 0, 0, 0], [5, 5, 1, 3], [2, 6, 6, 6]]
    drafts = [[4, 1, 6], [1, 0, 0], [5, 5, 0], [2, 6, 1]]
    temperature = torch.tensor([0.0, 0.7, 0.0, 1.3])
    mixed = _greedy(argmaxes, drafts, temperature=temperature)
    greedy = _greedy(argmaxes, drafts)
    assert torch.equal(mixed.token_ids[[0, 2]], greedy.token_ids[[0, 2]])


# --- top-k and top-p ----------------------------------------------------------------------------


@pytest.mark.parametrize("one_hot", [False, True], ids=["probabilistic", "one-hot"])
def test_emitted_tokens_stay_in_the_kept_set(one_hot):
    """Random logits, per-row temperature, top-k and top-p, 3000 rounds: every emitted token
    has positive probability under the constrained target distribution."""
    gen = torch.Generator().manual_seed(11 + one_hot)
    batch_size, vocab_size = 3000, 19
    logits = torch.randn(batch_size, K + 1, vocab_size, generator=gen) * 2
    temperature = torch.rand(batch_size, generator=gen) + 0.3
    top_k = torch.randint(0, 6, (batch_size,), generator=gen)
    top_p = torch.rand(batch_size, generator=gen, dtype=torch.float64) * 0.9 + 0.05
    q = torch.softmax(torch.randn(batch_size, K, vocab_size, generator=gen), -1)
    drafts = torch.multinomial(q.view(-1, vocab_size), 1, generator=gen).view(batch_size, K)
    out = all_implementations(
        logits,
        drafts,
        None if one_hot else q,
        temperature=temperature,
        top_k=top_k,
        top_p=top_p,
        uniforms=torch.rand(batch_size, K, dtype=torch.float64, generator=gen),
        exponentials=torch.empty(batch_size, vocab_size).exponential_(generator=gen),
    )
    rows, positions = torch.nonzero(out.token_ids >= 0, as_tuple=True)
    for b, j in zip(rows.tolist(), positions.tolist()):
        kept = constrained_probs(
            logits[b, j].double().exp().numpy(),
            float(temperature[b]),
            int(top_k[b]),
            float(top_p[b]),
        )
        assert kept[out.token_ids[b, j]] > 0, (b, j)
    assert len(rows) > batch_size  # some drafts were accepted, so this covers later positions
    assert math.isfinite(float(out.num_accepted.float().mean()))


@pytest.mark.parametrize("method", ["standard", "block"])
def test_greedy_rows_ignore_a_dense_q_next_to_sampled_rows(method: str):
    """A batch whose draft_probs is one dense tensor [B, K, V] (what "auto" drafting gives: a
    one-hot q for a T = 0 row, a sampled q for another): a greedy row gets the argmax-equality
    output whatever its q row holds (here not even one-hot), under block verification too,
    and a sampled row gets what it gets alone. Eager: the rule picks greedy rows per row."""
    argmaxes, drafts = [[4, 1, 6, 2], [0, 0, 0, 0], [5, 5, 1, 3]], [[4, 1, 5], [3, 0, 0], [5, 0, 1]]
    logits = torch.stack([_greedy_logits(a, seed=i) for i, a in enumerate(argmaxes)])
    gen = torch.Generator().manual_seed(4)
    q = torch.softmax(torch.randn(3, K, 7, generator=gen), -1)
    kwargs = dict(
        uniforms=torch.rand(3, K, dtype=torch.float64, generator=gen),
        exponentials=torch.empty(3, 7).exponential_(generator=gen),
        method=method,
        compiled=False,
    )
    temperature = torch.tensor([0.0, 1.0, 0.0])
    mixed = rejection_sample(logits, torch.tensor(drafts), q, temperature=temperature, **kwargs)
    greedy = rejection_sample(logits, torch.tensor(drafts), None, temperature=0.0, **kwargs)
    sampled = rejection_sample(logits, torch.tensor(drafts), q, temperature=1.0, **kwargs)
    assert torch.equal(mixed.token_ids[[0, 2]], greedy.token_ids[[0, 2]])
    assert torch.equal(mixed.token_ids[1], sampled.token_ids[1])
    assert greedy.token_ids.tolist() == [[4, 1, 6, -1], [0, -1, -1, -1], [5, 5, -1, -1]]
