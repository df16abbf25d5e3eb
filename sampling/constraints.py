"""Temperature -> top-k -> top-p: the constraints that turn logits into the distribution a token
is drawn from, per row, and ``sample``, plain sampling under them.

Every row b carries its own temperature, top_k and top_p, as [B] tensors on the logits' device,
so one compiled graph serves Python scalars and tensors alike. Temperature 0 marks a greedy row,
whose distribution is one-hot at the argmax. Whether top-k and top-p run at all is a static,
Python-level choice (their tensor is None): both need a sort of the vocabulary, which costs far
more than the rest of the sampler at V = 128k, so a call without them compiles a graph without a
sort. Given as a tensor, a row's top_k of 0 or top_p of 1.0 switches the filter off for that row.

The kept set is defined by value, so ties never depend on the sort's order:
- top-k keeps every logit >= the k-th largest;
- top-p keeps every logit >= the smallest one in the shortest top prefix (after top-k) whose
  mass reaches top_p; the top token is always kept.
"""

import numbers
from functools import cache
from typing import Callable, NamedTuple

import torch

from sampling.noise import draw_exponentials, max_and_argmax, race


class RowConstraints(NamedTuple):
    """Per-row temperature, top_k and top_p as tensors, the form the compiled code takes (see
    ``normalize_params``). A request's ``SamplingParams`` become one row of these."""

    temperature: torch.Tensor  # [B] float32; 0 marks a greedy row
    top_k: torch.Tensor | None  # [B] int64, 0 = off for that row; None = off for every row
    top_p: torch.Tensor | None  # [B] float64, 1.0 = off for that row; None = off for every row


class SampleOutput(NamedTuple):
    token_ids: torch.Tensor  # [B] int64
    probs: torch.Tensor  # [B, V] float32, exactly the distribution token_ids was drawn from


def _per_row(
    name: str, value, batch_size: int, device: torch.device, dtype: torch.dtype
) -> torch.Tensor:
    """A Python scalar or a [B] tensor as a [B] tensor of ``dtype`` on ``device``."""
    if not isinstance(value, torch.Tensor):
        return torch.full((batch_size,), value, dtype=dtype, device=device)
    if value.shape != (batch_size,):
        raise ValueError(
            f"{name} must be a scalar or a [B] = [{batch_size}] tensor, "
            f"got shape {list(value.shape)}"
        )
    if value.device != device and value.device.type != "cpu":
        raise ValueError(f"{name} is on {value.device}, the logits on {device}")
    return value.to(device=device, dtype=dtype)


def _check_range(name: str, value, ok, rule: str) -> None:
    """ValueError unless ``ok(value)`` holds everywhere. Tensor values are checked only on the
    CPU: reading them from an accelerator would be a device sync."""
    if isinstance(value, torch.Tensor):
        if value.device.type == "cpu":
            # NaN fails every comparison, so "must be >= 0" would hide what is wrong with it.
            if value.is_floating_point() and bool(value.isnan().any()):
                row = int(value.reshape(-1).isnan().nonzero()[0, 0])
                raise ValueError(f"{name} is NaN in row {row}: it must be {rule}")
            if not bool(ok(value).all()):
                raise ValueError(f"{name} must be {rule}")
    elif isinstance(value, bool) or not isinstance(value, numbers.Real):  # True is no count
        raise TypeError(f"{name} must be a number or a [B] tensor, got {type(value).__name__}")
    elif value != value:  # NaN, the one number unequal to itself
        raise ValueError(f"{name} is NaN: it must be {rule}")
    elif not ok(value):
        raise ValueError(f"{name} must be {rule}, got {value!r}")


def normalize_params(
    temperature, top_k, top_p, batch_size: int, device: torch.device
) -> RowConstraints:
    """Validate temperature, top_k and top_p (scalars or [B] tensors) and make them [B] tensors.

    A None or 0 top_k scalar, and a None or 1.0 top_p scalar, become None: the filter is not
    compiled in at all.
    """
    if device.type == "meta":  # torch would fail later, in a draw or in the compiler
        raise ValueError(
            "the logits are on the meta device, which holds shapes but no values: "
            "sample from logits on cpu or cuda"
        )
    if isinstance(top_k, torch.Tensor) and (top_k.is_floating_point() or top_k.is_complex()):
        raise ValueError(f"top_k must be integer-valued, got dtype {top_k.dtype}")
    if isinstance(top_k, float) and not top_k.is_integer():
        raise ValueError(f"top_k must be an integer, got {top_k!r}")
    _check_range("temperature", temperature, lambda t: t >= 0, ">= 0 (0 means greedy)")
    if top_k is not None:
        _check_range("top_k", top_k, lambda k: k >= 0, ">= 0 (0 means off)")
    if top_p is not None:
        _check_range("top_p", top_p, lambda p: (p > 0) & (p <= 1), "in (0, 1] (1 means off)")

    if top_k is not None and not isinstance(top_k, torch.Tensor) and top_k == 0:
        top_k = None
    if top_p is not None and not isinstance(top_p, torch.Tensor) and top_p == 1.0:
        top_p = None
    return RowConstraints(
        temperature=_per_row("temperature", temperature, batch_size, device, torch.float32),
        top_k=None if top_k is None else _per_row("top_k", top_k, batch_size, device, torch.int64),
        top_p=None
        if top_p is None
        else _per_row("top_p", top_p, batch_size, device, torch.float64),
    )


def _rows(values: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """View a [B] tensor so that it broadcasts over ``like`` = [B, ..., V]."""
    return values.view(-1, *([1] * (like.dim() - 1)))


def _keep_threshold(
    scaled: torch.Tensor, top_k: torch.Tensor | None, top_p: torch.Tensor | None
) -> torch.Tensor:
    """The smallest kept logit of each row under top-k then top-p: shape [B, ..., 1]."""
    vocab_size = scaled.shape[-1]
    ranked = scaled.sort(dim=-1, descending=True).values
    threshold = torch.full_like(ranked[..., :1], float("-inf"))
    if top_k is not None:
        k = _rows(top_k, ranked).clamp(max=vocab_size)
        kth_largest = ranked.gather(-1, (k - 1).clamp(min=0).expand_as(threshold))
        threshold = torch.where(k > 0, kth_largest, threshold)
    if top_p is not None:
        # The mass of the top-k distribution, accumulated in float64: over 128k entries a
        # float32 running sum drifts by more than the gaps between top_p values people use.
        top_k_probs = ranked.double().masked_fill(ranked < threshold, float("-inf")).softmax(-1)
        mass = top_k_probs.cumsum(dim=-1)
        p = _rows(top_p, ranked)
        # Tokens before the prefix reaches top_p are kept, and so is the one that reaches it.
        num_kept = (mass < p).sum(dim=-1, keepdim=True) + 1
        last_kept = ranked.gather(-1, num_kept.clamp(max=vocab_size) - 1)
        threshold = torch.where(p < 1, torch.maximum(threshold, last_kept), threshold)
    return threshold


def filtered_logits(logits: torch.Tensor, constraints: RowConstraints) -> torch.Tensor:
    """logits [B, ..., V] -> float32 (logits - row max) / temperature, filtered-out entries at
    -inf.

    Greedy rows are scaled by 1 instead of 1 / 0: their distribution is one-hot at the argmax,
    which neither scaling nor filtering changes. The row max is subtracted first so that a tiny
    positive temperature (1e-39) behaves as the limit it approaches: the top logits become 0 and
    the rest -inf, where scaling raw logits would overflow to inf and give NaN probabilities.
    """
    # One reciprocal per row, then a multiply per entry: a division per entry costs several
    # times more on a CPU, over every pass through the logits. The reciprocal of a subnormal
    # temperature is inf in float32; the largest finite float is as good a limit, and 0 * it is 0.
    temperature = constraints.temperature
    inverse_temperature = (1.0 / torch.where(temperature == 0, 1.0, temperature)).clamp(
        max=torch.finfo(torch.float32).max
    )
    logits = logits.float()
    scaled = (logits - logits.amax(dim=-1, keepdim=True)) * _rows(inverse_temperature, logits)
    if constraints.top_k is None and constraints.top_p is None:
        return scaled
    threshold = _keep_threshold(scaled, constraints.top_k, constraints.top_p)
    return scaled.masked_fill(scaled < threshold, float("-inf"))


def log_normalizer(filtered: torch.Tensor, row_max: torch.Tensor) -> torch.Tensor:
    """logsumexp over the last dim, given each row's max [..., 1] (from ``max_and_argmax``)."""
    return row_max + (filtered - row_max).exp().sum(dim=-1, keepdim=True).log()


def distribution(logits: torch.Tensor, constraints: RowConstraints) -> torch.Tensor:
    """The distribution a token is drawn from, float32 [B, ..., V], for logits [B, ..., V]: the
    softmax of ``filtered_logits``, or one-hot at the first argmax for a greedy row."""
    filtered = filtered_logits(logits, constraints)
    row_max, top = max_and_argmax(filtered)
    probs = (filtered - log_normalizer(filtered, row_max[..., None])).exp()
    vocab = torch.arange(filtered.shape[-1], device=filtered.device)
    one_hot = (vocab == top[..., None]).float()
    return torch.where(_rows(constraints.temperature == 0, probs), one_hot, probs)


def check_noise_and_logits(
    logits: torch.Tensor, exponentials: torch.Tensor | None, name: str = "logits"
) -> None:
    """ValueError for logits holding NaN or +inf (filtering turns them into NaN probabilities,
    and a race over NaN picks token 0) or exponentials below 0 or NaN. Reads every value."""
    # One reduction each, no temporaries: max and min propagate NaN, so the max is NaN or +inf
    # exactly when some logit is, and the min is NaN or below 0 exactly when some noise is.
    if logits.numel() and not bool(logits.max() < float("inf")):
        raise ValueError(f"{name} must not hold NaN or +inf (-inf masks a token)")
    if exponentials is not None and exponentials.numel() and not bool(exponentials.min() >= 0):
        raise ValueError("exponentials must be >= 0 (Exp(1) noise; inf is allowed), not NaN")


def _sample_core(
    logits: torch.Tensor,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    exponentials: torch.Tensor,
) -> SampleOutput:
    probs = distribution(logits, RowConstraints(temperature, top_k, top_p))
    return SampleOutput(race(probs, exponentials), probs)


# How sampling/ compiles: one graph per static shape (dynamic=False), no graph breaks, and on a
# CPU no OpenMP team for a kernel with under 128k elements of work per thread. At decode sizes
# (B = 1, V up to 32k) the work takes microseconds; a team of threads saves a little of that on
# an idle machine but waits milliseconds whenever another process holds a core.
# realize_opcount_threshold (Inductor's default is 30) stores a value in a buffer once it takes
# more than 16 ops to compute. The counter-based noise (sampling/noise.py) reuses each value of its
# hash chain; inlined, every reuse recomputes the chain, and lowering that expression tree took
# Inductor minutes for the noise of one round (docs/startup.md).
COMPILE_OPTIONS = dict(
    fullgraph=True,
    dynamic=False,
    options={"cpp.min_chunk_size": 131072, "realize_opcount_threshold": 16},
)


def jit(fn: Callable, **options) -> Callable:
    """torch.compile(fn) with COMPILE_OPTIONS (and `options` added to Inductor's), called on
    first use, never at import (docs/startup.md says why)."""
    # Dynamo keeps at most recompile_limit graphs per function (8 by default) and, under
    # fullgraph, fails past it. Here every (shapes, one-hot or not, filters on, method, thread
    # count) is a graph: a decode loop trying several K, or a benchmark sweep, needs more than 8.
    torch._dynamo.config.recompile_limit = max(torch._dynamo.config.recompile_limit, 64)
    inductor = {**COMPILE_OPTIONS["options"], **options}
    return torch.compile(fn, **{**COMPILE_OPTIONS, "options": inductor})


@cache
def _compiled(core: Callable) -> Callable:
    """jit(core), made once per core, so that every call finds the graphs it compiled."""
    return jit(core)


def sampler_core(core: Callable, compiled: bool) -> Callable:
    """`core` compiled, or itself (compiled=False: eager)."""
    return _compiled(core) if compiled else core


def sample(
    logits: torch.Tensor,
    *,
    temperature=1.0,
    top_k=None,
    top_p=None,
    exponentials: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    compiled: bool = True,
    check_values: bool = True,
) -> SampleOutput:
    """Draw one token per row of ``logits`` [B, V] under temperature -> top-k -> top-p.

    Returns the token ids [B] and the float32 probabilities [B, V] they were drawn from (a
    probabilistic drafter passes these on as ``draft_probs``). ``exponentials`` [B, V] is the
    Exp(1) noise; when None it is drawn from ``generator``. ``compiled=False`` runs the same
    tensor code eagerly. ``check_values=False`` checks and converts nothing, as in
    ``rejection_sample``: for the decode loop, which built every argument itself.
    """
    if check_values:
        if (
            not isinstance(logits, torch.Tensor)
            or logits.dim() != 2
            or not logits.is_floating_point()
        ):
            shape = getattr(logits, "shape", type(logits))
            raise ValueError(f"logits must be a float [B, V] tensor, got {shape}")
        if exponentials is not None and (
            exponentials.shape != logits.shape or exponentials.device != logits.device
        ):
            raise ValueError(
                f"exponentials must be [B, V] = {list(logits.shape)} on {logits.device}, "
                f"got {list(exponentials.shape)} on {exponentials.device}"
            )
        params = normalize_params(temperature, top_k, top_p, logits.shape[0], logits.device)
        if logits.device.type == "cpu":
            check_noise_and_logits(logits, exponentials)
    else:  # the caller's own [B] tensors (the round's RowConstraints), as they are
        params = RowConstraints(temperature, top_k, top_p)
    if exponentials is None:
        exponentials = draw_exponentials(logits.shape, generator, logits.device)
    return sampler_core(_sample_core, compiled)(logits, *params, exponentials.float())
