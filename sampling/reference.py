"""A deliberately plain rejection sampler: Leviathan et al. 2022, Algorithm 1, block
verification (Sun et al. 2024), the drafter-invariant rule (Daliri et al. 2024) and tree
verification (SpecInfer, Miao et al. 2023; sampling/tree.py), one request and one position (or
node) at a time. It is slow on purpose and shares no code with the tensor version apart from the
argument handling, the rules' fields (sampling/rules.py) and the tree's shape
(``sampling.tree.TreeShape``), so tests can hold the compiled sampler to it bit for bit, given
the same uniforms and exponentials. Not for production use.
"""

import math

import torch

from sampling.constraints import normalize_params
from sampling.rejection import PLACEHOLDER_TOKEN_ID, RejectionOutput
from sampling.rules import DEFAULT_METHOD, TREE_SAMPLE_METHODS, Rule, rule_named
from sampling.tree import TreeOutput, TreeShape


def target_distribution(
    logits: torch.Tensor, temperature: float, top_k: int, top_p: float
) -> torch.Tensor:
    """p for one position: float32 [V], after temperature -> top-k -> top-p. 0 means greedy."""
    if temperature == 0:
        p = torch.zeros(logits.shape, dtype=torch.float32)
        p[int(logits.argmax())] = 1.0
        return p
    scaled = logits.float() * (1.0 / torch.tensor(temperature, dtype=torch.float32))
    ranked = scaled.sort(descending=True).values.tolist()
    smallest_kept = float("-inf")
    if 0 < top_k:
        smallest_kept = ranked[min(top_k, len(ranked)) - 1]  # keep every logit >= the k-th largest
    if top_p < 1:
        ranked_t = torch.tensor(ranked, dtype=torch.float64)
        top_k_probs = ranked_t.masked_fill(ranked_t < smallest_kept, float("-inf")).softmax(-1)
        mass = 0.0
        for logit, prob in zip(ranked, top_k_probs.tolist()):
            mass += prob
            if mass >= top_p:  # the shortest prefix that reaches top_p, by value
                smallest_kept = max(smallest_kept, logit)
                break
    kept = scaled.masked_fill(scaled < smallest_kept, float("-inf"))
    return (kept - kept.logsumexp(-1)).exp()


def draw(weights: torch.Tensor, exponentials: torch.Tensor) -> int:
    """One draw proportional to ``weights`` [V]: the token with the largest w / E, computed in
    float32 as w * (1 / E) as the tensor version does. A zero weight never wins; if every
    weight is zero, token 0 is returned."""
    best_token, best_score = 0, -1.0
    scores = (weights.float() * exponentials.float().reciprocal()).tolist()
    for token, (w, score) in enumerate(zip(weights.tolist(), scores)):
        if w > 0 and score > best_score:
            best_token, best_score = token, score
    return best_token


def _block_length(
    p, q, drafts: list[int], uniforms: list[float], num_real: int
) -> tuple[int, float]:
    """Block verification for one request, position by position: tau and the weight p_tau.

    p(i) is the target's distribution after i drafts, q(i) the draft's; the comments use the
    paper's names (Mb, Ms, p_i, r_i, h_i, eta_i)."""
    log_weight, weights, tau = 0.0, [1.0], 0  # p_0 = 1
    for i in range(1, num_real + 1):
        x = drafts[i - 1]
        mb_x, ms_x = float(p(i - 1)[x]), float(q(i - 1)[x])
        # p_i = min(1, p_{i-1} Mb(X_i) / Ms(X_i)), in logs; q(x) = 0 counts as Mb(x) = 0.
        if ms_x > 0:
            log_ratio = math.log(mb_x) - math.log(ms_x) if mb_x > 0 else -math.inf
            log_weight = min(0.0, log_weight + log_ratio)
        else:
            log_weight = -math.inf
        weight = math.exp(log_weight)
        weights.append(weight)
        if i == num_real:  # the last draft: h = p_i, i.e. r = p_i over a denominator of 1
            mass, denominator = weight, 1.0
        else:  # r_i = sum_x max(p_i Mb(x | X^i) - Ms(x | X^i), 0)
            mass = float((weight * p(i).double() - q(i).double()).clamp(min=0).sum())
            denominator = mass + (1 - weight)
        # eta_i <= h_i = r_i / (r_i + 1 - p_i), written without the division; h_i = 0 never
        # passes and h_i = 0 / 0 = 1 always does.
        if (mass > 0 or denominator == 0) and uniforms[i - 1] * denominator <= mass:
            tau = i  # the LAST passing index wins
    return tau, weights[tau]


def _request_laws(
    logits: torch.Tensor,
    probs: torch.Tensor | None,
    drafts: list[int],
    temperature: float,
    top_k: int,
    top_p: float,
):
    """p(i) and q(i) for one request: the target's and the draft's distributions after i
    drafts. ``probs`` None: a one-hot draft."""

    def p(i: int) -> torch.Tensor:
        return target_distribution(logits[i].cpu(), temperature, top_k, top_p)

    def q(i: int) -> torch.Tensor:
        if probs is not None:
            return probs[i].float().cpu()
        one_hot = torch.zeros(logits.shape[-1])  # a one-hot draft
        one_hot[drafts[i]] = 1.0
        return one_hot

    return p, q


def _block_request(p, q, drafts: list[int], uniforms: list[float], noise) -> list[int]:
    """Block verification for one request: the tau accepted drafts, then the draw."""
    tau, weight = _block_length(p, q, drafts, uniforms, len(drafts))
    if tau == len(drafts):  # the bonus (or the draw after the stop token): p itself
        residual = p(tau)
    else:
        residual = (weight * p(tau).double() - q(tau).double()).clamp(min=0).float()
        if not bool((residual > 0).any()):  # rounding left no mass: fall back to p
            residual = p(tau)
    return drafts[:tau] + [draw(residual, noise)]


def _tokenwise_request(
    p, q, drafts: list[int], uniforms: torch.Tensor, temperature: float, rule: Rule, noise
) -> list[int]:
    """The token-wise rule for one request: the accepted drafts, then the corrective token
    (after a rejection) or the bonus token (after none)."""
    emitted = []
    for i, x in enumerate(drafts):
        p_i, q_i = p(i), q(i)
        if temperature == 0:
            accept = x == int(p_i.argmax())
        else:  # u <= p(x) / q(x), written without the division
            p_x, q_x = float(p_i[x]), float(q_i[x])
            accept = p_x > 0 and q_x > 0 and p_x >= float(uniforms[i]) * q_x
        if not accept:
            residual = (p_i - q_i).clamp(min=0) if rule.subtracts_rejected else p_i
            if not bool((residual > 0).any()):  # rounding left no mass: fall back to p
                residual = p_i
            return emitted + [draw(residual, noise)]
        emitted.append(x)
    return emitted + [draw(p(len(drafts)), noise)]  # every draft accepted: the bonus token


def _drafter_invariant_request(p, drafts: list[int], noise: torch.Tensor) -> list[int]:
    """The drafter-invariant rule for one request: at each position i the target's own choice
    is the race of p(i) with the position's noise row; keep the drafts while they equal it,
    then emit the choice at the first mismatch (or after the last draft)."""
    for i, x in enumerate(drafts):
        choice = draw(p(i), noise[i])
        if x != choice:
            return drafts[:i] + [choice]
    return drafts + [draw(p(len(drafts)), noise[len(drafts)])]


def rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    *,
    temperature,
    top_k,
    top_p,
    uniforms: torch.Tensor | None,
    exponentials: torch.Tensor,
    method: str = DEFAULT_METHOD,
    num_draft_tokens: torch.Tensor | None = None,
) -> RejectionOutput:
    """Same contract as ``sampling.rejection_sample``, except the randomness must be given."""
    rule = rule_named(method)
    batch_size, num_drafts = draft_token_ids.shape
    params = normalize_params(temperature, top_k, top_p, batch_size, torch.device("cpu"))
    token_ids = torch.full((batch_size, num_drafts + 1), PLACEHOLDER_TOKEN_ID)
    num_accepted = torch.zeros(batch_size, dtype=torch.int64)
    for b in range(batch_size):
        t = float(params.temperature[b])
        k = 0 if params.top_k is None else int(params.top_k[b])
        top_p_b = 1.0 if params.top_p is None else float(params.top_p[b])
        # A row with L < K drafts: position L + 1 holds a stop token that the target never
        # emits, so the round ends at L at the latest with a draw from p(L).
        num_real = num_drafts if num_draft_tokens is None else int(num_draft_tokens[b])
        drafts = [int(x) for x in draft_token_ids[b, :num_real]]
        probs = None if draft_probs is None else draft_probs[b]
        p, q = _request_laws(target_logits[b], probs, drafts, t, k, top_p_b)
        noise = exponentials[b].cpu()
        if rule.races_every_position:  # noise: one row per position, [K+1, V]
            emitted = _drafter_invariant_request(p, drafts, noise)
        # Block verification with a one-hot draft or a greedy target accepts exactly as the
        # token-wise rule does; the tensor version runs that rule then, and so does this one.
        elif rule.block_verification and draft_probs is not None and t > 0:
            emitted = _block_request(p, q, drafts, uniforms[b].tolist(), noise)
        else:
            emitted = _tokenwise_request(p, q, drafts, uniforms[b], t, rule, noise)
        token_ids[b, : len(emitted)] = torch.tensor(emitted, dtype=torch.int64)
        num_accepted[b] = len(emitted) - 1
    return RejectionOutput(token_ids, num_accepted)


def _family(
    p: list[float], children: list[int], x: list[int], q, uniforms: list[float], rule: Rule
) -> tuple[int | None, list[float]]:
    """One family's tests, sibling by sibling, in float64: the first child that passes against
    the current residual r (None if none does), and the residual left after the last one.
    ``p``: the parent's target distribution; ``q(c)``: child c's draft distribution."""
    residual = p
    for c in children:
        q_c = q(c)
        tested = residual if rule.subtracts_rejected else p  # naive: every sibling against p
        r_x, q_x = tested[x[c]], q_c[x[c]]
        if r_x > 0 and q_x > 0 and r_x >= uniforms[c] * q_x:  # u <= r(x) / q(x), no division
            return c, residual
        excess = [max(r_v - q_v, 0.0) for r_v, q_v in zip(tested, q_c)]
        mass = sum(excess)
        residual = [e / mass for e in excess] if mass > 0 else tested  # no mass: keep r
    return None, residual


def _tree_laws(logits: torch.Tensor, probs: torch.Tensor | None, x: list[int], t, k, top_p):
    """p(j) and q(j) for one request, by node id: the target's distribution at node j (float32
    [V]), and the values (floats) of the distribution node j's token was drawn from (``probs``
    None: one-hot at x_j)."""

    def p(node: int) -> torch.Tensor:
        return target_distribution(logits[node].cpu(), t, k, top_p)

    def q(node: int) -> list[float]:
        if probs is not None:
            return probs[node - 1].double().tolist()
        return [float(v == x[node]) for v in range(logits.shape[-1])]

    return p, q


def _tree_request(
    tree: TreeShape,
    p,
    q,
    x: list[int],
    uniforms: list[float],
    real: list[bool],
    greedy: bool,
    rule: Rule,
    noise: torch.Tensor,
) -> tuple[list[int], int]:
    """The tree rule for one request, family by family from the root: the accepted path (node
    ids), then the corrective or bonus token."""
    node, path = 0, []
    while True:
        p_node = p(node)
        children = [c for c in tree.children(node) if real[c]]
        if greedy:  # pass the first child equal to the argmax; emit the argmax at the end
            top = int(p_node.argmax())
            chosen = next((c for c in children if x[c] == top), None)
        else:
            chosen, residual = _family(p_node.tolist(), children, x, q, uniforms, rule)
        # Every child rejected: the draw from r_b; no child to test (a leaf, or every child
        # masked): r_b is p, the bonus.
        if chosen is None:
            token = top if greedy else draw(torch.tensor(residual, dtype=torch.float64), noise)
            return path, token
        path.append(chosen)
        node = chosen


def tree_rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    tree: TreeShape,
    *,
    temperature,
    top_k,
    top_p,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    method: str = DEFAULT_METHOD,
    node_mask: torch.Tensor | None = None,
) -> TreeOutput:
    """Same contract as ``sampling.tree_rejection_sample``, except the randomness must be
    given. Node j's draft, uniform, q and mask are column j - 1 of theirs."""
    rule = rule_named(method, TREE_SAMPLE_METHODS)
    batch_size, num_nodes = draft_token_ids.shape
    params = normalize_params(temperature, top_k, top_p, batch_size, torch.device("cpu"))
    token_ids = torch.full((batch_size, tree.max_depth + 1), PLACEHOLDER_TOKEN_ID)
    num_accepted = torch.zeros(batch_size, dtype=torch.int64)
    paths = torch.zeros(batch_size, tree.max_depth, dtype=torch.int64)
    for b in range(batch_size):
        t = float(params.temperature[b])
        k = 0 if params.top_k is None else int(params.top_k[b])
        top_p_b = 1.0 if params.top_p is None else float(params.top_p[b])
        x = [0] + draft_token_ids[b].tolist()  # by node id; the root holds no draft
        probs = None if draft_probs is None else draft_probs[b]
        p, q = _tree_laws(target_logits[b], probs, x, t, k, top_p_b)
        mask = [True] * num_nodes if node_mask is None else node_mask[b].tolist()
        real = [True]
        for j in range(1, num_nodes + 1):  # breadth first: a parent comes before its children
            real.append(mask[j - 1] and real[tree.parent[j]])
        u = [0.0] + uniforms[b].tolist()
        noise = exponentials[b].cpu()
        path, token = _tree_request(tree, p, q, x, u, real, t == 0, rule, noise)
        emitted = [x[c] for c in path] + [token]
        token_ids[b, : len(emitted)] = torch.tensor(emitted, dtype=torch.int64)
        num_accepted[b] = len(path)
        paths[b, : len(path)] = torch.tensor(path, dtype=torch.int64)
    return TreeOutput(token_ids, num_accepted, paths)
