"""Multi-draft (tree) verification: SpecInfer's multi-step speculative sampling (Miao et al. 2023,
arXiv 2305.09781), with a per-sibling draft distribution as in Recursive Speculative Decoding
(Jeon et al. 2024, arXiv 2402.14160), as tensor ops compiled with torch.compile(fullgraph=True).

The drafter proposes a tree of N tokens (``TreeShape``): every node at depth d-1 has b_d
children, the siblings of one family are its alternative candidates for the same next token.
q_j is EXACTLY the distribution node j's token x_j was drawn from, given its parent's context
and the tokens of its earlier siblings (the q contract): i.i.d. siblings (SpecInfer) have q_j =
the parent's draft distribution for every sibling; siblings drawn without replacement (RSD) have
the parent's q with the earlier siblings' tokens removed, renormalised (all zero once the
siblings have used up q's support: such a sibling is never accepted). p_j is the target's
distribution at node j (after temperature, top-k and top-p); it predicts j's children.

method="standard", for each request:
1. in every family (parent P, children c_0..c_{b-1} in rank order), r_0 = p_P; child c_i passes
   when r_i(x) > 0, q_i(x) > 0 and r_i(x) >= u_i q_i(x) (u_i <= r_i(x) / q_i(x) without
   dividing, in float64), and r_{i+1} = norm(max(r_i - q_i, 0)), or r_i when rounding leaves
   that no mass (the chain rule's fallback to p);
2. the family chooses its first passing child; the path starts at the root and follows chosen
   children while there are any; n = its length, e its last node (the root when n = 0);
3. one draw: if e has children (all rejected), the corrective token from its family's final
   residual r_b; if e is a leaf (n = D), the bonus token from p_e.
The output is the n path tokens, then the drawn token.

method="naive" is a deliberately WRONG rule, kept only to show the tests' power: it tests every
sibling against p_P (the residual is never updated) and draws the corrective token from
norm(max(p_P - q_last, 0)) of the family's last sibling. For a single chain the two coincide;
with two siblings or more its output no longer follows the target.

Why it is exact: given the earlier siblings' tokens (and their rejections, which depend only on
those tokens and their own uniforms), x_i ~ q_i, so testing it against r_i is one step of
standard speculative sampling (Leviathan et al. 2022): it returns x_i with probability
min(r_i(x), q_i(x)) and is otherwise followed by a draw from norm(max(r_i - q_i, 0)) = r_{i+1},
which together follow r_i. r_{i+1} depends on the earlier tokens only, not on which x_i was
rejected, so by induction on rank from the last sibling (whose "rest" is the draw from r_b), the
family's outcome (the chosen child's token, or the corrective token) follows r_0 = p_P. The
chosen child's own family is then the same step at the next position, with p at that child's
context, so the emitted tokens follow the target token by token. SpecInfer proves the i.i.d.
case and RSD the case without replacement; the argument above covers any per-sibling q_j.

Greedy rows (temperature 0) pass a child iff it equals the target's argmax (the first index, as
the chain rule) and emit the argmax at e; torch.where picks per row, as in rejection.py.
``node_mask`` marks the nodes a row really drafted: a node that is not real, or whose ancestor is
not, is never accepted and leaves its family's residual alone, so a row with a smaller tree
shares the batch's shape.

Vectorised: every node's test in one pass per sibling rank (a static loop of b_max steps,
unrolled at trace time, over all families and rows at once), "first passing sibling" by a
cumulative sum over ranks, and "on the path" as "chosen, with no unchosen ancestor" through the
static ancestor matrix. ``sampling.reference.tree_rejection_sample`` is the same rule as loops.
"""

from dataclasses import dataclass
from math import prod
from typing import NamedTuple

import torch
import torch.nn.functional as F

from sampling.constraints import (
    RowConstraints,
    check_noise_and_logits,
    filtered_logits,
    log_normalizer,
    normalize_params,
    sampler_core,
)
from sampling.noise import draw_exponentials, draw_uniforms, max_and_argmax, race
from sampling.rejection import _emitted
from sampling.rejection_args import (
    PROBABILITY_SUM_TOLERANCE,
    _check_float_tensor,
    _check_logits_and_drafts,
)
from sampling.rules import DEFAULT_METHOD, TREE_SAMPLE_METHODS, Rule, rule_named


@dataclass(frozen=True)
class TreeShape:
    """A tree's static shape, numbered breadth first: the root 0, then depth 1, depth 2, ...;
    the children of the m-th node of depth d-1 are offset_d + m b_d + r, r = 0..b_d-1 (the
    sibling rank). Plain tuples, so compiled code reads them at trace time. Nodes with
    children come first (ids 0..F-1), leaves (depth D) last."""

    branching: tuple[int, ...]  # (b_1, ..., b_D)
    parent: tuple[int, ...]  # [N+1], parent[0] = -1
    depth: tuple[int, ...]  # [N+1], depth[0] = 0
    rank: tuple[int, ...]  # [N+1], the sibling rank; rank[0] = 0
    num_nodes: int  # N, the drafted nodes (the root is not one)
    max_depth: int  # D

    @property
    def num_families(self) -> int:
        """F: the nodes with children, the root and every node above depth D."""
        return self.num_nodes + 1 - prod(self.branching)

    def children(self, node: int) -> tuple[int, ...]:
        """The children of ``node`` in rank order (none for a leaf)."""
        return tuple(j for j in range(1, self.num_nodes + 1) if self.parent[j] == node)

    def family_table(self) -> tuple[tuple[int, ...], ...]:
        """[F][b_max]: each family's children in rank order, padded with 0 (the root is nobody's
        child, so 0 marks a missing sibling)."""
        width = max(self.branching)
        return tuple(
            self.children(node) + (0,) * (width - len(self.children(node)))
            for node in range(self.num_families)
        )

    def ancestors(self, device: torch.device | None = None) -> torch.Tensor:
        """bool [N+1, N+1]: anc[i, j] = node j is node i or one of its ancestors (the decode
        loop's attention mask over the tree's keys)."""
        nodes = range(self.num_nodes + 1)
        chains = [{node} for node in nodes]
        for node in nodes[1:]:  # breadth first: a parent's chain is complete before its children
            chains[node] |= chains[self.parent[node]]
        return torch.tensor([[j in chain for j in nodes] for chain in chains], device=device)


def tree_shape(branching: tuple[int, ...]) -> TreeShape:
    """The ``TreeShape`` with b_d children under every node of depth d-1. (2, 1, 1, 1): two
    candidates for the first token, a chain of three below each; N = 8, D = 4."""
    if (
        not isinstance(branching, (tuple, list))
        or not branching
        or any(isinstance(b, bool) or not isinstance(b, int) or b < 1 for b in branching)
    ):
        raise ValueError(f"branching must be a non-empty tuple of ints >= 1, got {branching!r}")
    parent, depth, rank = [-1], [0], [0]
    first, width = 0, 1  # the ids of the previous depth: first .. first + width - 1
    for d, b in enumerate(branching, start=1):
        for m in range(width):
            for r in range(b):
                parent.append(first + m)
                depth.append(d)
                rank.append(r)
        first, width = first + width, width * b
    return TreeShape(
        tuple(branching), tuple(parent), tuple(depth), tuple(rank), len(parent) - 1, len(branching)
    )


class TreeOutput(NamedTuple):
    token_ids: torch.Tensor  # [B, D+1] int64: n path tokens, the corrective/bonus, then -1
    num_accepted: torch.Tensor  # [B] int64: n, the path's length
    path: torch.Tensor  # [B, D] int64: the accepted node ids (1..N) in depth order, 0 past n


def tree_rejection_sample(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    tree: TreeShape,
    *,
    temperature=1.0,
    top_k=None,
    top_p=None,
    uniforms: torch.Tensor | None = None,
    exponentials: torch.Tensor | None = None,
    generator: torch.Generator | None = None,
    method: str = DEFAULT_METHOD,
    node_mask: torch.Tensor | None = None,
    compiled: bool = True,
    check_values: bool = True,
) -> TreeOutput:
    """Verify a tree of N drafts per request; see the module docstring for the rule.

    target_logits [B, N+1, V] raw (row 0 at the root, row j at node j); draft_token_ids int64
    [B, N] (column j-1 is node j); draft_probs [B, N, V]: q_j per the q contract (None: one-hot
    drafts). temperature / top_k / top_p: a scalar or a [B] tensor each. uniforms float64
    [B, N] (one per node) and exponentials float32 [B, V] (one race per request) are drawn from
    ``generator`` when None. ``method``: one of TREE_SAMPLE_METHODS. ``node_mask`` bool [B, N]
    (None: every node real); ids and draft_probs of nodes that are not real are never read.
    ``compiled=False`` runs the same tensor code eagerly; ``check_values=False`` checks and
    converts nothing, as in ``rejection_sample``. Returns token_ids [B, D+1], num_accepted [B]
    and the accepted node ids path [B, D].
    """
    rule = rule_named(method, TREE_SAMPLE_METHODS)
    batch_size, num_nodes = draft_token_ids.shape
    vocab_size, device = target_logits.shape[-1], target_logits.device
    if check_values:
        _check_tree_arguments(
            target_logits, draft_token_ids, draft_probs, tree, uniforms, exponentials, node_mask
        )
        params = normalize_params(temperature, top_k, top_p, batch_size, device)
    else:  # the caller's own [B] tensors, as rejection_sample takes them
        params = RowConstraints(temperature, top_k, top_p)
    if uniforms is None:
        uniforms = draw_uniforms((batch_size, num_nodes), generator, device)
    if exponentials is None:
        exponentials = draw_exponentials((batch_size, vocab_size), generator, device)
    return sampler_core(_tree_core, compiled)(
        target_logits,
        draft_token_ids,
        draft_probs,
        *params,
        uniforms.double(),
        exponentials.float(),
        node_mask,
        tree,
        rule,
    )


def _tree_core(
    target_logits: torch.Tensor,
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    temperature: torch.Tensor,
    top_k: torch.Tensor | None,
    top_p: torch.Tensor | None,
    uniforms: torch.Tensor,
    exponentials: torch.Tensor,
    node_mask: torch.Tensor | None,
    tree: TreeShape,
    rule: Rule,
) -> TreeOutput:
    """The rule for the whole batch: p and the argmax at every node, the family tests (step 1),
    the path (step 2), the one draw at its end (step 3), and the output."""
    greedy = temperature == 0
    filtered = filtered_logits(target_logits, RowConstraints(temperature, top_k, top_p))
    row_max, argmax = max_and_argmax(filtered)  # [B, N+1] each
    p = (filtered - log_normalizer(filtered, row_max[..., None])).exp()  # [B, N+1, V]
    nodes = _read_nodes(draft_token_ids, draft_probs, uniforms, node_mask, p.shape[-1], tree)
    passed, residual = _family_tests(p, argmax, nodes, greedy, tree, rule)
    on_path = _on_path(_first_passing(passed, tree), tree)
    node_ids = torch.arange(tree.num_nodes + 1, device=p.device)
    last = (on_path.long() * node_ids).amax(dim=-1)  # ids grow with depth: the deepest is e
    token = _corrective_or_bonus(p, argmax, residual, last, exponentials, greedy)
    path = _path(on_path, tree)
    num_accepted = on_path.long().sum(dim=-1) - 1  # the root is on every path
    return TreeOutput(_emitted(nodes.ids.gather(1, path), num_accepted, token), num_accepted, path)


class _Nodes(NamedTuple):
    """The drafts as the rule reads them, indexed by node id, with a row for the root (id 0):
    the family table pads with it, and what it holds there (token 0, u = 0) is never used, as a
    padded slot is not live."""

    ids: torch.Tensor  # [B, N+1] x_j; 0 at the root and at nodes that are not real
    probs: torch.Tensor  # [B, N+1, V] float32 q_j
    uniforms: torch.Tensor  # [B, N+1] float64 u_j
    real: torch.Tensor  # [B, N+1] bool: real, and every ancestor real; True at the root


def _effective_real(node_mask: torch.Tensor | None, tree: TreeShape) -> torch.Tensor | None:
    """[B, N+1] bool: the root and every node that is real with all its ancestors real; None
    when every node is."""
    if node_mask is None:
        return None
    real = F.pad(node_mask, (1, 0), value=True)
    ancestors = tree.ancestors(node_mask.device)
    return ~((~real)[:, None, :] & ancestors).any(dim=-1)


def _read_nodes(
    draft_token_ids: torch.Tensor,
    draft_probs: torch.Tensor | None,
    uniforms: torch.Tensor,
    node_mask: torch.Tensor | None,
    vocab_size: int,
    tree: TreeShape,
) -> _Nodes:
    """x, q and u by node id, and which nodes are real (``_Nodes``)."""
    ids = F.pad(draft_token_ids, (1, 0))
    real = _effective_real(node_mask, tree)
    if real is None:
        real = torch.ones_like(ids, dtype=torch.bool)
    else:  # a node that is not real may hold any id (-1): gathers must stay in range
        ids = torch.where(real, ids, 0)
    if draft_probs is None:  # a one-hot draft: q_j(x_j) = 1
        vocab = torch.arange(vocab_size, device=ids.device)
        probs = (vocab == ids[..., None]).float()
    else:
        probs = F.pad(draft_probs.float(), (0, 0, 1, 0))
    return _Nodes(ids, probs, F.pad(uniforms, (1, 0)), real)


def _next_residual(residual: torch.Tensor, q: torch.Tensor) -> torch.Tensor:
    """norm(max(r - q, 0)) over the last dim, float64; r itself where that has no mass (q
    equals r up to rounding, or r's support lies inside q's at or below it)."""
    excess = (residual - q).clamp(min=0)
    mass = excess.sum(dim=-1, keepdim=True)
    return torch.where(mass > 0, excess / mass, residual)


def _family_tests(
    p: torch.Tensor,
    argmax: torch.Tensor,
    nodes: _Nodes,
    greedy: torch.Tensor,
    tree: TreeShape,
    rule: Rule,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Step 1 for every family at once: passed [B, F, b_max] (child of rank r of family P) and
    each family's final residual [B, F, V] float64, what its corrective token is drawn from.

    Families are indexed by their parent's id (0..F-1, the nodes with children); the static
    loop runs over the sibling rank r, testing the rank-r child of every family against the
    family's current residual r_r and then updating it. A padded slot (a family at a depth with
    fewer siblings) and a child that is not real neither pass nor change the residual."""
    table = torch.tensor(tree.family_table(), device=p.device)  # [F, b_max] node ids, 0 = none
    num_families = table.shape[0]
    x = nodes.ids[:, table]  # [B, F, b_max]
    live = nodes.real[:, table] & (table > 0)
    target = p[:, :num_families].double()  # r_0 = p_P
    residual, passed = target, []
    for r in range(table.shape[1]):
        q = nodes.probs[:, table[:, r]].double()  # [B, F, V]
        x_r = x[:, :, r, None]
        # The naive rule tests every sibling against p_P, and draws its corrective token from
        # max(p - q, 0) of the last sibling: wrong as soon as a family has two.
        tested = residual if rule.subtracts_rejected else target
        r_x, q_x = tested.gather(-1, x_r).squeeze(-1), q.gather(-1, x_r).squeeze(-1)
        passed.append((r_x > 0) & (q_x > 0) & (r_x >= nodes.uniforms[:, table[:, r]] * q_x))
        updated = _next_residual(tested, q)
        residual = torch.where(live[:, :, r, None], updated, residual)
    passed = torch.stack(passed, dim=-1) & live
    greedy_passed = (x == argmax[:, :num_families, None]) & live
    return torch.where(greedy[:, None, None], greedy_passed, passed), residual


def _first_passing(passed: torch.Tensor, tree: TreeShape) -> torch.Tensor:
    """[B, F, b_max] -> chosen [B, N+1] bool by node id: each family's first passing child (no
    earlier sibling passed), and the root, which starts every path."""
    chosen = passed & (passed.long().cumsum(dim=-1) == 1)
    width = passed.shape[-1]
    slot = [tree.parent[j] * width + tree.rank[j] for j in range(1, tree.num_nodes + 1)]
    chosen = chosen.flatten(1)[:, torch.tensor(slot, device=passed.device)]
    return F.pad(chosen, (1, 0), value=True)


def _on_path(chosen: torch.Tensor, tree: TreeShape) -> torch.Tensor:
    """[B, N+1] bool: the path from the root, the nodes chosen with every ancestor chosen. A
    family chooses at most one child, so these form one chain from the root down."""
    ancestors = tree.ancestors(chosen.device)
    return ~((~chosen)[:, None, :] & ancestors).any(dim=-1)


def _path(on_path: torch.Tensor, tree: TreeShape) -> torch.Tensor:
    """[B, D]: the path's node at each depth 1..D, 0 past its end (at most one node per depth
    is on the path, so a max over the depth's nodes picks it)."""
    depth = torch.tensor(tree.depth, device=on_path.device)
    levels = torch.arange(1, tree.max_depth + 1, device=on_path.device)
    node_ids = torch.arange(tree.num_nodes + 1, device=on_path.device)
    at_depth = (depth[:, None] == levels) & on_path[:, :, None]  # [B, N+1, D]
    return (at_depth.long() * node_ids[:, None]).amax(dim=1)


def _corrective_or_bonus(
    p: torch.Tensor,
    argmax: torch.Tensor,
    residual: torch.Tensor,
    last: torch.Tensor,
    exponentials: torch.Tensor,
    greedy: torch.Tensor,
) -> torch.Tensor:
    """Step 3, one draw per request [B] at the path's last node e: from e's family's final
    residual if e has children (all rejected), else the bonus from p_e. A greedy row takes
    e's argmax instead."""
    rows = torch.arange(last.shape[0], device=last.device)
    num_families = residual.shape[1]
    family = residual[rows, last.clamp(max=num_families - 1)]  # [B, V]
    # A normalised residual has an entry >= 1 / V, so its float32 copy keeps some mass.
    weights = torch.where((last < num_families)[:, None], family, p[rows, last].double()).float()
    return torch.where(greedy, argmax[rows, last], race(weights, exponentials))


def _check_tree_arguments(
    target_logits,
    draft_token_ids,
    draft_probs,
    tree,
    uniforms,
    exponentials,
    node_mask,
) -> None:
    """Raise ValueError for any argument the rule would misread: the tree, the logits and
    drafts (``rejection_args``'s checks, with K = N), N against the tree, then draft_probs, the
    noise and the mask, then (on the CPU) their values. The method's
    name is checked by ``rule_named``, the sampling parameters by ``normalize_params``."""
    if not isinstance(tree, TreeShape):
        raise ValueError(f"tree must be a TreeShape (tree_shape(branching)), got {tree!r}")
    _check_logits_and_drafts(target_logits, draft_token_ids)
    batch_size, num_nodes = draft_token_ids.shape
    if num_nodes != tree.num_nodes:
        raise ValueError(
            f"draft_token_ids must have N = {tree.num_nodes} columns for the tree "
            f"{tree.branching}, got {num_nodes}"
        )
    vocab_size, device = target_logits.shape[-1], target_logits.device
    _check_float_tensor("draft_probs", draft_probs, (batch_size, num_nodes, vocab_size), device)
    _check_float_tensor("uniforms", uniforms, (batch_size, num_nodes), device)
    _check_float_tensor("exponentials", exponentials, (batch_size, vocab_size), device)
    if node_mask is not None and (
        not isinstance(node_mask, torch.Tensor)
        or node_mask.dtype != torch.bool
        or node_mask.shape != (batch_size, num_nodes)
        or node_mask.device != device
    ):
        raise ValueError(
            f"node_mask must be a bool [B, N] = [{batch_size}, {num_nodes}] tensor on {device}, "
            f"got {getattr(node_mask, 'dtype', node_mask)}"
        )
    if device.type == "cpu":
        _check_tree_values(
            target_logits,
            draft_token_ids,
            draft_probs,
            uniforms,
            exponentials,
            _effective_real(node_mask, tree),
        )


def _check_tree_values(
    target_logits, draft_token_ids, draft_probs, uniforms, exponentials, real
) -> None:
    """The values the rule would misread, at real nodes only (a node that is not real may hold
    anything): ids outside [0, V); draft_probs that are NaN, negative, or sum to neither 1 nor
    0 (0: a sibling drawn without replacement after its family used up q's support); NaN or
    +inf logits, NaN or negative exponentials, uniforms outside [0, 1). Reads every value."""
    check_noise_and_logits(target_logits, exponentials, "target_logits")
    vocab_size = target_logits.shape[-1]
    real = None if real is None else real[:, 1:]
    ids = draft_token_ids if real is None else draft_token_ids[real]
    if ids.numel() and bool(((ids < 0) | (ids >= vocab_size)).any()):
        raise ValueError(f"draft_token_ids must lie in [0, V) = [0, {vocab_size})")
    if draft_probs is not None:
        rows = draft_probs if real is None else draft_probs[real]
        if bool((rows.isnan() | (rows < 0)).any()):
            raise ValueError("draft_probs must be probabilities: no NaN, none below 0")
        sums = rows.double().sum(dim=-1).flatten()
        off = torch.minimum((sums - 1).abs(), sums)  # distance to 1, or to 0
        if off.numel() and float(off.max()) > PROBABILITY_SUM_TOLERANCE:
            worst = float(sums[off.argmax()])
            raise ValueError(
                f"draft_probs must sum to 1 (or 0: no mass left to draw without replacement) "
                f"at every real node, got a row summing to {worst:.6g}"
            )
    if uniforms is not None and not bool(((uniforms >= 0) & (uniforms < 1)).all()):
        raise ValueError("uniforms must lie in [0, 1)")
