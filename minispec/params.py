"""Request and speculation parameters, named as in vLLM's SamplingParams and SpeculativeConfig.

A batch's SamplingParams become one RowConstraints (per-row tensors) once per generate() call;
that one object goes from here to the sampler's kernels.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

from minispec.policies.width_choice import AdaptiveConfig
from minispec.proposers import PROPOSERS  # the registry: its names are what `proposer` takes
from sampling.constraints import RowConstraints, normalize_params
from sampling.rejection_args import REJECTION_SAMPLE_METHODS
from sampling.tree import TREE_SAMPLE_METHODS, TreeShape, tree_shape

# "greedy": every row drafts the draft model's argmax (a one-hot q), whatever its temperature.
# "probabilistic": every row samples from its own filtered q, which for a row at T = 0 is one-hot
# at the argmax, so such a row drafts greedily: the choice is made per row, inside the round.
# "auto" (the default) is "probabilistic" under the name of what it does: greedy drafts at
# T = 0, sampled ones at T > 0 (accepted far more often than argmax ones), in one graph for
# every mix of temperatures.
DRAFT_SAMPLE_METHODS = ("auto", "greedy", "probabilistic")
MAX_SPECULATIVE_TOKENS = 16  # beyond this alpha**K is negligible for any pair we ship
MAX_TREE_NODES = 64  # a verify of more tokens costs several target steps on any device we run


def check_int(name: str, value, kind: str = "an int") -> None:
    """TypeError unless `value` is an integer; a bool is not one here (True is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")


def check_real(name: str, value, rule: str) -> None:
    """TypeError unless `value` is a real number (not a bool, not a str such as "0.5"); a NaN is
    named as such, since "got nan" beside a range reads as a value out of it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{name} is NaN: it must be {rule}")


@dataclass(slots=True)
class SamplingParams:
    """Per-request sampling. temperature 0 is greedy; top_k 0 and top_p 1.0 mean off.

    What a seed promises depends on SpeculativeConfig.rejection_sample_method (every method
    samples the target's law, seeded or not; "up to float rounding": a near-tie between two
    tokens may round differently in a (K+1)-token forward, a batch, or a compiled graph):
    - "drafter_invariant": the seed fixes the tokens, those K = 0 gives with it, for every K,
      "auto", proposer and batch, eager or compiled, up to float rounding;
    - "standard", "block": the seed fixes the tokens for a fixed K and proposer, in any batch,
      up to float rounding. Under K = "auto" the rounds follow measured round times and the
      tokens follow the rounds: the same seed can give other tokens on another run.
    Temperature 0 gives the K = 0 tokens under every method, up to float rounding.
    """

    temperature: float = 1.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None  # None draws one; what a seed fixes: the class docstring
    max_new_tokens: int = 128

    def validate(self) -> None:
        """TypeError for a value of the wrong type, ValueError for one out of range."""
        rule = "finite and >= 0 (0 means greedy)"
        check_real("temperature", self.temperature, rule)
        if not 0 <= self.temperature < math.inf:
            raise ValueError(f"temperature must be {rule}, got {self.temperature}")
        check_int("top_k", self.top_k)
        if not 0 <= self.top_k < 2**63:
            raise ValueError(f"top_k must be in [0, 2**63) (0 means off), got {self.top_k}")
        rule = "in (0, 1] (1 means off)"
        check_real("top_p", self.top_p, rule)
        if not 0 < self.top_p <= 1:
            raise ValueError(f"top_p must be {rule}, got {self.top_p}")
        if self.seed is not None:
            check_int("seed", self.seed, "an int or None")
            if not 0 <= self.seed < 2**32:
                raise ValueError(f"seed must be in [0, 2**32), got {self.seed}")
        check_int("max_new_tokens", self.max_new_tokens)
        if self.max_new_tokens < 1:
            raise ValueError(f"max_new_tokens must be >= 1, got {self.max_new_tokens}")


@dataclass(slots=True)
class SpeculativeConfig:
    """How to speculate. num_speculative_tokens = 0 is plain target-only decoding (the baseline);
    "auto" chooses K each round from adaptive.widths (minispec/policies/)."""

    num_speculative_tokens: int | str = "auto"
    draft_sample_method: str = "auto"
    # "standard" (token-wise), "block" (Sun et al. 2024) or "drafter_invariant" (Daliri et al.
    # 2024: a seed gives the K = 0 tokens); "naive" is the wrong rule, kept to show its bias
    rejection_sample_method: str = "standard"
    proposer: str = "draft_model"
    adaptive: AdaptiveConfig = field(default_factory=AdaptiveConfig)
    # proposer "tree": the candidates each node gets at the first depths, deeper ones a chain;
    # K is the tree's depth. (2,) at K = 4: 2 candidates for the first token, 8 nodes in all.
    tree_branching: tuple[int, ...] = (2,)

    def validate(self) -> None:
        """TypeError for a value of the wrong type, ValueError for one out of range."""
        k = self.num_speculative_tokens
        if isinstance(k, str) and k != "auto":  # a str is the one word "auto", as written
            raise ValueError(f"num_speculative_tokens must be 'auto' or an int, got {k!r}")
        if k != "auto":
            check_int("num_speculative_tokens", k)
            if not 0 <= k <= MAX_SPECULATIVE_TOKENS:
                raise ValueError(
                    f"num_speculative_tokens must be 'auto' or an int in "
                    f"[0, {MAX_SPECULATIVE_TOKENS}], got {k}"
                )
        elif max(self.adaptive.widths) > MAX_SPECULATIVE_TOKENS:
            raise ValueError(
                f"adaptive widths must be at most {MAX_SPECULATIVE_TOKENS}, got "
                f"{self.adaptive.widths}"
            )
        for name, choices in (
            ("draft_sample_method", DRAFT_SAMPLE_METHODS),
            ("rejection_sample_method", REJECTION_SAMPLE_METHODS),
            ("proposer", tuple(PROPOSERS)),
        ):
            value = getattr(self, name)
            if not isinstance(value, str):
                raise TypeError(f"{name} must be a str, got {type(value).__name__}")
            if value not in choices:
                raise ValueError(f"unknown {name} {value!r}; choose from {', '.join(choices)}")
        if self.proposer == "tree":
            self.validate_tree()

    def validate_tree(self) -> None:
        """The tree proposer's limits: a fixed depth, the token-wise rule, a bounded tree."""
        k = self.num_speculative_tokens
        if k == "auto":
            raise ValueError("proposer 'tree' needs a fixed num_speculative_tokens (its depth)")
        if self.rejection_sample_method not in TREE_SAMPLE_METHODS:
            raise ValueError(
                f"proposer 'tree' verifies with rejection_sample_method "
                f"{' or '.join(map(repr, TREE_SAMPLE_METHODS))}, "
                f"not {self.rejection_sample_method!r}"
            )
        branching = self.tree_branching
        tree_shape(branching)  # ValueError for anything but a tuple of ints >= 1
        if k and len(branching) > k:
            raise ValueError(f"tree_branching {branching} is deeper than the tree's depth K = {k}")
        if k and self.tree.num_nodes > MAX_TREE_NODES:
            raise ValueError(
                f"tree_branching {branching} at K = {k} has {self.tree.num_nodes} nodes; "
                f"at most {MAX_TREE_NODES}"
            )

    @property
    def tree(self) -> TreeShape:
        """The tree proposer's shape at depth K: tree_branching, then a chain."""
        k = self.num_speculative_tokens
        return tree_shape(tuple(self.tree_branching) + (1,) * (k - len(self.tree_branching)))

    @property
    def verify_width(self) -> int:
        """The most tokens past a row's last one a round writes to the caches: K, or the tree's
        node count."""
        widest = max(self.widths)
        return self.tree.num_nodes if self.proposer == "tree" and widest else widest

    @property
    def draft_method(self) -> str:
        """The draft sample method the rounds run: "auto" is "probabilistic" (each row greedy
        or sampled by its own temperature), so a T = 0 call and a T > 0 call share graphs."""
        d = self.draft_sample_method
        return "probabilistic" if d == "auto" else d

    @property
    def widths(self) -> tuple[int, ...]:
        """The K each round may use: one for a fixed K, adaptive.widths for "auto"."""
        k = self.num_speculative_tokens
        return self.adaptive.widths if k == "auto" else (k,)


def row_constraints(params: list[SamplingParams], device: torch.device) -> RowConstraints:
    """The batch's temperature, top_k and top_p as [B] tensors on `device`; a filter no request
    uses is None, so the sampler's graph leaves it out."""
    # top_p stays float64, as the sampler's cumulative masses are: in float32, 0.9 would be
    # 0.89999998 and cut off a token whose prefix mass lies between the two.
    top_p = torch.tensor([p.top_p for p in params], dtype=torch.float64)
    return normalize_params(
        torch.tensor([p.temperature for p in params], dtype=torch.float32),
        torch.tensor([p.top_k for p in params]) if any(p.top_k for p in params) else None,
        top_p if any(p.top_p < 1 for p in params) else None,
        len(params),
        device,
        check_values=False,
    )  # each SamplingParams.validate() has checked them
