"""What ``sampling.rejection.rejection_sample`` accepts, and the checks that refuse the rest.

The shapes of the noise are the sampler's contract with its callers, beside the rules' names
(sampling/rules.py). ``check_arguments`` refuses an argument outside that contract before the
rule runs, with a ValueError that names it, so that ``sampling/rejection.py`` holds only the
rule.
Shape, dtype and device checks never read values, so they cost no device sync; the value checks
(ids in range, NaN logits, draft_probs that are not distributions, noise out of range) read
every element, so they run on CPU tensors only. A caller that built every argument itself (the
decode loop) passes ``check_values=False`` and none of this runs.
"""

import torch

from sampling.constraints import check_noise_and_logits

# Re-exported (the alias says so): minispec/params.py takes the rules' names from here.
from sampling.rules import REJECTION_SAMPLE_METHODS as REJECTION_SAMPLE_METHODS
from sampling.rules import Rule

# How far a draft_probs row's sum may stray from 1: float32 rounding over a 128k vocabulary
# stays far below it, a distribution that is not one (unnormalised weights, a mask) far above.
PROBABILITY_SUM_TOLERANCE = 1e-3


def exponentials_shape(rule: Rule, batch_size: int, num_drafts: int, vocab_size: int) -> tuple:
    """[B, V]: one race per request, for the corrective or bonus token; a rule that races at
    every position (drafter_invariant) needs [B, K+1, V]."""
    if rule.races_every_position:
        return (batch_size, num_drafts + 1, vocab_size)
    return (batch_size, vocab_size)


def check_arguments(
    target_logits,
    draft_token_ids,
    draft_probs,
    uniforms,
    exponentials,
    num_draft_tokens,
    rule: Rule,
) -> None:
    """ValueError for any argument of ``rejection_sample`` that ``rule`` would misread: shapes,
    counts and ids first (the value checks index by them), then, on the CPU, the values.
    ``rule_named`` checks the method's name, ``normalize_params`` temperature, top_k and
    top_p."""
    _validate(target_logits, draft_token_ids, num_draft_tokens)
    _validate_probs_and_noise(target_logits, draft_probs, uniforms, exponentials, rule)
    if target_logits.device.type == "cpu":
        _check_values(target_logits, draft_probs, uniforms, exponentials, num_draft_tokens)


def _check_logits_and_drafts(target_logits, draft_token_ids) -> None:
    """target_logits a float [B, K+1, V] tensor and draft_token_ids an int64 [B, K] one, on the
    same device, with K >= 1."""
    if (
        not isinstance(target_logits, torch.Tensor)
        or target_logits.dim() != 3
        or not target_logits.is_floating_point()
    ):
        raise ValueError(
            f"target_logits must be a float [B, K+1, V] tensor, got "
            f"{getattr(target_logits, 'shape', type(target_logits))}"
        )
    if (
        not isinstance(draft_token_ids, torch.Tensor)
        or draft_token_ids.dim() != 2
        or draft_token_ids.dtype != torch.int64
    ):
        raise ValueError(
            f"draft_token_ids must be an int64 [B, K] tensor, got "
            f"{getattr(draft_token_ids, 'dtype', type(draft_token_ids))} "
            f"{list(getattr(draft_token_ids, 'shape', []))}"
        )
    batch_size, num_drafts = draft_token_ids.shape
    if num_drafts < 1:
        raise ValueError(
            "draft_token_ids must have K >= 1 columns (num_speculative_tokens); "
            "for K = 0 use sampling.sample"
        )
    if target_logits.shape[0] != batch_size or target_logits.shape[1] != num_drafts + 1:
        raise ValueError(
            f"target_logits must be [B, K+1, V] = [{batch_size}, {num_drafts + 1}, V] "
            f"for draft_token_ids [{batch_size}, {num_drafts}], "
            f"got {list(target_logits.shape)}"
        )
    if draft_token_ids.device != target_logits.device:
        raise ValueError(
            f"draft_token_ids is on {draft_token_ids.device}, target_logits on "
            f"{target_logits.device}"
        )


def _check_num_draft_tokens(num_draft_tokens, batch_size: int, device: torch.device) -> None:
    """None, or an int64 [B] tensor on the logits' device."""
    if num_draft_tokens is not None and (
        not isinstance(num_draft_tokens, torch.Tensor)
        or num_draft_tokens.dtype != torch.int64
        or num_draft_tokens.shape != (batch_size,)
        or num_draft_tokens.device != device
    ):
        raise ValueError(
            f"num_draft_tokens must be an int64 [B] = [{batch_size}] tensor on "
            f"{device}, got {getattr(num_draft_tokens, 'dtype', num_draft_tokens)}"
        )


def _check_draft_values(
    draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor | None, vocab_size: int
) -> None:
    """Each L_b in [0, K], each real draft id in [0, V). Reads values: CPU tensors only."""
    num_drafts, ids = draft_token_ids.shape[1], draft_token_ids
    if num_draft_tokens is not None:
        if bool(((num_draft_tokens < 0) | (num_draft_tokens > num_drafts)).any()):
            raise ValueError(f"num_draft_tokens must lie in [0, K] = [0, {num_drafts}]")
        # Past a row's last draft the ids are never read: any value (-1) may stand there.
        ids = ids.masked_fill(torch.arange(num_drafts) >= num_draft_tokens[:, None], 0)
    lowest, highest = torch.aminmax(ids)
    if lowest < 0 or highest >= vocab_size:
        raise ValueError(f"draft_token_ids must lie in [0, V) = [0, {vocab_size})")


def _check_float_tensor(name: str, tensor, shape: tuple, device: torch.device) -> None:
    """None, or a float tensor of ``shape`` on ``device``."""
    if tensor is None:
        return
    if not isinstance(tensor, torch.Tensor) or not tensor.is_floating_point():
        raise ValueError(
            f"{name} must be a float tensor, got {type(tensor).__name__}"
            f" {getattr(tensor, 'dtype', '')}"
        )
    if tuple(tensor.shape) != shape:
        raise ValueError(f"{name} must have shape {list(shape)}, got {list(tensor.shape)}")
    if tensor.device != device:
        raise ValueError(f"{name} is on {tensor.device}, target_logits on {device}")


def _validate(target_logits, draft_token_ids, num_draft_tokens) -> None:
    """The logits, the drafts and their counts: shape, dtype and device checks, and on the CPU
    the draft ids' range. No device sync."""
    _check_logits_and_drafts(target_logits, draft_token_ids)
    device = target_logits.device
    _check_num_draft_tokens(num_draft_tokens, draft_token_ids.shape[0], device)
    # The range checks read values: free on the CPU, a device sync on an accelerator. There they
    # are skipped rather than made a torch._assert_async, whose failure is a device-side assert
    # that ends the process, not a ValueError; the loop's ids come from an argmax or a sample
    # over the same V anyway.
    if device.type == "cpu" and draft_token_ids.numel():
        _check_draft_values(draft_token_ids, num_draft_tokens, target_logits.shape[-1])


def _validate_probs_and_noise(target_logits, draft_probs, uniforms, exponentials, rule) -> None:
    """draft_probs [B, K, V], uniforms [B, K] and exponentials (``exponentials_shape``): each
    None or a float tensor of that shape on the logits' device."""
    batch_size, rows, vocab_size = target_logits.shape
    device, num_drafts = target_logits.device, rows - 1
    _check_float_tensor("draft_probs", draft_probs, (batch_size, num_drafts, vocab_size), device)
    _check_float_tensor("uniforms", uniforms, (batch_size, num_drafts), device)
    shape = exponentials_shape(rule, batch_size, num_drafts, vocab_size)
    _check_float_tensor("exponentials", exponentials, shape, device)


def _check_values(target_logits, draft_probs, uniforms, exponentials, num_draft_tokens) -> None:
    """The values the rule would silently misread: NaN or +inf logits (filtering turns them
    into NaN probabilities, and a race over NaN picks token 0); draft_probs at real drafts that
    are NaN, negative or do not sum to 1; uniforms outside [0, 1); exponentials below 0 or NaN.
    Reads every value: CPU tensors only."""
    check_noise_and_logits(target_logits, exponentials, "target_logits")
    if draft_probs is not None:
        # Per-row reductions, then the rows that are read: no copy of [B, K, V]. amin propagates
        # NaN, so a row's minimum is NaN or below 0 exactly when one of its values is.
        lowest = draft_probs.amin(dim=-1)  # V >= 1: a draft id in [0, V) exists
        sums = draft_probs.sum(dim=-1, dtype=torch.float64)
        if num_draft_tokens is not None:  # rows past a row's last draft are never read
            read = torch.arange(draft_probs.shape[1]) < num_draft_tokens[:, None]
            lowest, sums = lowest[read], sums[read]
        if not bool((lowest >= 0).all()):
            raise ValueError("draft_probs must be probabilities: no NaN, none below 0")
        sums = sums.flatten()
        if sums.numel():
            worst = float(sums[(sums - 1).abs().argmax()])
            if abs(worst - 1) > PROBABILITY_SUM_TOLERANCE:
                raise ValueError(
                    f"draft_probs must sum to 1 over the vocabulary at every draft, "
                    f"got a row summing to {worst:.6g}"
                )
    if uniforms is not None and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise ValueError("uniforms must lie in [0, 1)")
