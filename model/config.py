"""Model configuration: one frozen dataclass per model, plus named presets.

The presets are sized so that speculative decoding pays on a small CPU: the target's
single-token step must cost >= 10x the draft's (c <= 0.1, Leviathan Definition 3.7), and a
(K+1)-token verify step must cost little more than a single-token step (the weights are read
once either way). The shipped pair's sizes and measured steps are in checkpoints/README.md.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

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
