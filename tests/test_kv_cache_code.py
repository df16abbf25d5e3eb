"""The compiled KV-cache write touches only the written slots (issue 9, "steps near the memory
floor"): Inductor's generated code for one cached step must contain no loop over a whole cache.
A scatter_ into the cache buffer made it copy each cache tensor in full, twice, per layer."""

from __future__ import annotations

import re

import torch
from torch._inductor.utils import run_and_get_code

from model.config import GPTConfig
from model.gpt import GPT


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
