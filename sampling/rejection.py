"""The speculative rejection sampler (Leviathan et al. 2022, Algorithm 1 and Appendix A.1) as
tensor ops, compiled with torch.compile(fullgraph=True).

For each request b with drafts x_1..x_K drawn from q, and target distributions p_1..p_{K+1}:
1. accept x_i while p_i(x_i) >= u_i q_i(x_i), i.e. u_i <= p_i(x_i) / q_i(x_i), without dividing;
   q_i(x_i) > 0 and p_i(x_i) > 0 are required, so a token the target rules out is never
   accepted, even when u_i = 0;
2. n = the number accepted before the first rejection;
3. if n < K, draw the corrective token from norm(max(p_{n+1} - q_{n+1}, 0)), falling back to
   p_{n+1} when rounding leaves that residual no mass; if n = K, draw the bonus from p_{K+1}.
Only that one row per request needs a full-vocabulary draw, so it is gathered and raced alone
(``sampling.noise.race``), rather than building a residual at every position.

Greedy rows (temperature 0) accept while the draft equals the target argmax (the first index,
as torch.argmax) and emit the argmax of row n; torch.where picks per row, so greedy and random
rows share one call without a branch.

Step by step, ``_rejection_core`` is Algorithm 1 for a whole batch at once; ``reference.py`` is
the same rule as a loop, for reading and for the tests.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from sampling.constraints import (COMPILE_OPTIONS, RowConstraints, filtered_logits,
                                  log_normalizer, normalize_params)
from sampling.noise import draw_exponentials, draw_uniforms, max_and_argmax, race

PLACEHOLDER_TOKEN_ID = -1
METHODS = ("standard", "naive")


class RejectionOutput(NamedTuple):
    token_ids: torch.Tensor     # [B, K+1] int64: n_b accepted drafts, the corrective/bonus, then -1
    num_accepted: torch.Tensor  # [B] int64: n_b


def _rejection_core(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                    draft_probs: torch.Tensor | None, temperature: torch.Tensor,
                    top_k: torch.Tensor | None, top_p: torch.Tensor | None,
                    uniforms: torch.Tensor, exponentials: torch.Tensor,
                    naive: bool) -> RejectionOutput:
    batch_size, num_drafts = draft_token_ids.shape
    rows = torch.arange(batch_size, device=target_logits.device)
    greedy = temperature == 0

    # p at every position, kept as filtered logits and a log-normaliser: the test needs only
    # p(x), and the draw needs one row. Reading the logits takes two passes: max and argmax (the
    # greedy choice), then the sum of exponentials for the K positions that are tested.
    filtered = filtered_logits(target_logits, RowConstraints(temperature, top_k, top_p))
    row_max, target_argmax = max_and_argmax(filtered)  # [B, K+1] each
    log_norm = log_normalizer(filtered[:, :num_drafts], row_max[:, :num_drafts, None])
    # The bonus row needs no normaliser: it is only raced, and argmax(w / E) ignores w's scale.
    log_norm = torch.cat([log_norm.squeeze(-1), row_max[:, num_drafts:]], dim=1)  # [B, K+1]

    # Step 1: the acceptance test, in float64.
    x = draft_token_ids
    p_x = (filtered[:, :num_drafts].gather(-1, x[..., None]).squeeze(-1)
           - log_norm[:, :num_drafts]).exp()
    q_x = (torch.ones_like(p_x) if draft_probs is None  # a one-hot draft: q(x) = 1
           else draft_probs.gather(-1, x[..., None]).squeeze(-1).float())
    accepted = (p_x > 0) & (q_x > 0) & (p_x.double() >= uniforms * q_x.double())
    accepted = torch.where(greedy[:, None], x == target_argmax[:, :num_drafts], accepted)

    # Step 2: n, the length of the all-accepted prefix.
    num_accepted = accepted.long().cumprod(dim=-1).sum(dim=-1)  # [B]

    # Step 3: one draw per request, from row n only: the corrective token from the residual
    # max(p - q, 0) if n < K, else the bonus from p. A greedy row takes the argmax instead.
    n = num_accepted
    p_n = (filtered[rows, n] - log_norm[rows, n][:, None]).exp()  # [B, V]
    if naive:  # the wrong rule, kept to show its bias: resample from p after a rejection
        weights = p_n
    else:
        n_draft = n.clamp(max=num_drafts - 1)  # at n = K there is no draft row to gather
        if draft_probs is None:
            vocab = torch.arange(p_n.shape[-1], device=p_n.device)
            q_n = (vocab == x[rows, n_draft][:, None]).float()
        else:
            q_n = draft_probs[rows, n_draft].float()
        weights = torch.where((n < num_drafts)[:, None], (p_n - q_n).clamp(min=0), p_n)
    token = race(weights, exponentials)
    if draft_probs is not None and not naive:
        # Rounding can leave the residual without mass (p == q up to an ulp): draw from p then.
        # A one-hot draft cannot get here: its x is rejected only when p(x) < 1, and then some
        # other token has p > 0.
        token = torch.where(weights.amax(dim=-1) > 0, token, race(p_n, exponentials))
    token = torch.where(greedy, target_argmax[rows, n], token)

    # Output: accepted drafts, then the corrective/bonus token at position n, then placeholders.
    position = torch.arange(num_drafts + 1, device=target_logits.device)
    drafts = F.pad(x, (0, 1), value=PLACEHOLDER_TOKEN_ID)
    token_ids = torch.where(position < n[:, None], drafts,
                            torch.where(position == n[:, None], token[:, None],
                                        PLACEHOLDER_TOKEN_ID))
    return RejectionOutput(token_ids, num_accepted)


# Created once: a graph is compiled per (shapes, dtypes, one-hot or not, filters on, method) and
# reused for every later call that matches.
_rejection_compiled = torch.compile(_rejection_core, **COMPILE_OPTIONS)


def _validate(target_logits, draft_token_ids, draft_probs, uniforms, exponentials,
              method: str, check_values: bool) -> None:
    """Shape, dtype and device checks; host-side only, so they cost no device sync."""
    if method not in METHODS:
        raise ValueError(f"method must be one of {METHODS}, got {method!r}")
    if (not isinstance(target_logits, torch.Tensor) or target_logits.dim() != 3
            or not target_logits.is_floating_point()):
        raise ValueError(f"target_logits must be a float [B, K+1, V] tensor, got "
                         f"{getattr(target_logits, 'shape', type(target_logits))}")
    if (not isinstance(draft_token_ids, torch.Tensor) or draft_token_ids.dim() != 2
            or draft_token_ids.dtype != torch.int64):
        raise ValueError(f"draft_token_ids must be an int64 [B, K] tensor, got "
                         f"{getattr(draft_token_ids, 'dtype', type(draft_token_ids))} "
                         f"{list(getattr(draft_token_ids, 'shape', []))}")
    batch_size, num_drafts = draft_token_ids.shape
    _, rows, vocab_size = target_logits.shape
    device = target_logits.device
    if num_drafts < 1:
        raise ValueError("draft_token_ids must have K >= 1 columns (num_speculative_tokens); "
                         "for K = 0 use sampling.sample")
    if target_logits.shape[0] != batch_size or rows != num_drafts + 1:
        raise ValueError(f"target_logits must be [B, K+1, V] = [{batch_size}, {num_drafts + 1}, V] "
                         f"for draft_token_ids [{batch_size}, {num_drafts}], "
                         f"got {list(target_logits.shape)}")
    if draft_token_ids.device != device:
        raise ValueError(f"draft_token_ids is on {draft_token_ids.device}, "
                         f"target_logits on {device}")
    # The range check reads the ids: free on the CPU, a device sync on an accelerator. There it
    # is skipped rather than made a torch._assert_async, whose failure is a device-side assert
    # that ends the process, not a ValueError; the loop's ids come from an argmax or a sample
    # over the same V anyway.
    if check_values and device.type == "cpu" and draft_token_ids.numel():
        lowest, highest = torch.aminmax(draft_token_ids)
        if lowest < 0 or highest >= vocab_size:
            raise ValueError(f"draft_token_ids must lie in [0, V) = [0, {vocab_size})")
    expected = {"draft_probs": (draft_probs, (batch_size, num_drafts, vocab_size)),
                "uniforms": (uniforms, (batch_size, num_drafts)),
                "exponentials": (exponentials, (batch_size, vocab_size))}
    for name, (tensor, shape) in expected.items():
        if tensor is None:
            continue
        if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
            raise ValueError(f"{name} must be a float tensor, got {type(tensor).__name__}"
                             f" {getattr(tensor, 'dtype', '')}")
        if tuple(tensor.shape) != shape:
            raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
        if tensor.device != device:
            raise ValueError(f"{name} is on {tensor.device}, target_logits on {device}")


def rejection_sample(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                     draft_probs: torch.Tensor | None = None, *, temperature=1.0, top_k=None,
                     top_p=None, uniforms: torch.Tensor | None = None,
                     exponentials: torch.Tensor | None = None,
                     generator: torch.Generator | None = None, method: str = "standard",
                     compiled: bool = True, check_values: bool = True) -> RejectionOutput:
    """Verify K drafts per request against the target; see the module docstring for the rule.

    target_logits [B, K+1, V] (raw), draft_token_ids int64 [B, K], draft_probs [B, K, V] exactly
    as the drafts were drawn (None: a one-hot, greedy draft). temperature / top_k / top_p: a
    scalar or a [B] tensor each. uniforms float64 [B, K] and exponentials float32 [B, V] are the
    randomness; each is drawn from ``generator`` when None. ``compiled=False`` runs the same
    tensor code eagerly. ``check_values=False`` skips reading tensor arguments' values (the
    draft-id range, per-row parameters) for a caller that validated them once, like the decode
    loop, whose ids come from an argmax or a sample over the same V. Returns token_ids [B, K+1] (padded with PLACEHOLDER_TOKEN_ID) and
    num_accepted [B].
    """
    _validate(target_logits, draft_token_ids, draft_probs, uniforms, exponentials, method, check_values)
    batch_size, num_drafts = draft_token_ids.shape
    vocab_size = target_logits.shape[-1]
    device = target_logits.device
    params = normalize_params(temperature, top_k, top_p, batch_size, device, check_values)
    if uniforms is None:
        uniforms = draw_uniforms((batch_size, num_drafts), generator, device)
    if exponentials is None:
        exponentials = draw_exponentials((batch_size, vocab_size), generator, device)
    core = _rejection_compiled if compiled else _rejection_core
    return core(target_logits, draft_token_ids, draft_probs, *params,
                uniforms.double(), exponentials.float(), method == "naive")
