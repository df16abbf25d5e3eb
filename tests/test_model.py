"""The GPT and its static KV cache: incremental decoding equals the full forward, rollback is
a change of position, and the step shapes compile once each."""

from __future__ import annotations

import dataclasses

import pytest
import torch
import torch.nn.functional as F
from torch._dynamo.testing import CompileCounterWithBackend

from model.gpt import GPT, GPTConfig

TOL = 1e-4  # the bound on max |cached - full| in float32
SMALL = GPTConfig(n_layer=2, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=64)
V = SMALL.vocab_size


def make_model(config: GPTConfig = SMALL, seed: int = 0) -> GPT:
    """A random model with O(1) activations and logits.

    The training init (std 0.02) gives near-uniform attention and tiny logits, under which a
    wrong mask or a stale cache entry barely moves the output; unit-scale weights make such
    bugs show up far above TOL.
    """
    torch.manual_seed(seed)
    model = GPT(config).eval()
    with torch.no_grad():
        for p in model.parameters():
            if p.dim() >= 2:
                p.normal_(0.0, p.shape[-1] ** -0.5)
    return model


def random_tokens(*shape: int, seed: int) -> torch.Tensor:
    return torch.randint(0, V, shape, generator=torch.Generator().manual_seed(seed))


@torch.no_grad()
def full_forward(model: GPT, tokens: torch.Tensor) -> torch.Tensor:
    """The cache-free reference: causal attention over the whole sequence at once."""
    model.drop_cache()
    return model(tokens)


@torch.no_grad()
def step(model: GPT, tokens: torch.Tensor, starts: list[int]) -> torch.Tensor:
    """One cached forward: row b writes tokens[b] at positions starts[b], starts[b] + 1, ..."""
    T = tokens.shape[1]
    positions = torch.tensor(starts)[:, None] + torch.arange(T)[None, :]
    return model(tokens, positions)


def test_single_row_incremental_equals_full_forward() -> None:
    model = make_model()
    seq = random_tokens(1, 40, seed=1)
    expected = full_forward(model, seq)
    model.setup_cache(1)
    pieces, pos = [], 0
    for T in (
        7,
        1,
        1,
        2,
        5,
        1,
        2,
        5,
        1,
        1,
        2,
        5,
        7,
    ):  # prefill, then draft / [prev, new] / verify steps
        pieces.append(step(model, seq[:, pos : pos + T], [pos]))
        pos += T
    assert pos == seq.shape[1]
    got = torch.cat(pieces, dim=1)
    assert got.dtype == torch.float32 and got.shape == expected.shape
    assert (got - expected).abs().max().item() <= TOL
    assert expected.std().item() > 0.5  # logits are O(1): the bound above is not vacuous


@pytest.mark.parametrize("fill", ["forward", "prefill"])
def test_ragged_batch_incremental_equals_full_forward(fill: str) -> None:
    """Prompts of different lengths, prefilled right-padded with junk, by a cached forward or by
    GPT.prefill (no logits, the last block's keys and values only); each row then decodes at
    its own position, and every row's logits match that row's own full forward."""
    model = make_model()
    prompt_lens, new = [3, 11, 6], 16
    rows = [random_tokens(n + new, seed=10 + b) for b, n in enumerate(prompt_lens)]
    expected = [full_forward(model, row[None])[0] for row in rows]
    P = max(prompt_lens)
    padded = random_tokens(len(rows), P, seed=99)  # junk beyond each prompt: must never be seen
    for b, n in enumerate(prompt_lens):
        padded[b, :n] = rows[b][:n]

    model.setup_cache(len(rows))
    if fill == "prefill":
        with torch.no_grad():
            model.prefill(padded)
    else:
        prefill = step(model, padded, [0] * len(rows))
        for b, n in enumerate(prompt_lens):
            assert (prefill[b, :n] - expected[b][:n]).abs().max().item() <= TOL

    pos = list(prompt_lens)
    done = 0
    for T in (1, 2, 3, 1, 4, 2, 3):  # rows at different positions, one shared step shape
        tokens = torch.stack([rows[b][pos[b] : pos[b] + T] for b in range(len(rows))])
        logits = step(model, tokens, pos)
        for b in range(len(rows)):
            assert (logits[b] - expected[b][pos[b] : pos[b] + T]).abs().max().item() <= TOL, (
                b,
                pos[b],
                T,
            )
            pos[b] += T
        done += T
    assert done == new


def rewind_max_diff(model: GPT) -> float:
    """Largest |cached - fresh| over the steps after a simulated rejection.

    Row 0 drafts 4 junk tokens at p..p+3 that are all rejected: it rewinds to p and continues with
    the real tokens, first as a [B, 2] step (so junk stays in the cache at p+2, p+3 and must be
    invisible), then [B, 1] steps over the stale entries. Row 1 meanwhile accepts everything.
    """
    prompt_lens = [5, 9]
    rows = [random_tokens(n + 10, seed=20 + b) for b, n in enumerate(prompt_lens)]
    fresh = [full_forward(model, row[None])[0] for row in rows]
    junk = random_tokens(4, seed=21)
    model.setup_cache(2)
    P = max(prompt_lens)
    prefill = torch.stack(
        [torch.cat([r[:n], junk.new_zeros(P - n)]) for r, n in zip(rows, prompt_lens)]
    )
    step(model, prefill, [0, 0])
    p0, p1 = prompt_lens
    step(model, torch.stack([junk, rows[1][p1 : p1 + 4]]), [p0, p1])  # row 0's drafts: all junk
    p1 += 4  # row 1 accepted its 4
    worst = 0.0
    for T in (2, 1, 1, 1):  # row 0 restarts at p0: only its position moved back
        tokens = torch.stack([rows[0][p0 : p0 + T], rows[1][p1 : p1 + T]])
        logits = step(model, tokens, [p0, p1])
        worst = max(
            worst,
            (logits[0] - fresh[0][p0 : p0 + T]).abs().max().item(),
            (logits[1] - fresh[1][p1 : p1 + T]).abs().max().item(),
        )
        p0, p1 = p0 + T, p1 + T
    return worst


def test_rewind_after_rejection_equals_fresh_recompute() -> None:
    assert rewind_max_diff(make_model()) <= TOL


def test_rewind_check_catches_a_mask_that_sees_stale_entries(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Power: if attention could see keys up to 2 positions ahead of the query (where the
    rejected drafts still sit), the same check fails by far more than TOL."""
    sdpa = F.scaled_dot_product_attention

    def leaky_sdpa(q, k, v, attn_mask=None, **kwargs):
        if attn_mask is not None:
            attn_mask = attn_mask | attn_mask.roll(1, -1) | attn_mask.roll(2, -1)
        return sdpa(q, k, v, attn_mask=attn_mask, **kwargs)

    model = make_model()
    assert rewind_max_diff(model) <= TOL
    monkeypatch.setattr(F, "scaled_dot_product_attention", leaky_sdpa)
    assert rewind_max_diff(model) > 100 * TOL


@pytest.mark.parametrize("backend", ["aot_eager", pytest.param("inductor", marks=pytest.mark.slow)])
def test_compiled_steps_compile_once_per_shape_and_never_per_position(backend: str) -> None:
    """fullgraph, static shapes: prefill [B, P], draft step [B, 1], [prev, new] step [B, 2] and
    verify [B, K+1] compile one graph each; new position values reuse them.

    "aot_eager" runs the captured graphs through AOT autograd eagerly (no code generation), which
    still checks that the in-place cache writes trace and functionalize, in seconds; "inductor"
    (slow: code generation, ~1 min cold on 2 busy cores) checks the generated kernels' numbers.
    """
    K, B, P = 4, 2, 8
    model = make_model()
    seqs = random_tokens(B, 48, seed=3)
    expected = [full_forward(model, seqs[b : b + 1])[0] for b in range(B)]
    model.setup_cache(B)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend(backend)
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)

    pos = [0, 0]
    shapes_seen: set[int] = set()

    def run(T: int, advance: list[int]) -> None:
        tokens = torch.stack([seqs[b, pos[b] : pos[b] + T] for b in range(B)])
        with torch.no_grad():
            logits = compiled(tokens, torch.tensor(pos)[:, None] + torch.arange(T))
        for b in range(B):
            assert (logits[b] - expected[b][pos[b] : pos[b] + T]).abs().max().item() <= TOL
            pos[b] += advance[b]
        shapes_seen.add(T)
        assert counter.frame_count == len(shapes_seen), f"recompiled at T={T}, positions {pos}"

    run(P, [P, P - 3])  # prefill; row 1's prompt is shorter (right-padded)
    for _ in range(3):  # rounds: rows move apart, so every call sees new position values
        for _ in range(K):
            run(1, [1, 1])
        run(K + 1, [2, K + 1])  # verify: row 0 keeps 1 draft + 1 corrective, row 1 all + bonus
        run(2, [1, 2])
    assert counter.frame_count == 4


def test_embedding_is_tied_to_the_output_head() -> None:
    model = make_model()
    assert model.lm_head.weight is model.embed.weight
    V_, d = model.embed.weight.shape
    all_entries = sum(t.numel() for t in model.state_dict().values())
    assert model.num_params() == all_entries - V_ * d  # the shared matrix counts once
    assert (
        model.to(torch.float64).lm_head.weight is model.embed.weight
    )  # a dtype cast keeps the tie
    model.float()

    # Functionally: zeroing token 7's embedding row zeroes its logit everywhere.
    tokens = random_tokens(2, 10, seed=4)
    tokens[tokens == 7] = 8
    with torch.no_grad():
        model.embed.weight[7].zero_()
    logits = full_forward(model, tokens)
    assert torch.all(logits[..., 7] == 0)
    assert torch.all(logits[..., 8] != 0)


# ---------------------------------------------------------------------------------------------
# Reading only the live slots (key_positions)

LONG = GPTConfig(n_layer=2, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=192)


@torch.no_grad()
def live_and_full(model: GPT, starts: list[int], width: int, live: int) -> tuple:
    """One cached forward of `width` tokens a row at `starts`, reading the first `live` cache
    slots, and the same forward reading all of them, from the same cache contents."""
    tokens = random_tokens(len(starts), width, seed=7)
    positions = torch.tensor(starts)[:, None] + torch.arange(width)[None, :]
    full = model(tokens, positions)
    return model(tokens, positions, torch.arange(live)), full


@pytest.mark.parametrize("width", [1, 5])
def test_reading_the_live_slots_gives_the_full_caches_logits_bit_for_bit(width: int) -> None:
    """Masked keys contribute exact zeros: with S a multiple of 64 past every row's last
    position, a step over ragged rows gives bit-equal logits; so does a prefill reading its own
    width. One bucket short of the longest row, the same comparison fails."""
    model = make_model(LONG)
    model.setup_cache(3)
    prompt = random_tokens(3, 128, seed=5)
    prefill = torch.arange(128).expand(3, 128)
    with torch.no_grad():
        full = model(prompt, prefill)  # every slot read; the slots past 128 hold zeros
        assert torch.equal(model(prompt, prefill, torch.arange(128)), full)
    starts = [3, 50, 123 - width]  # the longest row's last position is 122
    for live in (128, 192):
        logits, full = live_and_full(model, starts, width, live)
        assert torch.equal(logits, full), live
    logits, full = live_and_full(model, starts, width, 64)  # one bucket short for row 2
    assert torch.equal(logits[:2], full[:2])  # rows within 64 slots still read all they need
    assert (logits[2] - full[2]).abs().max() > 100 * TOL


@pytest.mark.parametrize("n_head,n_kv_head", [(2, 2), (4, 2)])
def test_a_compiled_step_reads_every_live_length_with_one_graph(
    n_head: int, n_kv_head: int
) -> None:
    """key_positions' length as a dynamic size (mark_dynamic; every other size static): steps
    whose live length crosses a 64-slot boundary, up to the whole cache, trace one graph per
    step width, and give the eager full-cache logits (the compiled attention is written apart
    from eager's SDPA: cached_attention), with a key head per query head and with two key
    heads each shared by two query heads."""
    model = make_model(dataclasses.replace(LONG, n_head=n_head, n_kv_head=n_kv_head))
    model.setup_cache(2)
    torch._dynamo.reset()
    counter = CompileCounterWithBackend("aot_eager")
    compiled = torch.compile(model, backend=counter, fullgraph=True, dynamic=False)
    tokens = random_tokens(2, 5, seed=8)
    for live in (64, 128, 192):
        for width in (1, 5):
            positions = torch.tensor([[2], [live - 5]]) + torch.arange(width)
            key_positions = torch.arange(live)
            torch._dynamo.mark_dynamic(key_positions, 0)
            with torch.no_grad():
                logits = compiled(tokens[:, :width], positions, key_positions)
                full = model(tokens[:, :width], positions)
            assert (logits - full).abs().max() <= TOL
    assert counter.frame_count == 2  # one graph per width, whatever the live length
