"""The compiled sampler equals the plain reference (sampling/reference.py) and the same tensor
code run eagerly, bit for bit, on random mixed batches; and it compiles without graph breaks."""

import pytest
import torch
import torch.nn.functional as F

import sampling
from sampling.constraints import _sample_core
from sampling.rejection import _rejection_core
from sampling.rules import RULES
from tests._stats import LARGE, SMALL, all_implementations, pad_to_shape

K, V = SMALL["drafts"], SMALL["vocab"]


def _random_batch(
    gen: torch.Generator, batch_size: int, num_drafts: int, vocab_size: int, filters: bool
) -> dict:
    """Rows of every kind at once: greedy and random rows, several temperatures, per-row top-k
    and top-p (0 and 1.0 meaning off), logits with -inf entries, drafts q with zeros, drafts
    outside q's support, q equal to p, and injected edge randomness (u = 0, E = 0 or inf)."""

    def rand(*shape, dtype=torch.float32):
        return torch.rand(*shape, generator=gen, dtype=dtype)

    logits = torch.randn(batch_size, num_drafts + 1, vocab_size, generator=gen) * 3
    logits[rand(logits.shape) < 0.2] = float("-inf")
    logits[..., 0] = logits[..., 0].clamp(min=-30.0)  # keep every row finite somewhere
    q = torch.softmax(torch.randn(batch_size, num_drafts, vocab_size, generator=gen) * 2, -1)
    q[rand(q.shape) < 0.3] = 0
    q[..., 1] += 1e-3  # keep every row some mass
    q /= q.sum(-1, keepdim=True)
    drafts = torch.multinomial(q.view(-1, vocab_size), 1, generator=gen).view(batch_size, -1)
    stray = rand(drafts.shape) < 0.1  # drafts q never proposes
    drafts[stray] = torch.randint(0, vocab_size, (int(stray.sum()),), generator=gen)
    # Rows where q equals a one-hot p exactly and the draft lies elsewhere: the residual is
    # empty (exactly, in every implementation), so the draw falls back to p.
    same = rand(batch_size) < 0.1
    token = torch.randint(0, vocab_size, (batch_size,), generator=gen)
    one_hot = F.one_hot(token, vocab_size).bool()[:, None]
    logits[same] = torch.where(one_hot[same], 0.0, float("-inf"))
    q[same] = one_hot[same].float().expand(-1, num_drafts, -1)
    drafts[same] = ((token[same] + 1) % vocab_size)[:, None]
    temperature = torch.where(rand(batch_size) < 0.25, 0.0, rand(batch_size) * 2 + 0.1)
    uniforms = rand(batch_size, num_drafts, dtype=torch.float64)
    uniforms[rand(uniforms.shape) < 0.1] = 0.0
    exponentials = torch.empty(batch_size, vocab_size).exponential_(generator=gen)
    exponentials[rand(exponentials.shape) < 0.05] = 0.0
    exponentials[rand(exponentials.shape) < 0.05] = float("inf")
    batch = dict(
        target_logits=logits,
        draft_token_ids=drafts,
        draft_probs=q,
        uniforms=uniforms,
        exponentials=exponentials,
        temperature=temperature,
    )
    if filters:
        top_k = torch.randint(0, vocab_size, (batch_size,), generator=gen)
        top_p = torch.where(rand(batch_size) < 0.3, 1.0, rand(batch_size, dtype=torch.float64))
        batch.update(top_k=top_k, top_p=top_p.clamp(min=0.05))
    return batch


@pytest.mark.parametrize("filters", [False, True], ids=["no filters", "top-k and top-p"])
def test_compiled_equals_plain_on_random_batches(filters):
    """Both draft kinds; a one-hot draft given as None equals the same draft as a dense q."""
    gen = torch.Generator().manual_seed(1 + filters)
    batch = _random_batch(gen, 400, K, V, filters)
    out = all_implementations(**batch)
    assert (out.num_accepted > 0).any() and (out.num_accepted < K).any()

    one_hot = dict(batch, draft_probs=None)
    out_none = all_implementations(**one_hot)
    dense = dict(batch, draft_probs=F.one_hot(batch["draft_token_ids"], V).float())
    padded = pad_to_shape(SMALL, **dense)
    out_dense = sampling.rejection_sample(**padded)
    assert torch.equal(out_none.token_ids, out_dense.token_ids[:400])
    assert torch.equal(out_none.num_accepted, out_dense.num_accepted[:400])


def test_naive_compiled_equals_plain():
    gen = torch.Generator().manual_seed(3)
    batch = _random_batch(gen, 300, K, V, filters=False)
    all_implementations(**batch, method="naive")


def test_large_vocabulary_compiled_equals_plain():
    gen = torch.Generator().manual_seed(4)
    batch = _random_batch(gen, 12, LARGE["drafts"], LARGE["vocab"], filters=False)
    all_implementations(**batch)


def test_no_graph_breaks():
    """One graph, no breaks, for the rejection core with and without draft_probs, with and
    without filters, with and without short proposals, for both exact rules, and for the sample
    core (Dynamo tracing only, nothing is compiled)."""
    gen = torch.Generator().manual_seed(5)
    batch = _random_batch(gen, 4, K, V, filters=True)
    params = sampling.constraints.normalize_params(
        batch["temperature"], batch["top_k"], batch["top_p"], 4, torch.device("cpu")
    )
    num_drafts = torch.tensor([0, 1, 2, K])
    variants = [
        (draft_probs, filters, short, "standard")
        for draft_probs in (batch["draft_probs"], None)
        for filters in ((params.top_k, params.top_p), (None, None))
        for short in (None, num_drafts)
    ]
    variants += [
        (batch["draft_probs"], (None, None), short, "block") for short in (None, num_drafts)
    ]
    for draft_probs, filters, short, method in variants:
        explained = torch._dynamo.explain(_rejection_core)(
            batch["target_logits"],
            batch["draft_token_ids"],
            draft_probs,
            params.temperature,
            *filters,
            batch["uniforms"],
            batch["exponentials"],
            short,
            RULES[method],
        )
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)
    explained = torch._dynamo.explain(_sample_core)(
        batch["target_logits"][:, 0], *params, batch["exponentials"]
    )
    assert (explained.graph_count, explained.graph_break_count) == (1, 0)
