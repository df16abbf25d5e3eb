"""The exact law of one verification round, by enumerating every draft block.

Tables, not models: ``target(prefix)`` and ``draft(prefix)`` return Mb(. | prefix) and
Ms(. | prefix), the next-token distributions after a tuple of drafted tokens, as sequences of
numbers. With ``fractions.Fraction`` entries every figure is exact: the tests hold both rules
to the target's law with zero error on small tables, and ``make verify`` prints the toy
example's expected accepted drafts (10/9 token-wise, 11/9 block, 12/9 at best) from here.

A rule maps one draft block X_1..X_L to its outcomes: for t = 0..L, the probability that the
round keeps X_1..X_t and the (unnormalised) weights of the token Y it then draws. Nothing here
is shared with the tensor sampler; it is the paper's rule written with whole distributions.
``tree_round_law`` does the same for one round of tree verification (sampling/tree.py): every
family of candidates the drafter can draw, and what the rule then keeps and draws; it shares
only the tree's numbering (``tree_shape``) and the rules' fields (sampling/rules.py) with the
sampler.
``chi_square`` and ``chi_square_sf`` judge sampled sequences against such a law.
"""

import math
from collections import Counter
from itertools import product
from typing import Callable, Sequence

import torch

from sampling.rules import RULES as SAMPLER_RULES
from sampling.tree import tree_shape

Table = Callable[[tuple], Sequence]  # prefix of drafted tokens -> next-token distribution
Outcomes = list[tuple[object, Sequence]]  # per t: P(keep exactly t drafts), Y's weights


def residual(weight, p: Sequence, q: Sequence) -> list:
    """max(weight * p - q, 0), entry by entry."""
    return [max(weight * p_x - q_x, 0) for p_x, q_x in zip(p, q)]


def token_wise(target: Table, draft: Table, drafts: tuple) -> Outcomes:
    """Leviathan et al.: accept X_i with probability min(1, Mb(X_i) / Ms(X_i)) until the first
    rejection, then draw from max(Mb - Ms, 0); after all L, the bonus from Mb."""
    outcomes, reach = [], 1
    for i, x in enumerate(drafts):
        p, q = target(drafts[:i]), draft(drafts[:i])
        accept = min(1, p[x] / q[x])
        outcomes.append((reach * (1 - accept), residual(1, p, q)))
        reach *= accept
    return outcomes + [(reach, list(target(drafts)))]


def block_weights(target: Table, draft: Table, drafts: tuple) -> list:
    """p_0 = 1, p_i = min(1, p_{i-1} Mb(X_i | X^{i-1}) / Ms(X_i | X^{i-1})): [p_0..p_L]."""
    weights = [1]
    for i, x in enumerate(drafts):
        weights.append(min(1, weights[-1] * target(drafts[:i])[x] / draft(drafts[:i])[x]))
    return weights


def block_thresholds(target: Table, draft: Table, drafts: tuple, weights: list) -> list:
    """h_0 = 1 (tau = 0 always qualifies), h_i = r_i / (r_i + 1 - p_i) for 0 < i < L (1 when
    that is 0 / 0), h_L = p_L."""
    thresholds = [1]
    for i in range(1, len(drafts)):
        mass = sum(residual(weights[i], target(drafts[:i]), draft(drafts[:i])))
        denominator = mass + 1 - weights[i]
        thresholds.append(mass / denominator if denominator else 1)
    return thresholds + [weights[-1]] if drafts else thresholds


def last_passing(thresholds: list) -> list:
    """P(tau = t) for tau = the LAST t with eta_t <= h_t: h_t prod_{j > t} (1 - h_j)."""
    law, later_fail = [0] * len(thresholds), 1
    for t in reversed(range(len(thresholds))):
        law[t] = thresholds[t] * later_fail
        later_fail *= 1 - thresholds[t]
    return law


def block(target: Table, draft: Table, drafts: tuple) -> Outcomes:
    """Sun et al. 2024 (arXiv 2403.10444), Algorithm 2: keep X^tau, then draw Y from
    max(p_tau Mb(. | X^tau) - Ms(. | X^tau), 0), or from Mb(. | X^L) if tau = L."""
    weights = block_weights(target, draft, drafts)
    lengths = last_passing(block_thresholds(target, draft, drafts, weights))
    return [
        (
            lengths[t],
            residual(weights[t], target(drafts[:t]), draft(drafts[:t]))
            if t < len(drafts)
            else list(target(drafts)),
        )
        for t in range(len(drafts) + 1)
    ]


RULES = {"standard": token_wise, "block": block}


def draft_blocks(
    draft: Table, num_drafts: int, vocab_size: int, stop: Callable[[tuple], bool] | None = None
):
    """Every draft block with positive probability, as (X^L, prod_i Ms(X_i | X^{i-1})). The
    drafter stops after L = the first length whose prefix satisfies ``stop``, or at K."""
    for block_ in product(range(vocab_size), repeat=num_drafts):
        length = next((i for i in range(num_drafts) if stop and stop(block_[:i])), num_drafts)
        if length < num_drafts and block_[length:] != (0,) * (num_drafts - length):
            continue  # one representative per short block: its trailing ids are unused
        prob = 1
        for i in range(length):
            prob *= draft(block_[:i])[block_[i]]
        if prob:
            yield block_[:length], prob


def round_law(
    target: Table,
    draft: Table,
    num_drafts: int,
    vocab_size: int,
    rule: Callable = block,
    stop: Callable[[tuple], bool] | None = None,
) -> dict:
    """P(the round emits exactly this tuple: the kept drafts, then Y), over all draft blocks."""
    law: dict = {}
    for drafts, prob in draft_blocks(draft, num_drafts, vocab_size, stop):
        for t, (keep, weights) in enumerate(rule(target, draft, drafts)):
            if not prob * keep:
                continue
            total = sum(weights)
            if not total:
                raise ZeroDivisionError(f"no mass to draw Y from after {drafts[:t]}")
            for y, w in enumerate(weights):
                if w:
                    emitted = drafts[:t] + (y,)
                    law[emitted] = law.get(emitted, 0) + prob * keep * w / total
    return law


def completed_law(law: dict, target: Table, length: int) -> dict:
    """The law of the first ``length`` tokens when the target continues after the round. An
    exact rule gives the target's own law, ``target_law(target, length)``."""
    done: dict = {}
    for emitted, prob in law.items():
        for tail in product(range(len(target(()))), repeat=length - len(emitted)):
            sequence, p = emitted, prob
            for y in tail:
                p *= target(sequence)[y]
                sequence += (y,)
            if p:
                done[sequence] = done.get(sequence, 0) + p
    return done


def target_law(target: Table, length: int) -> dict:
    return completed_law({(): 1}, target, length)


def expected_accepted(law: dict):
    """E[number of accepted drafts]: each emitted tuple is the kept drafts plus one token."""
    return sum(prob * (len(emitted) - 1) for emitted, prob in law.items())


def optimum_accepted(target: Table, draft: Table, num_drafts: int, vocab_size: int):
    """sum_i sum_{x^i} min(Mb(x^i), Ms(x^i)): no exact rule accepts more in expectation, since
    keeping the first i drafts equal to x^i is an event of both laws at once."""
    total = 0
    for i in range(1, num_drafts + 1):
        for prefix in product(range(vocab_size), repeat=i):
            big = small = 1
            for j, x in enumerate(prefix):
                big *= target(prefix[:j])[x]
                small *= draft(prefix[:j])[x]
            total += min(big, small)
    return total


# How a drafter fills a family of b siblings from its distribution q at their parent: "iid"
# draws each from q (SpecInfer), "without_replacement" from q with the earlier siblings' tokens
# removed (RSD), "top" takes q's b most likely tokens (a deterministic drafter: one-hot q_i).
SIBLING_SCHEMES = ("iid", "without_replacement", "top")
# "greedy" is the rule of a temperature-0 row: the first sibling equal to the target's argmax.
TREE_RULES = ("standard", "naive", "greedy")


def _normalised(weights: list) -> list:
    """weights / sum(weights), or all zeros when there is no mass."""
    total = sum(weights)
    return [w / total for w in weights] if total else list(weights)


def _one_hot(token: int, size: int) -> list:
    return [int(v == token) for v in range(size)]


def _argmax(p: Sequence) -> int:
    """The first index of the largest entry, as the sampler breaks ties."""
    return max(range(len(p)), key=lambda v: (p[v], -v))


def sibling_draws(q: Sequence, size: int, scheme: str) -> list[tuple[tuple, object, list]]:
    """Every family of ``size`` siblings the drafter can draw from q under ``scheme``, as
    (tokens, probability, [q_0..q_{size-1}]) with q_i the distribution sibling i was drawn from
    given the earlier ones (the q contract). Without replacement, a family larger than q's
    support runs out: the sibling still stands, with q_i = 0 (never accepted) and token 0."""
    if scheme == "top":
        if size > len(q):
            raise ValueError(f"a family of {size} top tokens needs V >= {size}, got {len(q)}")
        tokens = tuple(sorted(range(len(q)), key=lambda v: (-q[v], v))[:size])
        return [(tokens, 1, [_one_hot(x, len(q)) for x in tokens])]
    draws = [((), 1, [])]
    for _ in range(size):
        longer = []
        for tokens, prob, qs in draws:
            q_i = list(q)
            if scheme == "without_replacement":
                q_i = _normalised([0 if v in tokens else w for v, w in enumerate(q)])
            choices = [(x, w) for x, w in enumerate(q_i) if w] or [(0, 1)]
            longer += [(tokens + (x,), prob * w, qs + [q_i]) for x, w in choices]
        draws = longer
    return draws


def family_outcomes(p: Sequence, tokens: tuple, qs: list, rule: str) -> tuple[list, list]:
    """One family under ``rule``, given its siblings' tokens and q_i: P(sibling i is chosen)
    for each i, and the weights of the token drawn when none is (the final residual; p itself
    for a family of none, a leaf). Sibling i is tested with probability P(the earlier ones were
    rejected) and passes with min(1, r_i(x) / q_i(x))."""
    if rule == "greedy":
        top = _argmax(p)
        first = next((i for i, x in enumerate(tokens) if x == top), None)
        chosen = [int(i == first) for i in range(len(tokens))]
        return chosen, [w * (v == top) for v, w in enumerate(p)]  # in p's type: exact stays so
    subtracts_rejected = SAMPLER_RULES[rule].subtracts_rejected
    chosen, reach, current = [], 1, list(p)
    for x, q in zip(tokens, qs):
        tested = current if subtracts_rejected else p  # naive: every sibling against p
        accept = min(1, tested[x] / q[x]) if q[x] else 0
        chosen.append(reach * accept)
        reach *= 1 - accept
        excess = residual(1, tested, q)
        current = _normalised(excess) if sum(excess) else tested  # no mass: keep r
    return chosen, current


def tree_round_law(
    target: Table,
    draft: Table,
    branching: tuple[int, ...],
    scheme: str,
    rule: str = "standard",
    node_mask: Sequence[bool] | None = None,
) -> dict:
    """P(the round emits exactly this tuple: the accepted path's tokens, then Y) for a tree of
    shape ``branching`` drafted from ``draft`` by ``scheme`` and verified by ``rule``.

    ``node_mask`` (per node 1..N, None: all real) removes nodes: a family is its real children
    (those with every ancestor real too), drawn as a family of that size. Family by family from
    the root: every draw of the family's candidates, each candidate's chance of being chosen,
    then recursively what its own subtree emits (at context + its token), or the draw from the
    final residual. The subtrees of the other candidates are never read, so they are summed
    out, not enumerated."""
    if scheme not in SIBLING_SCHEMES or rule not in TREE_RULES:
        raise ValueError(f"scheme must be in {SIBLING_SCHEMES} and rule in {TREE_RULES}")
    tree = tree_shape(branching)
    mask = [True] + list(node_mask or [True] * tree.num_nodes)
    real = [True]
    for j in range(1, tree.num_nodes + 1):  # breadth first: a parent comes before its children
        real.append(mask[j] and real[tree.parent[j]])
    memo: dict = {}

    def emitted_from(node: int, context: tuple) -> dict:
        if (node, context) in memo:
            return memo[node, context]
        law: dict = {}
        children = [c for c in tree.children(node) if real[c]]
        p = target(context)
        draws = sibling_draws(draft(context), len(children), scheme) if children else [((), 1, [])]
        for tokens, prob, qs in draws:
            chosen, weights = family_outcomes(p, tokens, qs, rule)
            for child, x, share in zip(children, tokens, chosen):
                if prob * share:
                    for rest, sub in emitted_from(child, context + (x,)).items():
                        law[(x,) + rest] = law.get((x,) + rest, 0) + prob * share * sub
            stop, total = prob * (1 - sum(chosen)), sum(weights)
            for y, w in enumerate(weights):
                if stop * w:
                    law[(y,)] = law.get((y,), 0) + stop * w / total
        memo[node, context] = law
        return law

    return emitted_from(0, ())


def total_variation(law: dict, other: dict):
    """Half the L1 distance between two laws over tuples."""
    return sum(abs(law.get(k, 0) - other.get(k, 0)) for k in set(law) | set(other)) / 2


def chi_square(
    counts: Counter, law: dict[tuple[int, ...], float], min_expected: float = 20.0
) -> tuple[float, int]:
    """Pearson's statistic and degrees of freedom for observed sequence `counts` against `law`.

    Cells whose expectation is below `min_expected` are pooled, smallest first, until the pool
    reaches it (20 rather than the textbook 5, so that the chi-square approximation holds out in
    the far tail where our thresholds sit). A sequence the law gives probability 0 is never
    allowed: observing one returns an infinite statistic.
    """
    total = sum(counts.values())
    if any(seq not in law for seq in counts):
        return math.inf, 1
    cells = sorted(((total * p, counts.get(seq, 0)) for seq, p in law.items()), reverse=True)
    kept: list[tuple[float, int]] = []
    pool_e, pool_o = 0.0, 0
    for e, o in cells:
        if e >= min_expected:
            kept.append((e, o))
        else:
            pool_e, pool_o = pool_e + e, pool_o + o
    if pool_e >= min_expected:
        kept.append((pool_e, pool_o))
    elif pool_e > 0 and kept:  # too small a pool on its own: fold it into the smallest kept cell
        e, o = kept.pop()
        kept.append((e + pool_e, o + pool_o))
    stat = sum((o - e) ** 2 / e for e, o in kept)
    return stat, len(kept) - 1


def chi_square_sf(stat: float, df: int) -> float:
    """P(X >= stat) for X ~ chi-square(df): the regularised upper incomplete gamma
    Q(df/2, stat/2)."""
    if df <= 0:
        return 1.0 if stat == 0 else 0.0
    if math.isinf(stat):
        return 0.0
    return float(
        torch.special.gammaincc(
            torch.tensor(df / 2, dtype=torch.float64), torch.tensor(stat / 2, dtype=torch.float64)
        )
    )
