"""A decoder-only GPT in a Llama-like form, with a static KV cache for ragged batches.

Pre-norm (RMSNorm), rotary positions, a SwiGLU MLP, no biases, grouped-query attention when
n_kv_head < n_head, and an embedding tied to the output head unless the config unties it: the
Llama architecture, so Hugging Face Llama folders convert to and from it (model/hf.py). The
model knows nothing of speculation: it maps (tokens, positions) to logits.

A GPTConfig (one frozen dataclass per model) sets its sizes; PRESETS names pairs sized so that
speculative decoding pays on a small CPU: the target's single-token step costs >= 10x the
draft's (c <= 0.1, Leviathan Definition 3.7), and a (K+1)-token verify step little more than a
single-token step (the weights are read once either way). checkpoints/README.md has the shipped
pair's sizes and measured steps.

The cache is what makes speculative decoding cheap to roll back. Each row writes its keys and
values at its own absolute positions, and attention masks keys by position (key <= query).
Entries past a row's position are therefore invisible, so rejecting drafted tokens is just
moving the row's position back; the stale entries are overwritten by the next write. Where a
forward's tokens are written and what each sees is its CacheLayout: that causal order by
default, a tree's (minispec/proposers/tree.py) when siblings share a position.

Attention reads only the cache's first S slots, S given by the caller's `key_positions` (the
arange of the batch's live length): at a large batch the whole cache is what a step reads most,
and most of it lies past every row's position. Masked keys contribute exact zeros, so the logits
do not depend on S as long as it covers every position (bit for bit when S is a multiple of 64,
eagerly: tests/test_model.py). A prompt's prefill (`GPT.prefill`) writes keys and values and
computes nothing that only logits need.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass
from typing import NamedTuple

import torch
import torch.nn.functional as F
from torch import nn

from model.tokenizer import VOCAB_SIZE

# Upper bounds, so that a bad config fails here as one line instead of as an allocation of
# terabytes (or a build of a billion layers) when a model is made from it. They are past any
# open model's depth, context and vocabulary. max_seq_len matters most: it sizes the RoPE
# tables and the KV cache, which no weight in a checkpoint reveals.
SIZE_LIMITS = {"n_layer": 1 << 10, "max_seq_len": 1 << 20, "vocab_size": 1 << 24}


@dataclass(frozen=True, slots=True)
class GPTConfig:
    vocab_size: int = VOCAB_SIZE
    n_layer: int = 4
    n_head: int = 4
    d_model: int = 256
    mlp_hidden: int = 704  # ~8/3 * d_model rounded to a multiple of 64: the usual SwiGLU sizing
    max_seq_len: int = 512
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    # Grouped-query attention (Ainslie et al. 2023): n_head query heads share n_kv_head key/value
    # heads, which shrinks the KV cache. None means n_head (plain multi-head attention), which is
    # also what a checkpoint's JSON config without this field gives.
    n_kv_head: int | None = None
    # The shipped pair ties the output head to the embedding; many imported models do not.
    tie_embeddings: bool = True

    def __post_init__(self) -> None:
        if self.n_kv_head is None:
            object.__setattr__(self, "n_kv_head", self.n_head)  # frozen: set once, here
        # Checked here, not where they are used, so that a checkpoint's config that does not make
        # sense fails as one ValueError at load time.
        self.check_sizes()
        self.check_positive_reals()
        self.check_heads()
        if not isinstance(self.tie_embeddings, bool):
            raise ValueError(
                f"GPTConfig.tie_embeddings must be a bool, got {self.tie_embeddings!r}"
            )

    def check_sizes(self) -> None:
        """Every size a positive int within SIZE_LIMITS. bool is an int subclass: JSON `true` is
        not a size."""
        for name in (
            "vocab_size",
            "n_layer",
            "n_head",
            "n_kv_head",
            "d_model",
            "mlp_hidden",
            "max_seq_len",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value <= 0:
                raise ValueError(f"GPTConfig.{name} must be a positive int, got {value!r}")
            if value > SIZE_LIMITS.get(name, value):
                raise ValueError(
                    f"GPTConfig.{name} must be at most {SIZE_LIMITS[name]:,}, got {value:,}"
                )

    def check_positive_reals(self) -> None:
        """rope_theta and norm_eps: positive, finite numbers."""
        for name in ("rope_theta", "norm_eps"):
            value = getattr(self, name)
            if (
                not isinstance(value, (int, float))
                or isinstance(value, bool)
                or not 0 < value < math.inf
            ):
                raise ValueError(
                    f"GPTConfig.{name} must be a positive finite number, got {value!r}"
                )

    def check_heads(self) -> None:
        """d_model splits into n_head even-sized heads (RoPE rotates pairs), which share the
        n_kv_head key/value heads evenly."""
        if self.d_model % self.n_head or (self.d_model // self.n_head) % 2:
            raise ValueError(
                f"GPTConfig.d_model={self.d_model} must split into n_head={self.n_head} "
                "even-sized heads"
            )
        if self.n_head % self.n_kv_head:
            raise ValueError(
                f"GPTConfig.n_head={self.n_head} must be a multiple of n_kv_head={self.n_kv_head}"
            )

    @property
    def head_dim(self) -> int:
        return self.d_model // self.n_head

    def to_json(self) -> str:
        return json.dumps(dataclasses.asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> "GPTConfig":
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise TypeError("not a JSON object")
            return cls(**fields)
        except (TypeError, ValueError) as exc:  # JSONDecodeError is a ValueError
            raise ValueError(f"model config does not parse: {exc}") from None
        except RecursionError:
            raise ValueError("model config does not parse: nested too deeply") from None


# Named presets. "cpu" has the shipped pair's shapes (its schedule trains them on a CPU); "gpu"
# is a larger pair meant for an accelerator. The draft is deliberately tiny: on a CPU a step's
# cost is its weight traffic plus fixed per-layer overhead, so few, narrow layers keep c small.
PRESETS: dict[str, dict[str, GPTConfig]] = {
    "cpu": {
        "target": GPTConfig(n_layer=6, n_head=6, d_model=384, mlp_hidden=1024, max_seq_len=512),
        "draft": GPTConfig(n_layer=2, n_head=2, d_model=128, mlp_hidden=384, max_seq_len=512),
    },
    "gpu": {
        "target": GPTConfig(n_layer=12, n_head=12, d_model=768, mlp_hidden=2048, max_seq_len=1024),
        "draft": GPTConfig(n_layer=2, n_head=4, d_model=256, mlp_hidden=704, max_seq_len=1024),
    },
    # A seconds-long preset for tests and smoke runs.
    "tiny": {
        "target": GPTConfig(n_layer=2, n_head=2, d_model=64, mlp_hidden=128, max_seq_len=128),
        "draft": GPTConfig(n_layer=1, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=128),
    },
}


class KVCache(nn.Module):
    """Preallocated keys and values, [batch, kv heads, max_seq_len + 1, head_dim]: static shapes.

    The slot past max_seq_len is never written or read. It keeps every view attention reads
    (the first S <= max_seq_len slots) a strict part of the buffer, so that no view is
    contiguous: a compiler would otherwise guard on whether S equals the buffer's length, and
    compile a second graph for the full cache."""

    def __init__(
        self,
        batch_size: int,
        n_head: int,
        max_seq_len: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device,
    ) -> None:
        super().__init__()
        shape = (batch_size, n_head, max_seq_len + 1, head_dim)
        self.register_buffer("k", torch.zeros(shape, dtype=dtype, device=device), persistent=False)
        self.register_buffer("v", torch.zeros(shape, dtype=dtype, device=device), persistent=False)

    def update(
        self, positions: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Write k, v [B, H, T, D] at positions [B, T] (each row its own), return the whole cache.
        An indexed assignment, not scatter_ (docs/algorithm.md says why)."""
        rows = torch.arange(k.shape[0], device=k.device)[:, None]
        # Advanced indices on dims 0 and 2 around a slice index a [B, T, H, D] view.
        self.k[rows, :, positions] = k.transpose(1, 2)
        self.v[rows, :, positions] = v.transpose(1, 2)
        return self.k, self.v

    def move(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        """Copy each row's entries at slots source [B, T] to slots destination [B, T]. Every
        source entry is read before any is written, so the two may overlap."""
        rows = torch.arange(source.shape[0], device=source.device)[:, None]
        k, v = self.k[rows, :, source], self.v[rows, :, source]  # gathered: copies
        self.k[rows, :, destination] = k
        self.v[rows, :, destination] = v


class CacheLayout(NamedTuple):
    """Where a forward's T tokens sit in the KV cache: each token's keys and values are written
    at `slots` [B, T], and it attends to the cache's first S slots where `visible` [B, T, S] is
    True. Built once a forward, read by every layer. `visible` None is a prefill's: the tokens
    are each row's first T, so they attend causally to one another and read no other slot.
    `slots` None: no cache is read or written, and `visible` [B, T, T] says which of the T
    tokens each sees (a parallel drafter's training rows, minispec/commands/train_parallel.py)."""

    slots: torch.Tensor | None
    visible: torch.Tensor | None

    @classmethod
    def causal(
        cls, positions: torch.Tensor, key_positions: torch.Tensor | None, max_seq_len: int
    ) -> CacheLayout:
        """One sequence a row: each token written at its position [B, T], seeing the slots at or
        below it among key_positions [S] (all max_seq_len slots if None)."""
        if key_positions is None:
            key_positions = torch.arange(max_seq_len, device=positions.device)
        return cls(positions, key_positions[None, None, :] <= positions[:, :, None])


def rope_tables(config: GPTConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin of position * frequency, [max_seq_len, head_dim // 2]."""
    half = config.head_dim // 2
    if torch.get_default_device().type == "meta":
        # A model built for its shapes only (checking a checkpoint): computed on the meta
        # device, arange runs through torch's Python reference kernels, which import Dynamo.
        return torch.empty(config.max_seq_len, half), torch.empty(config.max_seq_len, half)
    freqs = config.rope_theta ** (-torch.arange(half, dtype=torch.float64) / half)
    angles = torch.arange(config.max_seq_len, dtype=torch.float64)[:, None] * freqs[None, :]
    return angles.cos().float(), angles.sin().float()


def rope_at(
    cos: torch.Tensor, sin: torch.Tensor, positions: torch.Tensor, dtype: torch.dtype
) -> tuple[torch.Tensor, torch.Tensor]:
    """The tables (rope_tables) at positions [B, T]: [B, 1, T, D/2] each, in `dtype`."""
    return cos[positions][:, None].to(dtype), sin[positions][:, None].to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate the two halves of each head, x [B, H, T, D], by per-token angles cos/sin
    [B, 1, T, D/2]."""
    x1, x2 = x.chunk(2, dim=-1)
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def cached_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, mask: torch.Tensor
) -> torch.Tensor:
    """Softmax attention of q [B, H, T, D] over the cache slots k, v [B, H_kv, S, D], where
    mask [B, 1, T, S] is True (each group of H / H_kv query heads shares a key head).

    Compiled for a CPU, it is written as broadcast products and sums, which Inductor fuses into
    a pass over the keys and a pass over the values, vectorized along D, where SDPA's CPU kernel
    runs a small matrix product per row and head: the faster of the two at decode sizes
    (measured in docs/algorithm.md). Eager, it is SDPA: the broadcast product would be
    materialized, [B, H, T, S, D]. On a GPU SDPA is kept."""
    if not (torch.compiler.is_compiling() and q.device.type == "cpu"):
        gqa = k.shape[1] != q.shape[1]
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, enable_gqa=gqa)
    B, H, T, D = q.shape
    q = q.reshape(B, k.shape[1], -1, T, 1, D)  # [B, H_kv, group, T, 1, D]
    scores = (q * k[:, :, None, None]).sum(-1) * D**-0.5  # [B, H_kv, group, T, S]
    weights = scores.masked_fill(~mask[:, :, None], float("-inf")).softmax(-1)
    return (weights[..., None] * v[:, :, None, None]).sum(-2).reshape(B, H, T, D)


# Compiled for a CPU, a linear over one row (a B = 1 step) is a broadcast product and a sum,
# which Inductor writes as one vectorized pass over the weight: oneDNN's GEMM reads a weight
# at one row about half as fast (docs/benchmarks.md, the steps). From two rows up, the GEMM.
def project(layer: nn.Linear, x: torch.Tensor) -> torch.Tensor:
    """layer(x), x [..., in_features], for a bias-free layer (every linear of this GPT)."""
    if torch.compiler.is_compiling() and x.device.type == "cpu" and x.numel() == x.shape[-1]:
        return (x[..., None, :] * layer.weight).sum(-1)
    return layer(x)


class Attention(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.n_head, self.n_kv_head = config.n_head, config.n_kv_head
        self.head_dim = config.head_dim
        # Rows: the n_head query heads, then n_kv_head key heads, then n_kv_head value heads.
        kv_dim = config.n_kv_head * config.head_dim
        self.qkv_split = (config.d_model, kv_dim, kv_dim)
        self.wqkv = nn.Linear(config.d_model, sum(self.qkv_split), bias=False)
        self.wo = nn.Linear(config.d_model, config.d_model, bias=False)
        self.kv_cache: KVCache | None = None

    def qkv(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Queries, keys and values of x [B, T, C], [B, heads, T, head_dim], rotated by position."""
        B, T, _ = x.shape
        q, k, v = (
            t.view(B, T, -1, self.head_dim).transpose(1, 2)
            for t in project(self.wqkv, x).split(self.qkv_split, -1)
        )
        return apply_rope(q, cos, sin), apply_rope(k, cos, sin), v

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: CacheLayout | None
    ) -> torch.Tensor:
        """No cache, or layout None: a full forward, causal over the T tokens, bypassing any
        cache; a layout without slots: the same, with its `visible` [B, T, T] for the causal
        mask. Else k/v are written to the cache at layout.slots, and read as layout.visible
        says."""
        B, T, C = x.shape
        q, k, v = self.qkv(x, cos, sin)
        among_themselves = layout is not None and layout.slots is None
        cached = self.kv_cache is not None and layout is not None and not among_themselves
        if cached:
            cached_k, cached_v = self.kv_cache.update(layout.slots, k, v)
        if not cached or layout.visible is None:
            # Training, a full recompute or a prefill: attention among the T tokens alone.
            gqa = self.n_kv_head != self.n_head  # SDPA shares each k/v head among a query group
            mask = layout.visible if among_themselves else None
            y = F.scaled_dot_product_attention(
                q,
                k,
                v,
                attn_mask=None if mask is None else mask[:, None],
                is_causal=mask is None,
                enable_gqa=gqa,
            )
        else:
            live = layout.visible.shape[-1]  # views: no slot past them is read
            k, v = cached_k.narrow(2, 0, live), cached_v.narrow(2, 0, live)
            y = cached_attention(q, k, v, layout.visible[:, None])  # [B, 1, T, S]: every head
        return project(self.wo, y.transpose(1, 2).reshape(B, T, C))


class MLP(nn.Module):
    """SwiGLU: down(silu(gate(x)) * up(x))."""

    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.gate = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.up = nn.Linear(config.d_model, config.mlp_hidden, bias=False)
        self.down = nn.Linear(config.mlp_hidden, config.d_model, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return project(self.down, F.silu(project(self.gate, x)) * project(self.up, x))


class Block(nn.Module):
    def __init__(self, config: GPTConfig) -> None:
        super().__init__()
        self.attn_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.attn = Attention(config)
        self.mlp_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.mlp = MLP(config)

    def forward(
        self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, layout: CacheLayout | None
    ) -> torch.Tensor:
        x = x + self.attn(self.attn_norm(x), cos, sin, layout)
        return x + self.mlp(self.mlp_norm(x))


class GPT(nn.Module):
    def __init__(self, config: GPTConfig, init_weights: bool = True) -> None:
        """init_weights=False skips the random init, for a caller that loads every parameter (a
        checkpoint) or only needs their shapes (the meta device, where torch runs normal_ through
        its Python reference kernels, which import Dynamo: a cost a warm start should not pay)."""
        super().__init__()
        self.config = config
        # Allocated, not initialised: reset_parameters (or a checkpoint) sets it. Embedding's own
        # init would only be overwritten, and on the meta device its normal_ imports Dynamo.
        empty = torch.empty(config.vocab_size, config.d_model)
        self.embed = nn.Embedding(config.vocab_size, config.d_model, _weight=empty)
        self.blocks = nn.ModuleList(Block(config) for _ in range(config.n_layer))
        self.norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.lm_head = nn.Linear(config.d_model, config.vocab_size, bias=False)
        if config.tie_embeddings:  # one matrix reads tokens in and writes logits out
            self.lm_head.weight = self.embed.weight
        cos, sin = rope_tables(config)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # Counts the times setup_cache/drop_cache replaced the KV cache buffers, so that code
        # holding the buffers (an ahead-of-time package takes them as inputs) knows to re-read.
        self.cache_version = 0
        if init_weights:
            self.reset_parameters()

    def reset_parameters(self) -> None:
        """A fresh random init (GPT-2's)."""
        self.apply(self._init_weights)
        # GPT-2's scaled init: each residual branch adds to the stream, so shrink the projections
        # that write into it by sqrt(number of branches) to keep activations O(1) at depth.
        for name, p in self.named_parameters():
            if name.endswith(("wo.weight", "down.weight")):
                nn.init.normal_(p, std=0.02 / math.sqrt(2 * self.config.n_layer))

    @staticmethod
    def _init_weights(module: nn.Module) -> None:
        if isinstance(module, (nn.Linear, nn.Embedding)):
            nn.init.normal_(module.weight, std=0.02)

    def num_params(self) -> int:
        return sum(p.numel() for p in self.parameters())  # the tied matrix counts once

    def setup_cache(self, batch_size: int) -> None:
        """Allocate a static KV cache for `batch_size` rows of up to max_seq_len tokens each.

        A cache that already fits (batch size, dtype, device) is kept: stale entries are harmless,
        because every row's keys are masked by position until the row writes them again.
        """
        p = self.embed.weight
        cache = self.blocks[0].attn.kv_cache
        if (
            cache is not None
            and cache.k.shape[0] == batch_size
            and cache.k.dtype == p.dtype
            and cache.k.device == p.device
        ):
            return
        self.cache_version += 1
        for block in self.blocks:
            block.attn.kv_cache = KVCache(
                batch_size,
                self.config.n_kv_head,
                self.config.max_seq_len,
                self.config.head_dim,
                p.dtype,
                p.device,
            )

    def drop_cache(self) -> None:
        """Back to cache-free causal attention (training, full recompute)."""
        self.cache_version += 1
        for block in self.blocks:
            block.attn.kv_cache = None

    def hidden(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        layout: CacheLayout | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens [B, T] -> final states [B, T, C]: the normed top layer the head reads, which a
        feature-drafting proposer reads too. With a cache, the tokens sit at positions [B, T]
        (rows may differ) and in the cache as `layout` says: a CacheLayout (a tree's), or the
        key_positions of CacheLayout.causal, arange(S) past every position (the slots read;
        None: all max_seq_len). Without positions, they are a whole sequence from position 0,
        causal, and no cache is read or written: a model a decoder has left its cache on still
        computes plain logits."""
        B, T = tokens.shape
        if positions is None:
            positions, layout = torch.arange(T, device=tokens.device).expand(B, T), None
        elif not isinstance(layout, CacheLayout):
            layout = CacheLayout.causal(positions, layout, self.config.max_seq_len)
        cos, sin = self.rope_at(positions)
        x = self.embed(tokens)
        for block in self.blocks:
            x = block(x, cos, sin, layout)
        return self.norm(x)

    def logits(self, hidden: torch.Tensor) -> torch.Tensor:
        """The head over final states [..., C]: logits [..., V] in float32."""
        return project(self.lm_head, hidden).float()

    def forward(
        self,
        tokens: torch.Tensor,
        positions: torch.Tensor | None = None,
        layout: CacheLayout | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """tokens [B, T] -> logits [B, T, V] (float32): `hidden`, then the head."""
        return self.logits(self.hidden(tokens, positions, layout))

    def move_cache(self, source: torch.Tensor, destination: torch.Tensor) -> None:
        """Copy every layer's cache entries at slots source [B, T] to destination [B, T] (a
        tree's accepted path, moved to the positions it now holds)."""
        for block in self.blocks:
            block.attn.kv_cache.move(source, destination)

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_at(self.rope_cos, self.rope_sin, positions, self.embed.weight.dtype)

    def prefill(self, tokens: torch.Tensor, hidden: bool = False) -> torch.Tensor | None:
        """Write the keys and values of tokens [B, T], at positions 0..T-1 in every row, into the
        cache: a prompt's prefill. It leaves out what only logits need. Every row starts at 0,
        so attention among the T tokens is plain causal (no mask; the kernel skips the masked
        half), and the last block contributes its keys and values only: its attention output
        and MLP, the final norm and the head feed nothing but logits (an n_layer-th of the
        blocks' work, and the head's), unless `hidden` asks for the final states [B, T, C].
        Right padding is harmless: a pad token sits past its
        row's prompt, where the row's own tokens overwrite it before any query can see it."""
        B, T = tokens.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        layout = CacheLayout(positions, None)  # visible None: causal among the T tokens
        cos, sin = self.rope_at(positions)
        x = self.embed(tokens)
        if hidden:  # a proposer reads the final states: the whole last block runs
            for block in self.blocks:
                x = block(x, cos, sin, layout)
            return self.norm(x)
        *inner, last = self.blocks
        for block in inner:
            x = block(x, cos, sin, layout)
        _, k, v = last.attn.qkv(last.attn_norm(x), cos, sin)
        last.attn.kv_cache.update(positions, k, v)
        return None
