"""Request and speculation parameters, named as in vLLM's SamplingParams and SpeculativeConfig.

A batch's SamplingParams become one RowConstraints (per-row tensors) once per generate() call;
that one object goes from here to the sampler's kernels.

The checks are here too, once: a decoder's models and settings when it is built
(`check_decoder`), each request before anything is computed (`check_request`). Every bad input
raises one ValueError (TypeError for a wrong type) that names it; the API and the command line
rely on them.
"""

from __future__ import annotations

import math
import numbers
from dataclasses import dataclass, field

import torch

from minispec.proposers import PROPOSERS  # the registry: its names are what `proposer` takes
from minispec.rules import (  # the rules of the values, torch-free: `minispec decode` shares them
    DEFAULT_TREE_BRANCHING,
    DRAFT_SAMPLE_METHODS,
    MAX_SPECULATIVE_TOKENS,
    RANGES,
    TREE_PROPOSERS,
    check_range,
    check_tree,
    head_problem,
)
from model.gpt import GPT
from model.head import FeatureHead
from model.tokenizer import BOS_TOKEN_ID, VOCAB_SIZE
from sampling.constraints import RowConstraints
from sampling.rejection_args import REJECTION_SAMPLE_METHODS
from sampling.tree import TreeShape, tree_shape


def check_int(name: str, value, kind: str = "an int") -> None:
    """TypeError unless `value` is an integer; a bool is not one here (True is not a count)."""
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise TypeError(f"{name} must be {kind}, got {type(value).__name__}")


def check_real(name: str, value) -> None:
    """TypeError unless `value` is a real number (not a bool, not a str such as "0.5"); a NaN is
    named as such, since "got nan" beside a range reads as a value out of it."""
    if isinstance(value, bool) or not isinstance(value, numbers.Real):
        raise TypeError(f"{name} must be a number, got {type(value).__name__}")
    if math.isnan(value):
        raise ValueError(f"{name} is NaN: it must be {RANGES[name][0]}")


def check_branching(branching) -> None:
    """TypeError unless `branching` (SpeculativeConfig.tree_branching) is a tuple of ints."""
    if not isinstance(branching, tuple):
        raise TypeError(f"tree_branching must be a tuple of ints, got {type(branching).__name__}")
    for i, b in enumerate(branching):
        check_int(f"tree_branching[{i}]", b)


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
        check_real("temperature", self.temperature)
        check_range("temperature", self.temperature)
        check_int("top_k", self.top_k)
        check_range("top_k", self.top_k)
        check_real("top_p", self.top_p)
        check_range("top_p", self.top_p)
        if self.seed is not None:
            check_int("seed", self.seed, "an int or None")
            check_range("seed", self.seed)
        check_int("max_new_tokens", self.max_new_tokens)
        check_range("max_new_tokens", self.max_new_tokens)


@dataclass(frozen=True, slots=True)
class AdaptiveConfig:
    """num_speculative_tokens="auto": the widths it chooses from and how it measures them
    (minispec/policies/adaptive.py)."""

    widths: tuple[int, ...] = (0, 2, 4, 8)  # each is one compiled round shape
    prior_alpha: float = 0.7  # a draft's chance to pass before any was measured
    prior_weight: float = 8.0  # that prior, and each depth's pull to the one above, in counts
    decay: float = 0.99  # per round with drafts: about the last 100 such rounds' counts matter
    margin: float = 0.03  # another width must promise to finish this much sooner
    retime_after: int = 1024  # rounds of a family after which a width's time is taken again
    probe_within: float = 1.15  # ... if its predicted time is within this factor of the best

    def __post_init__(self) -> None:
        w = self.widths
        if not (w and all(isinstance(k, int) and k >= 0 for k in w) and list(w) == sorted(set(w))):
            raise ValueError(f"widths must be distinct ints >= 0 in increasing order, got {w!r}")
        if not 0 <= self.prior_alpha <= 1:
            raise ValueError(f"prior_alpha must be in [0, 1], got {self.prior_alpha}")
        if not self.prior_weight > 0:
            raise ValueError(f"prior_weight must be > 0, got {self.prior_weight}")
        if not 0 <= self.decay < 1:
            raise ValueError(f"decay must be in [0, 1), got {self.decay}")
        if not self.margin >= 0:
            raise ValueError(f"margin must be >= 0, got {self.margin}")
        if not (isinstance(self.retime_after, int) and self.retime_after >= 1):
            raise ValueError(f"retime_after must be an int >= 1, got {self.retime_after!r}")
        if not self.probe_within >= 1:
            raise ValueError(f"probe_within must be >= 1, got {self.probe_within}")


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
    tree_branching: tuple[int, ...] = DEFAULT_TREE_BRANCHING

    def validate(self) -> None:
        """TypeError for a value of the wrong type, ValueError for one out of range."""
        if not isinstance(self.adaptive, AdaptiveConfig):
            raise TypeError(
                f"adaptive must be an AdaptiveConfig (minispec.params), got "
                f"{type(self.adaptive).__name__}"
            )
        k = self.num_speculative_tokens
        if isinstance(k, str) and k != "auto":  # a str is the one word "auto", as written
            raise ValueError(f"num_speculative_tokens must be 'auto' or an int, got {k!r}")
        if k != "auto":
            check_int("num_speculative_tokens", k)
            check_range("num_speculative_tokens", k)
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
        if self.proposer in TREE_PROPOSERS:
            self.validate_tree()
        else:  # its type still: a wrong one is refused, not ignored
            check_branching(self.tree_branching)

    def validate_tree(self) -> None:
        """The tree proposer's limits (check_tree): a fixed depth, the token-wise rule, a tree
        bounded by its node count, which is computed before any tree is built."""
        check_branching(self.tree_branching)
        check_tree(self.num_speculative_tokens, self.rejection_sample_method, self.tree_branching)

    @property
    def tree(self) -> TreeShape:
        """The tree proposer's shape at depth K: tree_branching, then a chain. Its limits are
        checked first, so that a tree too large to draft is refused before it is built."""
        self.validate_tree()
        k = self.num_speculative_tokens
        if not k:  # check_tree bounds a tree of depth K, and K = 0 drafts none
            raise ValueError("num_speculative_tokens 0 drafts no tree")
        branching = tuple(map(int, self.tree_branching))  # numpy ints too, as check_int takes
        return tree_shape(branching + (1,) * (k - len(branching)))

    @property
    def verify_width(self) -> int:
        """The most tokens past a row's last one a round writes to the caches: K, or the tree's
        node count."""
        widest = max(self.widths)
        return self.tree.num_nodes if self.proposer in TREE_PROPOSERS and widest else widest

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
    """The batch's temperature, top_k and top_p as [B] tensors on `device`, as the sampler takes
    them unchecked; a filter no request uses is None, so the sampler's graph leaves it out."""
    rows = lambda values, dtype: torch.tensor(values, dtype=dtype, device=device)  # noqa: E731
    # top_p stays float64, as the sampler's cumulative masses are: in float32, 0.9 would be
    # 0.89999998 and cut off a token whose prefix mass lies between the two.
    return RowConstraints(
        rows([p.temperature for p in params], torch.float32),
        rows([p.top_k for p in params], torch.int64) if any(p.top_k for p in params) else None,
        rows([p.top_p for p in params], torch.float64)
        if any(p.top_p < 1 for p in params)
        else None,
    )


def check_decoder(
    target: GPT, draft: GPT | None, head, compile, eos_token_id, prefill_threads
) -> None:
    """SpeculativeDecoder's arguments."""
    for name, model in (("target", target), ("draft", draft)):
        if not (isinstance(model, GPT) or (name == "draft" and model is None)):
            kind = "a GPT" + (" or None" if name == "draft" else "")
            raise TypeError(f"{name} must be {kind}, got {type(model).__name__}")
    for name, model in (("target", target), ("draft", draft)):
        if model is not None:
            check_not_meta(name, model)
    if compile not in (True, False, "aot", "auto"):
        raise ValueError(f'compile must be True, False, "aot" or "auto", got {compile!r}')
    if eos_token_id is not None and (
        isinstance(eos_token_id, bool) or not isinstance(eos_token_id, int) or eos_token_id < 0
    ):
        raise ValueError(f"eos_token_id must be an int >= 0 or None, got {eos_token_id!r}")
    if prefill_threads is not None and (
        isinstance(prefill_threads, bool)
        or not isinstance(prefill_threads, int)
        or prefill_threads < 1
    ):
        raise ValueError(f"prefill_threads must be an int >= 1 or None, got {prefill_threads!r}")
    if draft is not None and draft.config.vocab_size != target.config.vocab_size:
        raise ValueError(
            f"draft vocabulary ({draft.config.vocab_size}) differs from the "
            f"target's ({target.config.vocab_size})"
        )
    loads_head = callable(head) and not isinstance(head, torch.nn.Module)
    if not (head is None or isinstance(head, FeatureHead) or loads_head):
        raise TypeError(
            f"head must be a FeatureHead, a function that loads one, or None, got "
            f"{type(head).__name__}"
        )
    if isinstance(head, FeatureHead):
        check_head(head, target)


def check_not_meta(name: str, model: torch.nn.Module) -> None:
    """ValueError if `model` is on the meta device, which holds shapes but no weights."""
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        raise ValueError(
            f"{name} is on the meta device, which holds shapes but no weights: load its "
            f"weights (model.checkpoint) or build it on cpu or cuda"
        )


def check_head(head, target: GPT, name: str = "head") -> FeatureHead:
    """`head` (`name`: where it came from), checked against the target whose states it reads
    before any round runs it: a FeatureHead that fits the target (rules.py's head_problem), on
    the target's device, in its dtype."""
    if not isinstance(head, FeatureHead):
        raise TypeError(f"{name} must be a FeatureHead, got {type(head).__name__}")
    config, wants = head.config, target.config
    problem = head_problem(
        config.target_width, config.max_seq_len, wants.d_model, wants.max_seq_len
    )
    if problem is not None:
        raise ValueError(f"{name} {problem}")
    check_not_meta(name, head)
    weights, found = target.embed.weight, {(p.dtype, p.device) for p in head.parameters()}
    if found != {(weights.dtype, weights.device)}:
        held = ", ".join(sorted(f"{dtype} on {device}" for dtype, device in found))
        raise ValueError(
            f"{name} holds {held}, the target {weights.dtype} on {weights.device}: move it "
            f"with head.to(target.embed.weight)"
        )
    return head


def check_request(
    prompts: list[list[int]],
    params: list[SamplingParams],
    spec: SpeculativeConfig,
    on_tokens,
    warm_up,
    decoder,
) -> None:
    """One generate() call's prompts (token ids), SamplingParams, SpeculativeConfig, on_tokens
    (callable or None) and warm_up (a bool: "no" would be truthy, and a call would warm up and
    decode nothing), against what the decoder holds: the models and index its proposer needs,
    the target's vocabulary and the context in tokens."""
    if not isinstance(spec, SpeculativeConfig):
        raise TypeError(f"spec must be a SpeculativeConfig, got {type(spec).__name__}")
    check_params(params)
    check_prompt_lists(prompts)
    if on_tokens is not None and not callable(on_tokens):
        raise TypeError(f"on_tokens must be callable or None, got {type(on_tokens).__name__}")
    if not isinstance(warm_up, bool):
        raise TypeError(f"warm_up must be a bool (True or False), got {type(warm_up).__name__}")
    spec.validate()
    k, needs = max(spec.widths), PROPOSERS[spec.proposer].needs
    head = decoder.head if decoder.head is not None else decoder.load_head  # read on first use
    held = {"draft": decoder.draft, "suffix_index": decoder.suffix_index, "head": head}
    if k > 0 and needs is not None and held[needs] is None:
        raise ValueError(f"proposer {spec.proposer!r} needs SpeculativeDecoder(..., {needs}=...)")
    if not prompts or len(params) != len(prompts):
        raise ValueError(
            f"params must hold one SamplingParams per prompt: got {len(params)} for "
            f"{len(prompts)} prompts"
        )
    target, context = decoder.target, decoder.max_seq_len
    vocab = target.config.vocab_size
    for i, (prompt, p) in enumerate(zip(prompts, params)):
        p.validate()
        if len(prompt) < 2:  # BOS plus at least one token
            raise ValueError(f"prompt {i} is empty")
        if not all(isinstance(t, numbers.Integral) and not isinstance(t, bool) for t in prompt):
            raise ValueError(f"prompt {i} has token ids that are not ints")
        if any(not 0 <= t < vocab for t in prompt):
            raise ValueError(f"prompt {i} has token ids outside [0, {vocab})")
        if (bos := known_bos(target)) is not None and prompt[0] != bos:
            raise ValueError(
                f"prompt {i} does not start with BOS (id {bos}): encode text with "
                f"model.tokenizer.encode, which puts BOS first"
            )
        if len(prompt) + p.max_new_tokens + spec.verify_width > context:
            drafts = "tree nodes" if spec.proposer in TREE_PROPOSERS else "num_speculative_tokens"
            raise ValueError(
                f"prompt {i}: {len(prompt)} prompt tokens + max_new_tokens "
                f"{p.max_new_tokens} + {drafts} {spec.verify_width} exceed the "
                f"context of {context} tokens"
            )


def check_params(params: list[SamplingParams]) -> None:
    """TypeError unless `params` is a list of SamplingParams (one per prompt: check_request)."""
    if not isinstance(params, (list, tuple)):
        raise TypeError(f"params must be a list of SamplingParams, got {type(params).__name__}")
    for i, p in enumerate(params):
        if not isinstance(p, SamplingParams):
            raise TypeError(f"params[{i}] must be a SamplingParams, got {type(p).__name__}")


def check_prompt_lists(prompts: list[list[int]]) -> None:
    """TypeError unless `prompts` is a list of token id lists (their ids: check_request)."""
    if not isinstance(prompts, (list, tuple)):
        raise TypeError(f"prompts must be a list of token id lists, got {type(prompts).__name__}")
    for i, prompt in enumerate(prompts):
        if not isinstance(prompt, (list, tuple)):
            raise TypeError(
                f"prompts[{i}] must be a list of token ids, got {type(prompt).__name__}"
            )


def known_bos(target: GPT) -> int | None:
    """The BOS a prompt must start with on the byte vocabulary, else None (docs/reliability.md)."""
    return BOS_TOKEN_ID if target.config.vocab_size == VOCAB_SIZE else None
