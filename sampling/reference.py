"""A deliberately plain rejection sampler: Leviathan et al. 2022, Algorithm 1, one request and
one position at a time. It is slow on purpose and shares no code with the tensor version apart
from the argument handling, so tests can hold the compiled sampler to it bit for bit, given the
same uniforms and exponentials. Not for production use.
"""

import torch

from sampling.constraints import normalize_params
from sampling.rejection import METHODS, PLACEHOLDER_TOKEN_ID, RejectionOutput


def target_distribution(logits: torch.Tensor, temperature: float, top_k: int,
                        top_p: float) -> torch.Tensor:
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


def rejection_sample(target_logits: torch.Tensor, draft_token_ids: torch.Tensor,
                     draft_probs: torch.Tensor | None, *, temperature, top_k, top_p,
                     uniforms: torch.Tensor, exponentials: torch.Tensor,
                     method: str = "standard") -> RejectionOutput:
    """Same contract as ``sampling.rejection_sample``, except the randomness must be given."""
    assert method in METHODS
    batch_size, num_drafts = draft_token_ids.shape
    params = normalize_params(temperature, top_k, top_p, batch_size, torch.device("cpu"))
    token_ids = torch.full((batch_size, num_drafts + 1), PLACEHOLDER_TOKEN_ID)
    num_accepted = torch.zeros(batch_size, dtype=torch.int64)
    for b in range(batch_size):
        t = float(params.temperature[b])
        k = 0 if params.top_k is None else int(params.top_k[b])
        top_p_b = 1.0 if params.top_p is None else float(params.top_p[b])

        def p(i: int) -> torch.Tensor:
            return target_distribution(target_logits[b, i].cpu(), t, k, top_p_b)

        for i in range(num_drafts):
            x = int(draft_token_ids[b, i])
            p_i = p(i)
            if draft_probs is None:  # a one-hot draft
                q_i = torch.zeros_like(p_i)
                q_i[x] = 1.0
            else:
                q_i = draft_probs[b, i].float().cpu()
            if t == 0:
                accept = x == int(p_i.argmax())
            else:  # u <= p(x) / q(x), written without the division
                p_x, q_x = float(p_i[x]), float(q_i[x])
                accept = p_x > 0 and q_x > 0 and p_x >= float(uniforms[b, i]) * q_x
            if not accept:
                residual = p_i if method == "naive" else (p_i - q_i).clamp(min=0)
                if not bool((residual > 0).any()):  # rounding left no mass: fall back to p
                    residual = p_i
                token_ids[b, i] = draw(residual, exponentials[b].cpu())
                break
            token_ids[b, i] = x
            num_accepted[b] += 1
        else:  # every draft accepted: the bonus token, from the last target row
            token_ids[b, num_drafts] = draw(p(num_drafts), exponentials[b].cpu())
    return RejectionOutput(token_ids, num_accepted)
