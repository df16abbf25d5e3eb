"""The speculative rejection sampler (Leviathan et al. 2022, Algorithm 1 and Appendix A.1) and
block verification (Sun et al. 2024, arXiv 2403.10444) as tensor ops, compiled with
torch.compile(fullgraph=True).

For each request b with drafts x_1..x_K drawn from q, and target distributions p_1..p_{K+1},
method="standard" (token-wise):
1. accept x_i while p_i(x_i) >= u_i q_i(x_i), i.e. u_i <= p_i(x_i) / q_i(x_i), without dividing;
   q_i(x_i) > 0 and p_i(x_i) > 0 are required, so a token the target rules out is never
   accepted, even when u_i = 0;
2. n = the number accepted before the first rejection;
3. if n < K, draw the corrective token from norm(max(p_{n+1} - q_{n+1}, 0)), falling back to
   p_{n+1} when rounding leaves that residual no mass; if n = K, draw the bonus from p_{K+1}.
Only that one row per request needs a full-vocabulary draw, so it is gathered and raced alone
(``sampling.noise.race``), rather than building a residual at every position.

method="block" judges the block as a whole (``_block_length``). With Mb = p, Ms = q and X^i the
first i drafts:
1. w_0 = 1, w_i = min(1, w_{i-1} Mb(X_i | X^{i-1}) / Ms(X_i | X^{i-1})), the running likelihood
   ratio capped at 1 (the paper's p_i);
2. for i < K, r_i = sum_x max(w_i Mb(x | X^i) - Ms(x | X^i), 0) and h_i = r_i / (r_i + 1 - w_i);
   h_K = w_K;
3. n = tau = the LAST i with u_i <= h_i (0 if none);
4. if tau < K, draw from norm(max(w_tau Mb(. | X^tau) - Ms(. | X^tau), 0)), else the bonus.
Same noise as the standard rule: the uniforms [B, K] and one Exp(1) race for the drawn token.
It accepts at least as many drafts in expectation, and exactly as many for one-hot drafts or a
greedy target, where the token-wise rule runs instead.

method="drafter_invariant" (Daliri et al. 2024, "Coupling without communication and
drafter-invariant speculative decoding") couples draft and target through shared noise instead:
1. the target's choice at each row i is the exponential race y_i = argmax_x p_i(x) / E_i(x),
   with exponentials [B, K+1, V], one Exp(1) row per position (the draft is expected to have
   proposed x_i = argmax_x q_i(x) / E_i(x) with the same rows, but any drafts are exact);
2. n = the number of drafts before the first x_i != y_i;
3. emit x_1..x_n, then y_{n+1}: the corrective token after a mismatch, the bonus after none.
Every emitted token is the target's own race at its position, so given E the output does not
depend on the drafts at all: with E_t keyed by the position t, it is the K = 0 output. No
uniforms are read. Acceptance is P(argmax p / E = argmax q / E), at least (1 - d) / (1 + d) for
the total-variation distance d (Daliri et al.), below the token-wise rule's 1 - d.

Rows with fewer drafts (``num_draft_tokens``) are exact for every method: a missing draft is
a stop token the target never emits, so nothing past it is accepted and the round ends there
with a draw from the target's own row.

Greedy rows (temperature 0) accept while the draft equals the target argmax (the first index,
as torch.argmax) and emit the argmax of row n; torch.where picks per row, so greedy and random
rows share one call without a branch.

Step by step, ``_rejection_core`` is Algorithm 1 for a whole batch at once; ``reference.py`` is
the same rules as loops, for reading and for the tests.
"""

from typing import NamedTuple

import torch
import torch.nn.functional as F

from sampling.constraints import (
    RowConstraints,
    distribution,
    filtered_logits,
    log_normalizer,
    normalize_params,
    sampler_core,
)
from sampling.noise import draw_exponentials, draw_uniforms, max_and_argmax, race
from sampling.rejection_args import check_arguments, exponentials_shape
from sampling.rules import DEFAULT_METHOD, Rule, rule_named

# Emitted past each row's corrective/bonus token. The rules (REJECTION_SAMPLE_METHODS) live in
# sampling/rules.py, the noise's shapes and the argument checks in sampling/rejection_args.py.
PLACEHOLDER_TOKEN_ID = -1


class RejectionOutput(NamedTuple):
    token_ids: torch.Tensor  # [B, K+1] int64: n_b accepted drafts, the corrective/bonus, then -1
    num_accepted: torch.Tensor  # [B] int64: n_b


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None = None,
    *,
    temperature=1.0,
    top_k=None,
    top_p=None,
    uniforms: torch.Tensor | None = None,
    exponentials: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    method: str = DEFAULT_METHOD,
    compiled: bool = True,
    check_values: bool = True,
    num_draft_tokens: torch.Tensor | None = None,
) -> RejectionOutput:
    """Verify K drafts per request against the target; see the module docstring for the rule.

    target_logits [B, K+1, V] (raw), draft_token_ids int64 [B, K], draft_probs [B, K, V] exactly
    as the drafts were drawn (None: a one-hot, greedy draft). temperature / top_k / top_p: a
    scalar or a [B] tensor each. uniforms float64 [B, K] and exponentials float32 [B, V] are the
    randomness (drafter_invariant: no uniforms, exponentials [B, K+1, V], one row per position);
    each is drawn from ``generator`` when None. ``method``: the name of a rule of
    sampling/rules.py, one of REJECTION_SAMPLE_METHODS. ``num_draft_tokens`` int64 [B] (None: K
    each) gives rows with fewer drafts, L_b in [0, K]; ids and draft_probs past L_b are never
    read. L_b may depend on the drafts and on anything before this call, but not on this call's
    uniforms.
    ``compiled=False`` runs the same tensor code eagerly. ``check_values=False`` checks and
    converts nothing: for a caller that built every argument itself, like the decode loop,
    whose ids come from an argmax or a sample over the same V and whose temperature, top_k and
    top_p are [B] tensors already (top_k and top_p may be None). Returns token_ids [B, K+1]
    (padded with PLACEHOLDER_TOKEN_ID) and num_accepted [B].
    """
    rule = rule_named(method)
    batch_size, num_drafts = draft_token_ids.shape
    vocab_size, device = target_logits.shape[-1], target_logits.device
    if check_values:
        check_arguments(
            target_logits,
            draft_token_ids,
            draft_probs,
            uniforms,
            exponentials,
            num_draft_tokens,
            rule,
        )
        params = normalize_params(temperature, top_k, top_p, batch_size, device)
    else:  # the caller's own [B] tensors (the round's RowConstraints), as they are
        params = RowConstraints(temperature, top_k, top_p)
    rule = _effective_rule(rule, draft_probs, temperature)
    if uniforms is None and not rule.races_every_position:  # drafter_invariant reads none
        uniforms = draw_uniforms((batch_size, num_drafts), generator, device)
    if exponentials is None:
        shape = exponentials_shape(rule, batch_size, num_drafts, vocab_size)
        exponentials = draw_exponentials(shape, generator, device)
    return sampler_core(_rejection_core, compiled)(
        target_logits,
        draft_token_ids,
        draft_probs,
        *params,
        None if uniforms is None else uniforms.double(),
        exponentials.float(),
        num_draft_tokens,
        rule,
    )


def _effective_rule(rule: Rule, draft_probs: torch.Tensor | None, temperature) -> Rule:
    """``rule``, except that block verification with one-hot drafts or a greedy target
    accepts exactly as the token-wise test does (its p_i is then the product of per-token
    acceptances), so that test serves, without block's extra reductions."""
    if rule.block_verification and (
        draft_probs is None or (not isinstance(temperature, torch.Tensor) and temperature == 0)
    ):
        return rule._replace(block_verification=False)
    return rule


def _rejection_core(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    uniforms: torch.Tensor | None,
    exponentials: torch.Tensor,
    num_draft_tokens: torch.Tensor | None,
    rule: Rule,
) -> RejectionOutput:
    """Algorithm 1 for the whole batch, top to bottom: read the drafts and p, test each draft
    (step 1), count the accepted prefix n (step 2), draw the corrective or bonus token from row
    n (step 3), and lay out the output. Greedy rows ride along, picked per row by torch.where.
    A rule that races at every position has its own steps (``_drafter_invariant``)."""
    drafts = _read_drafts(draft_token_ids, num_draft_tokens)
    if rule.races_every_position:
        constraints = RowConstraints(temperature, top_k, top_p)
        return _drafter_invariant(target_logits, constraints, drafts, exponentials)
    greedy = temperature == 0
    target = _read_target(
        target_logits, RowConstraints(temperature, top_k, top_p), draft_token_ids.shape[1]
    )
    p_x, q_x = _draft_likelihoods(target, drafts.ids, draft_probs)
    greedy_accepted = _greedy_accepted(target, drafts)
    weight_at_tau = None
    if rule.block_verification:
        # A greedy row keeps the token-wise n: with a one-hot target, p_i is 1 while the drafts
        # match the argmax and 0 after, so both rules give the same n and the same argmax token.
        tau, weight_at_tau = _block_accepted(target, p_x, q_x, draft_probs, uniforms, drafts)
        num_accepted = torch.where(greedy, _prefix_length(greedy_accepted), tau)
    else:
        num_accepted = _tokenwise_accepted(p_x, q_x, uniforms, drafts, greedy, greedy_accepted)
    token = _corrective_or_bonus(
        target, drafts, draft_probs, num_accepted, weight_at_tau, exponentials, greedy, rule
    )
    return RejectionOutput(_emitted(drafts.ids, num_accepted, token), num_accepted)


class _Drafts(NamedTuple):
    """The drafts as the rule reads them. Short proposals: a row with L < K drafts is treated as
    if it had drafted a stop token at position L + 1 that the target never emits. So positions
    past L are never accepted and the round ends at L at the latest, with a draw from the
    target's row L (the residual of p against a q with all its mass on the stop token is p)."""

    ids: torch.Tensor  # [B, K] x_1..x_K; 0 past a row's last draft, whose id may be anything (-1)
    real: torch.Tensor | None  # [B, K] bool: positions holding real drafts; None: all of them
    last: torch.Tensor  # [B, K] bool: the position of each row's last real draft
    count: torch.Tensor | int  # L_b per row [B], or K for every row


class _TargetRows(NamedTuple):
    """p at every position, kept as filtered logits and a log-normaliser: the test needs only
    p(x), and the draw needs one row."""

    filtered: torch.Tensor  # [B, K+1, V] logits after temperature, top-k and top-p
    argmax: torch.Tensor  # [B, K+1] the greedy choice (the first index, as torch.argmax)
    log_norm: torch.Tensor  # [B, K+1] log sum_v exp; the bonus row's max only (it is only raced)


def _read_drafts(draft_token_ids: torch.Tensor, num_draft_tokens: torch.Tensor | None) -> _Drafts:
    """x, and which of its positions hold real drafts (``_Drafts``)."""
    num_drafts = draft_token_ids.shape[1]
    position = torch.arange(num_drafts, device=draft_token_ids.device)
    if num_draft_tokens is None:
        return _Drafts(draft_token_ids, None, position == num_drafts - 1, num_drafts)
    real = position < num_draft_tokens[:, None]
    last = position == num_draft_tokens[:, None] - 1
    return _Drafts(torch.where(real, draft_token_ids, 0), real, last, num_draft_tokens)


def _read_target(
    target_logits: torch.Tensor, constraints: RowConstraints, num_drafts: int
) -> _TargetRows:
    """The target's rows p_1..p_{K+1}, read in two passes: max and argmax (the greedy choice),
    then the sum of exponentials for the K positions that are tested."""
    filtered = filtered_logits(target_logits, constraints)
    row_max, target_argmax = max_and_argmax(filtered)  # [B, K+1] each
    log_norm = log_normalizer(filtered[:, :num_drafts], row_max[:, :num_drafts, None])
    # The bonus row needs no normaliser: it is only raced, and argmax(w / E) ignores w's scale.
    log_norm = torch.cat([log_norm.squeeze(-1), row_max[:, num_drafts:]], dim=1)  # [B, K+1]
    return _TargetRows(filtered, target_argmax, log_norm)


def _draft_likelihoods(
    target: _TargetRows, x: torch.Tensor, draft_probs: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """p_i(x_i) and q_i(x_i) [B, K], what step 1 tests."""
    num_drafts = x.shape[1]
    p_x = (
        target.filtered[:, :num_drafts].gather(-1, x[..., None]).squeeze(-1)
        - target.log_norm[:, :num_drafts]
    ).exp()
    q_x = (
        torch.ones_like(p_x)
        if draft_probs is None  # a one-hot draft: q(x) = 1
        else draft_probs.gather(-1, x[..., None]).squeeze(-1).float()
    )
    return p_x, q_x


def _greedy_accepted(target: _TargetRows, drafts: _Drafts) -> torch.Tensor:
    """[B, K] bool: a greedy row (temperature 0) accepts a draft equal to the target's argmax."""
    accepted = drafts.ids == target.argmax[:, : drafts.ids.shape[1]]
    if drafts.real is not None:
        accepted &= drafts.real
    return accepted


def _tokenwise_accepted(
    p_x: torch.Tensor,
    q_x: torch.Tensor,
    uniforms: torch.Tensor,
    drafts: _Drafts,
    greedy: torch.Tensor,
    greedy_accepted: torch.Tensor,
) -> torch.Tensor:
    """Steps 1-2 token-wise: x_i passes when p(x) >= u q(x), in float64 (u <= p(x) / q(x)
    without dividing, and never for p(x) = 0 or q(x) = 0); n [B] is the all-passed prefix."""
    accepted = (p_x > 0) & (q_x > 0) & (p_x.double() >= uniforms * q_x.double())
    if drafts.real is not None:
        accepted &= drafts.real
    accepted = torch.where(greedy[:, None], greedy_accepted, accepted)
    return _prefix_length(accepted)  # [B]


def _prefix_length(accepted: torch.Tensor) -> torch.Tensor:
    """[B, K] bool -> [B]: how many positions pass before the first failure."""
    return accepted.long().cumprod(dim=-1).sum(dim=-1)


def _block_accepted(
    target: _TargetRows,
    p_x: torch.Tensor,
    q_x: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    drafts: _Drafts,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 2 by block verification: tau [B], which replaces n, and p_tau [B, 1]."""
    num_drafts = drafts.ids.shape[1]
    target_probs = (target.filtered[:, 1:num_drafts] - target.log_norm[:, 1:num_drafts, None]).exp()
    return _block_length(p_x, q_x, target_probs, draft_probs, uniforms, drafts.real, drafts.last)


def _block_length(
    p_x: torch.Tensor,
    q_x: torch.Tensor,
    target_probs: torch.Tensor,
    draft_probs: torch.Tensor,
    uniforms: torch.Tensor,
    real: torch.Tensor | None,
    last: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Block verification's tau and p_tau per request (the rule of the module docstring).

    p_x, q_x [B, K]: Mb(X_i | X^{i-1}) and Ms(X_i | X^{i-1}); target_probs [B, K-1, V] and
    draft_probs [B, K, V]: Mb(. | X^i) for i = 1..K-1 and Ms(. | X^i) for i = 0..K-1; ``real``
    [B, K]: which positions hold real drafts (None: all); ``last`` [B, K]: the last real one.
    """
    # p_i = min(1, p_{i-1} Mb(X_i) / Ms(X_i)), in float64 logs: a product of K ratios can
    # underflow even a double. q(x) = 0 (not a draw from q) and a missing draft count as a
    # token the target never emits: p_i = 0 from there on.
    log_ratio = torch.where(q_x > 0, p_x.double().log() - q_x.double().log(), float("-inf"))
    if real is not None:
        log_ratio = torch.where(real, log_ratio, float("-inf"))
    running, log_weights = torch.zeros_like(log_ratio[:, 0]), []
    for i in range(log_ratio.shape[1]):  # K is small and static: unrolled, fused
        running = (running + log_ratio[:, i]).clamp(max=0.0)
        log_weights.append(running)
    weight = torch.stack(log_weights, dim=1).exp()  # p_1..p_K, [B, K]

    # r_i = sum_x max(p_i Mb(x | X^i) - Ms(x | X^i), 0) for i = 1..K-1: the one vocabulary-wide
    # reduction per drafted position that block verification adds.
    mass = (
        (weight[:, :-1, None] * target_probs.double() - draft_probs[:, 1:].double())
        .clamp(min=0)
        .sum(dim=-1)
    )
    # At the last real draft h = p: written as r = p over a denominator of 1. (A missing draft
    # is a stop token that Ms always proposes and Mb never emits: its r is p exactly.)
    mass = torch.where(last, weight, F.pad(mass, (0, 1)))
    denominator = torch.where(last, 1.0, mass + (1 - weight))
    # eta_i <= h_i = r_i / (r_i + 1 - p_i) without dividing; h_i = 0 (r = 0 < 1 - p) never
    # passes, even at eta = 0, and h_i = 1 (0 / 0) always does.
    passed = (uniforms * denominator <= mass) & ((mass > 0) | (denominator == 0))
    if real is not None:  # draft_probs past a row's last draft may hold anything
        passed &= real
    # tau = the LAST passing index (0 if none): a later position can rescue an earlier one.
    position = torch.arange(1, passed.shape[1] + 1, device=passed.device)
    tau = (passed.long() * position).amax(dim=-1)
    weight_at_tau = F.pad(weight, (1, 0), value=1.0).gather(1, tau[:, None])  # p_0 = 1
    return tau, weight_at_tau


def _residual(
    p_n: torch.Tensor,
    rows: torch.Tensor,
    drafts: _Drafts,
    draft_probs: torch.Tensor | None,
    n: torch.Tensor,
    weight_at_tau: torch.Tensor | None,
) -> torch.Tensor:
    """[B, V]: max(p - q, 0) at row n, or with ``weight_at_tau`` (block verification) the
    residual of p_tau Mb against Ms, in float64 like p_tau. ``rows``: 0..B-1."""
    n_draft = n.clamp(max=drafts.ids.shape[1] - 1)  # at n = K there is no draft row to gather
    if draft_probs is None:
        vocab = torch.arange(p_n.shape[-1], device=p_n.device)
        q_n = (vocab == drafts.ids[rows, n_draft][:, None]).float()
    else:
        q_n = draft_probs[rows, n_draft].float()
    if weight_at_tau is not None:
        return (weight_at_tau * p_n.double() - q_n.double()).clamp(min=0).float()
    return (p_n - q_n).clamp(min=0)


def _corrective_or_bonus(
    target: _TargetRows,
    drafts: _Drafts,
    draft_probs: torch.Tensor | None,
    n: torch.Tensor,
    weight_at_tau: torch.Tensor | None,
    exponentials: torch.Tensor,
    greedy: torch.Tensor,
    rule: Rule,
) -> torch.Tensor:
    """Step 3, one draw per request [B], from row n only: the corrective token from the
    residual if n < L, else the bonus from p. A greedy row takes the argmax instead."""
    rows = torch.arange(n.shape[0], device=n.device)
    p_n = (target.filtered[rows, n] - target.log_norm[rows, n][:, None]).exp()  # [B, V]
    if rule.subtracts_rejected:
        residual = _residual(p_n, rows, drafts, draft_probs, n, weight_at_tau)
        weights = torch.where((n < drafts.count)[:, None], residual, p_n)
    else:  # the naive rule, kept to show its bias: p itself after a rejection
        weights = p_n
    token = race(weights, exponentials)
    if draft_probs is not None and rule.subtracts_rejected:
        # Rounding can leave the residual without mass (p == q up to an ulp): draw from p then.
        # A one-hot draft cannot get here: its x is rejected only when p(x) < 1, and then some
        # other token has p > 0.
        token = torch.where(weights.amax(dim=-1) > 0, token, race(p_n, exponentials))
    return torch.where(greedy, target.argmax[rows, n], token)


def _emitted(x: torch.Tensor, n: torch.Tensor, token: torch.Tensor) -> torch.Tensor:
    """[B, K+1]: the n accepted drafts, then the corrective/bonus token, then placeholders."""
    position = torch.arange(x.shape[1] + 1, device=x.device)
    drafts = F.pad(x, (0, 1), value=PLACEHOLDER_TOKEN_ID)
    return torch.where(
        position < n[:, None],
        drafts,
        torch.where(position == n[:, None], token[:, None], PLACEHOLDER_TOKEN_ID),
    )


def _drafter_invariant(
    target_logits: torch.Tensor, constraints: RowConstraints, drafts: _Drafts, exponentials
) -> RejectionOutput:
    """method="drafter_invariant": the target's race y_i = argmax p_i / E_i at every row, each
    computed as a K = 0 round computes its token (``sampling.sample``: ``distribution``, then
    ``race``); the drafts are kept while they equal it, and y_{n+1} follows. A greedy row's
    distribution is one-hot at its argmax, so it races to the argmax."""
    choice = race(distribution(target_logits, constraints), exponentials)  # [B, K+1]
    accepted = drafts.ids == choice[:, :-1]
    if drafts.real is not None:
        accepted &= drafts.real
    n = _prefix_length(accepted)
    return RejectionOutput(_emitted(drafts.ids, n, choice.gather(1, n[:, None])[:, 0]), n)
