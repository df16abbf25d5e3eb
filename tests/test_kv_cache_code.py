"""The compiled KV-cache write touches only the written slots (issue 9, "steps near the memory
floor"): Inductor's generated code for one cached step must contain no loop over a whole cache.
A scatter_ into the cache buffer made it copy each cache tensor in full, twice, per layer."""

from __future__ import annotations

import re

import torch
from torch._inductor.utils import run_and_get_code

from model.gpt import GPT, GPTConfig


def test_a_compiled_step_writes_the_cache_in_place() -> None:
    config = GPTConfig(
        vocab_size=64, n_layer=1, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=512
    )
    model = GPT(config).eval()
    model.setup_cache(1)
    shape = tuple(model.blocks[0].attn.kv_cache.k.shape)  # (1, 2, 513, 16): one spare slot
    cache_elements = shape[1] * shape[2] * shape[3]
    step = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        _, sources = run_and_get_code(step, torch.tensor([[3]]), torch.tensor([[7]]))
    source = "\n".join(sources)
    # A copy of a whole cache tensor: a kernel loop bound of its element count, or a fresh
    # buffer of its shape.
    assert not re.search(rf"< ?static_cast<int64_t>\({cache_elements}L\)", source)
    assert f"empty_strided_cpu({shape}" not in source
    # The check has teeth: the cache is in the graph (as an input) and its size appears there.
    assert str(shape) in source


def test_compiled_attention_allocates_no_product_over_slots_and_head_dim() -> None:
    """cached_attention's broadcast products, [B, H, T, S, D], must fuse into their sums: no
    buffer of the generated code spans both the cache slots (S) and the head dimension (D), or
    a B = 64 verify would allocate hundreds of MB a layer. The scores, [.., T, S], do appear."""
    config = GPTConfig(
        vocab_size=64, n_layer=1, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=96
    )
    model = GPT(config).eval()
    model.setup_cache(3)
    slots, head_dim, width = 48, config.head_dim, 5
    positions = torch.tensor([[1], [20], [40]]) + torch.arange(width)
    step = torch.compile(model, fullgraph=True, dynamic=False)
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        _, sources = run_and_get_code(
            step, torch.zeros(3, width, dtype=torch.long), positions, torch.arange(slots)
        )
    shapes = [
        tuple(int(n) for n in dims.split(",") if n.strip())
        for dims in re.findall(r"empty_strided_cpu\(\(([\d, ]+)\)", "\n".join(sources))
    ]
    assert any(shape[-2:] == (width, slots) for shape in shapes), shapes  # the scores
    assert not any(slots in shape and shape[-1] == head_dim for shape in shapes), shapes


def test_a_one_row_step_computes_its_linears_as_sums() -> None:
    """model/gpt.py's `project`: compiled for a CPU, a step of one row runs no GEMM (each linear
    is a product and a sum Inductor fuses), and its logits are the eager ones. Power: a step of
    two rows calls the GEMM."""
    config = GPTConfig(vocab_size=64, n_layer=1, n_head=2, d_model=32, mlp_hidden=64)
    model = GPT(config).eval()
    model.setup_cache(1)
    step = torch.compile(model, fullgraph=True, dynamic=False)
    sources = {}
    with torch.no_grad(), torch._inductor.config.patch(fx_graph_cache=False):
        for width in (1, 2):
            tokens, positions = torch.arange(3, 3 + width)[None], torch.arange(width)[None]
            logits, code = run_and_get_code(step, tokens, positions)
            sources[width] = "\n".join(code)
            torch.testing.assert_close(logits, model(tokens, positions), rtol=1e-5, atol=1e-5)
    gemm = re.compile(r"extern_kernels\.(mm|addmm|bmm)|mkldnn")
    assert not gemm.search(sources[1])
    assert gemm.search(sources[2])
