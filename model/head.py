"""A feature head: one small decoder layer that drafts from the target's own final states.

EAGLE's design (Li et al. 2024, arXiv 2401.15077): at position t the head reads the target's
final state f_t (what the target's LM head reads there) and the embedding of the token at
t + 1, projects the pair to its own width, runs one decoder layer over them with its own KV
cache, and projects back to the target's width: a guess g_t at the target's next state f_{t+1}.
The target's frozen LM head turns g_t into logits for the token at t + 2. Drafting deeper feeds
g_t back in place of the state the target has not computed yet.

The head owns no embedding or LM head: it borrows the target's (`embed`, `logits` take the
target), so its checkpoint is its own layer and projections only. Its layer is a `model.gpt`
Block at the head's width, so the KV cache, rotary positions and masking are the target's.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F
from torch import nn

from model.gpt import GPT, Block, CacheLayout, GPTConfig, KVCache, rope_at, rope_tables


@dataclass(frozen=True, slots=True)
class HeadConfig:
    target_width: int = 384  # the target's d_model: the states read and predicted
    d_model: int = 256
    n_head: int = 4
    mlp_hidden: int = 704
    max_seq_len: int = 512
    norm_eps: float = 1e-5

    def block_config(self, vocab_size: int) -> GPTConfig:
        return GPTConfig(
            vocab_size=vocab_size,
            n_layer=1,
            n_head=self.n_head,
            d_model=self.d_model,
            mlp_hidden=self.mlp_hidden,
            max_seq_len=self.max_seq_len,
            norm_eps=self.norm_eps,
        )

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> HeadConfig:
        try:
            fields = json.loads(text)
            if not isinstance(fields, dict):
                raise TypeError("not a JSON object")
            config = cls(**fields)
        except (TypeError, ValueError) as exc:
            raise ValueError(f"head config does not parse: {exc}") from None
        config.block_config(2)  # the layer's own checks: one ValueError for a bad file
        return config


class FeatureHead(nn.Module):
    """(target state f_t, token t+1) -> a guess at the target's state f_{t+1}."""

    def __init__(self, config: HeadConfig, vocab_size: int) -> None:
        super().__init__()
        self.config = config
        block = config.block_config(vocab_size)
        width = config.target_width
        # Both inputs are normed first: a guessed state fed back is on the same scale as a
        # true one, and neither input's scale drowns the other in the projection.
        self.state_norm = nn.RMSNorm(width, eps=config.norm_eps)
        self.token_norm = nn.RMSNorm(width, eps=config.norm_eps)
        self.fc = nn.Linear(2 * width, config.d_model, bias=False)
        self.block = Block(block)
        self.out_norm = nn.RMSNorm(config.d_model, eps=config.norm_eps)
        self.out = nn.Linear(config.d_model, width, bias=False)
        cos, sin = rope_tables(block)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        # [B, max_seq_len, C]: the target's states at positions the head has not read yet
        # (rounds at K = 0 keep them here; the proposer's catch_up reads them). Set up with the
        # KV cache, whose replacement cache_version counts, as GPT's does.
        self.register_buffer("target_states", None, persistent=False)
        self.cache_version = 0
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.normal_(module.weight, std=0.02)

    def setup_cache(self, batch_size: int) -> None:
        """A static KV cache and target_states for `batch_size` rows (kept when they fit)."""
        attn, p = self.block.attn, self.fc.weight
        cache = attn.kv_cache
        fits = cache is not None and cache.k.shape[0] == batch_size
        if fits and cache.k.dtype == p.dtype and cache.k.device == p.device:
            return
        c = self.config
        self.cache_version += 1
        attn.kv_cache = KVCache(
            batch_size, c.n_head, c.max_seq_len, c.d_model // c.n_head, p.dtype, p.device
        )
        shape = (batch_size, c.max_seq_len, c.target_width)
        self.target_states = torch.zeros(shape, dtype=p.dtype, device=p.device)

    def inputs(self, target: GPT, states: torch.Tensor, tokens: torch.Tensor) -> torch.Tensor:
        """The layer's input [B, T, d]: the normed states [B, T, C] and next tokens [B, T]."""
        pair = torch.cat([self.state_norm(states), self.token_norm(target.embed(tokens))], -1)
        return self.fc(pair)

    def forward(
        self,
        target: GPT,
        states: torch.Tensor,
        tokens: torch.Tensor,
        positions: torch.Tensor,
        layout: CacheLayout | torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Guessed next states [B, T, C] from states [B, T, C] and next tokens [B, T] at
        positions [B, T], through the head's cache (the target's masking by position: a
        rejected entry is invisible until rewritten); `layout` as for GPT.hidden."""
        if not isinstance(layout, CacheLayout):
            layout = CacheLayout.causal(positions, layout, self.config.max_seq_len)
        cos, sin = self.rope_at(positions)
        x = self.block(self.inputs(target, states, tokens), cos, sin, layout)
        return self.out(self.out_norm(x))

    def rope_at(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return rope_at(self.rope_cos, self.rope_sin, positions, self.fc.weight.dtype)

    def unrolled(
        self, target: GPT, states: torch.Tensor, tokens: torch.Tensor, depth: int
    ) -> list[torch.Tensor]:
        """Training: the guesses of `depth` drafting steps at every position of whole windows
        (states [B, T, C] from the target, tokens [B, T] the next tokens), no cache.

        Step j at position t reads the guess step j - 1 made at t - 1, and attends as drafting
        does at depth j: to step 0's keys at positions up to t - j (written from true states)
        and to step i's key at t - j + i for i = 1..j (written from guesses while drafting).
        Training on its own guesses is EAGLE-3's "training-time test": it keeps the head's
        aim at depth. Returns one [B, T, C] guess per step."""
        B, T, _ = states.shape
        positions = torch.arange(T, device=tokens.device).expand(B, T)
        cos, sin = self.rope_at(positions)
        attn, scale = self.block.attn, (self.config.d_model // self.config.n_head) ** -0.5
        t = torch.arange(T, device=tokens.device)
        keys, values, guesses = [], [], []
        inputs = states
        for j in range(depth):
            x = self.inputs(target, inputs, tokens)
            q, k, v = attn.qkv(self.block.attn_norm(x), cos, sin)  # [B, H, T, D]
            keys.append(k)
            values.append(v)
            # Step 0's keys up to t - j; step i's key at t - j + i (a shifted diagonal).
            scores = [(q @ keys[0].transpose(-1, -2)) * scale]
            scores[0] = scores[0].masked_fill(t[None, :] > t[:, None] - j, float("-inf"))
            diagonals = []
            for i in range(1, j + 1):
                shift = j - i
                ki, vi = (F.pad(a, (0, 0, shift, 0))[:, :, :T] for a in (keys[i], values[i]))
                s = (q * ki).sum(-1, keepdim=True) * scale
                scores.append(s.masked_fill((t < shift)[:, None], float("-inf")))
                diagonals.append(vi)
            weights = torch.cat(scores, -1).softmax(-1).nan_to_num()
            y = weights[..., :T] @ values[0]
            for i, vi in enumerate(diagonals):
                y = y + weights[..., T + i : T + i + 1] * vi
            x = x + attn.wo(y.transpose(1, 2).reshape(B, T, -1))
            x = x + self.block.mlp(self.block.mlp_norm(x))
            guess = self.out(self.out_norm(x))
            guesses.append(guess)
            # The next step at t reads this step's guess at t - 1 (position 0 reads a zero
            # state, as a 1-token prompt does).
            inputs = F.pad(guess, (0, 0, 1, 0))[:, :T]
        return guesses
