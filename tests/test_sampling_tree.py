"""Tree verification (sampling/tree.py): the rule keeps the target's law whatever the siblings'
draft distributions, and the tensor code is that rule.

1. The shape: breadth-first numbering, parents, ranks, families, ancestors; bad branchings are
   refused.
2. Exact arithmetic (``sampling.exact_law.tree_round_law``, fractions): for every sibling scheme
   (i.i.d., without replacement, the draft's top tokens) on random context-dependent tables and
   hard cases, one round followed by the target has exactly the target's law, at T = 1 and
   greedy, with and without masked nodes; the naive rule does not (total variation > 0.01).
3. The tensor code (eager on several shapes, compiled once) equals the plain reference
   (``sampling.reference.tree_rejection_sample``) token for token; on a single chain it is the
   chain rule (``rejection_sample``), for the same noise.
4. Through the tensor sampler: 200k rounds per test (100k for the naive rule), drafted by each
   scheme, with greedy rows and masked rows in the same call; the emitted tuples follow the law
   of (2) by Pearson's chi-square over every cell (``exact_law.chi_square``: cells pooled to an
   expectation >= 20). Each check raises a false alarm with probability 1e-6 (the chi-square
   approximation's), a test makes at most three, so at most 3e-6 per test; the seeds are fixed,
   so the outcome is deterministic. The naive rule fails the same check with a p-value below
   1e-30.
"""

from collections import Counter
from fractions import Fraction
from itertools import product

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import sampling
from sampling import exact_law, reference
from sampling.rules import RULES
from sampling.tree import _tree_core, tree_rejection_sample, tree_shape
from tests.test_sampling_compiled import _random_batch

FALSE_ALARM = 1e-6
GUIDE_P = [Fraction(x) for x in ("0.50", "0.25", "0.15", "0.07", "0.03")]
GUIDE_Q = [Fraction(x) for x in ("0.30", "0.40", "0.10", "0.15", "0.05")]
GUIDE_ROWS = 200_000  # per scheme


# --- 1. the shape -------------------------------------------------------------------------------


def test_shape_numbering():
    """(2, 1, 1, 1): two candidates, a chain of three below each, numbered breadth first."""
    tree = tree_shape((2, 1, 1, 1))
    assert (tree.num_nodes, tree.max_depth, tree.num_families) == (8, 4, 7)
    assert tree.parent == (-1, 0, 0, 1, 2, 3, 4, 5, 6)
    assert tree.depth == (0, 1, 1, 2, 2, 3, 3, 4, 4)
    assert tree.rank == (0, 0, 1, 0, 0, 0, 0, 0, 0)
    ancestors = tree.ancestors()
    assert ancestors.dtype == torch.bool and ancestors.shape == (9, 9)
    assert ancestors[8].nonzero().flatten().tolist() == [0, 2, 4, 6, 8]
    assert ancestors[0].nonzero().flatten().tolist() == [0]
    # (2, 2, 1): the children of the m-th node of depth d-1 are offset_d + m b_d + r.
    tree = tree_shape((2, 2, 1))
    assert tree.num_nodes == 2 + 4 + 4
    assert [tree.children(node) for node in range(3)] == [(1, 2), (3, 4), (5, 6)]
    assert tree.children(3) == (7,) and tree.children(6) == (10,) and tree.children(7) == ()
    assert tree.family_table() == ((1, 2), (3, 4), (5, 6), (7, 0), (8, 0), (9, 0), (10, 0))


@pytest.mark.parametrize("branching", [(), (0,), (2, -1), (2, 1.5), (True,), 3, "21"])
def test_shape_refuses(branching):
    with pytest.raises(ValueError, match="branching must be a non-empty tuple of ints >= 1"):
        tree_shape(branching)


# --- 2. exact arithmetic ------------------------------------------------------------------------


def _random_tables(rng: np.random.Generator, vocab: int, depth: int):
    """Target rows for every context of length <= D and draft rows for length < D, with random
    small-integer weights (zeros included) as exact fractions."""

    def table(length: int) -> dict:
        rows = {}
        for n in range(length + 1):
            for context in product(range(vocab), repeat=n):
                weights = rng.integers(0, 4, vocab)
                weights[rng.integers(vocab)] += 1  # some mass in every row
                rows[context] = [Fraction(int(w), int(weights.sum())) for w in weights]
        return rows

    return table(depth).__getitem__, table(depth - 1).__getitem__


def _constant(*weights):
    distribution = [Fraction(w, sum(weights)) for w in weights]
    return lambda context: distribution


def _greedy(target):
    """The target of a greedy row: one-hot at the argmax (the first index), in fractions."""

    def one_hot(context):
        p = target(context)
        return [Fraction(int(v == exact_law._argmax(p))) for v in range(len(p))]

    return one_hot


def _tables_2_2():
    """Random V = 4 tables for a (2, 2) tree, with the draft one-hot after token 0: its
    families outgrow q's support when drawn without replacement."""
    target, draft = _random_tables(np.random.default_rng(2021), 4, 2)
    one_hot = [Fraction(int(v == 2)) for v in range(4)]
    return target, lambda context: one_hot if context == (0,) else draft(context)


HARD_CASES = {
    "identical p and q": (_constant(3, 2, 1), _constant(3, 2, 1)),
    "disjoint supports": (_constant(1, 1, 0), _constant(0, 0, 1)),
    "zeros in p": (_constant(2, 1, 0), _constant(1, 1, 1)),
    "zeros in q": (_constant(1, 1, 1), _constant(1, 1, 0)),
    "peaked q: duplicate i.i.d. siblings": (_constant(1, 2, 2), _constant(18, 1, 1)),
    "q with one token: families outgrow it": (_constant(1, 2, 3), _constant(0, 1, 0)),
}
INSTANCES = [
    (f"random {seed}", branching, *_random_tables(np.random.default_rng(seed), 3, len(branching)))
    for seed, branching in enumerate([(2,), (3,), (2, 1), (2, 2), (3, 1), (2, 1, 1, 1)])
] + [
    (name, branching, target, draft)
    for name, (target, draft) in HARD_CASES.items()
    for branching in [(3,), (2, 2)]
]


def _completed_gap(target, draft, branching, scheme, rule="standard", node_mask=None):
    """Total variation between the round followed by the target and the target, D + 1 tokens."""
    law = exact_law.tree_round_law(target, draft, branching, scheme, rule, node_mask)
    length = len(branching) + 1
    completed = exact_law.completed_law(law, target, length)
    return exact_law.total_variation(completed, exact_law.target_law(target, length))


@pytest.mark.parametrize("scheme", exact_law.SIBLING_SCHEMES)
def test_law_is_exact(scheme):
    """Zero error, in fractions, at T = 1 (the standard rule) and greedy (the target one-hot
    at its argmax, the greedy rule), on every instance: the random tables, and the hard cases
    in a family of three and a (2, 2) tree."""
    for name, branching, target, draft in INSTANCES:
        assert _completed_gap(target, draft, branching, scheme) == 0, name
        assert _completed_gap(_greedy(target), draft, branching, scheme, "greedy") == 0, name


def test_law_with_masked_nodes_is_exact():
    """A (2, 2) tree with masked nodes is the smaller tree of its real nodes: masking node 2
    (so its children 5 and 6, though marked real) and node 4 leaves the chain 1 -> 3."""
    target, draft = _tables_2_2()
    masks = [
        [True, False, True, False, True, True],
        [False, True, True, True, True, False],
        [True, True, False, True, False, True],
    ]
    for scheme, mask in product(exact_law.SIBLING_SCHEMES, masks):
        assert _completed_gap(target, draft, (2, 2), scheme, node_mask=mask) == 0
    chain = exact_law.tree_round_law(target, draft, (1, 1), "iid")
    assert exact_law.tree_round_law(target, draft, (2, 2), "iid", node_mask=masks[0]) == chain


def test_naive_law_is_not_exact():
    """Power: testing every sibling against p, not the residual, is wrong for every scheme
    (and right only for single chains, where the two rules are one)."""
    target, draft = _tables_2_2()
    for scheme in exact_law.SIBLING_SCHEMES:
        assert _completed_gap(target, draft, (2, 2), scheme, "naive") > 0.01
        assert _completed_gap(target, draft, (1, 1), scheme, "naive") == 0


def test_guide_example_law():
    """p = (0.50, 0.25, 0.15, 0.07, 0.03), q = (0.30, 0.40, 0.10, 0.15, 0.05): one candidate is
    accepted with sum min(p, q) = 0.75; a second i.i.d. one is tested against the residual
    (0.8, 0, 0.2, 0, 0) and adds 0.25 x 0.4 = 0.1; one drawn without replacement (q without the
    first token) adds more, 0.896 in all."""
    target, draft = (lambda context: GUIDE_P), (lambda context: GUIDE_Q)
    accepted = {
        (scheme, b): exact_law.expected_accepted(
            exact_law.tree_round_law(target, draft, (b,), scheme)
        )
        for scheme, b in [("iid", 1), ("iid", 2), ("without_replacement", 2)]
    }
    assert accepted == {
        ("iid", 1): Fraction(3, 4),
        ("iid", 2): Fraction(17, 20),
        ("without_replacement", 2): Fraction(28943, 32300),
    }
    for scheme in ("iid", "without_replacement"):
        assert _completed_gap(target, draft, (2,), scheme) == 0


# --- 3. the tensor code is the rule -------------------------------------------------------------


def _random_inputs(branching: tuple, seed: int, batch_size: int = 200, run_out: bool = True):
    """Random rows of every kind (tests/test_sampling_compiled.py's batch with K = N: greedy and
    random rows, several temperatures, per-row top-k and top-p, -inf logits, q with zeros, ids
    outside q's support, edge noise), rows drafting the target's argmax, a random node mask
    (the first quarter of rows unmasked), and with ``run_out`` some q rows all zero (a sibling
    drawn without replacement after its family ran out)."""
    tree = tree_shape(branching)
    gen = torch.Generator().manual_seed(seed)
    batch = _random_batch(gen, batch_size, tree.num_nodes, 7, filters=True)
    if run_out:
        empty = torch.rand(batch_size, tree.num_nodes, generator=gen) < 0.05
        batch["draft_probs"][empty] = 0.0
    # Greedy rows among these accept every node of their path, so rounds end at every depth.
    argmax_rows = torch.rand(batch_size, generator=gen) < 0.15
    parents = list(tree.parent[1:])
    argmax = batch["target_logits"][:, parents].argmax(-1)
    batch["draft_token_ids"][argmax_rows] = argmax[argmax_rows]
    node_mask = torch.rand(batch_size, tree.num_nodes, generator=gen) < 0.8
    node_mask[: batch_size // 4] = True
    return tree, dict(batch, node_mask=node_mask)


def _assert_equal(out, expected, label: str) -> None:
    for name, a, b in zip(out._fields, out, expected):
        assert torch.equal(a, b), f"{label}: {name} differs"


@pytest.mark.parametrize("branching", [(2, 1, 1), (3,), (2, 2, 1), (1, 1, 1)])
def test_eager_equals_reference(branching):
    """Both rules, probabilistic and one-hot (None) drafts, mixed rows and masks; the rounds
    end at every depth."""
    tree, batch = _random_inputs(branching, seed=len(branching) * 10 + branching[0])
    reached = torch.zeros(tree.max_depth + 1, dtype=torch.bool)
    for draft_probs, method in product([batch["draft_probs"], None], ["standard", "naive"]):
        args = dict(batch, draft_probs=draft_probs, method=method, tree=tree)
        out = tree_rejection_sample(**args, compiled=False)
        _assert_equal(out, reference.tree_rejection_sample(**args), f"{draft_probs is None}")
        reached[out.num_accepted] = True
    assert reached.all()


def test_compiled_equals_reference():
    """One compiled graph, (2, 2, 1) with every kind of row, filters and a mask; and no graph
    breaks (Dynamo tracing only) for the variants: one-hot drafts, no filters, no mask, naive."""
    tree, batch = _random_inputs((2, 2, 1), seed=7, batch_size=64)
    out = tree_rejection_sample(**batch, tree=tree)
    _assert_equal(out, reference.tree_rejection_sample(**batch, tree=tree), "compiled")
    params = sampling.constraints.normalize_params(
        batch["temperature"], batch["top_k"], batch["top_p"], 64, torch.device("cpu")
    )
    variants = [
        (batch["draft_probs"], (params.top_k, params.top_p), batch["node_mask"], "standard"),
        (None, (None, None), None, "standard"),
        (batch["draft_probs"], (None, None), None, "naive"),
    ]
    for draft_probs, filters, node_mask, method in variants:
        explained = torch._dynamo.explain(_tree_core)(
            batch["target_logits"],
            batch["draft_token_ids"],
            draft_probs,
            params.temperature,
            *filters,
            batch["uniforms"],
            batch["exponentials"],
            node_mask,
            tree,
            RULES[method],
        )
        assert (explained.graph_count, explained.graph_break_count) == (1, 0)


def test_single_chain_is_the_chain_rule():
    """(1, 1, 1) is K = 3 drafts in a row: the tree rule emits what ``rejection_sample`` does
    for the same noise, the plain reference too, and the path is nodes 1..n."""
    tree, batch = _random_inputs((1, 1, 1), seed=11, run_out=False)  # K drafts: sums of 1
    del batch["node_mask"]
    for draft_probs in (batch["draft_probs"], None):
        args = dict(batch, draft_probs=draft_probs)
        out = tree_rejection_sample(**args, tree=tree, compiled=False)
        chain = sampling.rejection_sample(**args, compiled=False)
        assert torch.equal(out.token_ids, chain.token_ids)
        assert torch.equal(out.num_accepted, chain.num_accepted)
        plain = reference.tree_rejection_sample(**args, tree=tree)
        _assert_equal(out, plain, "chain")
        depth = torch.arange(1, 4)
        assert torch.equal(out.path, torch.where(depth <= out.num_accepted[:, None], depth, 0))


# --- 4. through the tensor sampler --------------------------------------------------------------

EMPIRICAL_BRANCHING, EMPIRICAL_VOCAB = (2, 2), 4
# (rows, temperature, node mask): random rows, greedy rows, and masked random rows, where node 2
# (so its children 5 and 6, though marked real) and node 3 are masked: the families are {1} and
# {4}, a sibling of rank 1 alone.
GROUPS = [
    (100_000, 1.0, None),
    (40_000, 0.0, None),
    (60_000, 1.0, (True, False, False, True, True, True)),
]


def _as_tensors(target, draft, vocab: int, depth: int):
    """The tables indexed by a context code: code(()) = 0, code(c + (x,)) = code(c) (V + 1) +
    x + 1, below (V + 1)^D for contexts of length <= D."""
    size = (vocab + 1) ** depth
    target_rows = torch.zeros(size, vocab, dtype=torch.float64)
    draft_rows = torch.zeros(size, vocab, dtype=torch.float64)
    for length in range(depth + 1):
        for context in product(range(vocab), repeat=length):
            code = 0
            for x in context:
                code = code * (vocab + 1) + x + 1
            target_rows[code] = torch.tensor([float(w) for w in target(context)])
            if length < depth:
                draft_rows[code] = torch.tensor([float(w) for w in draft(context)])
    return target_rows, draft_rows


def _draw_family_member(q: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
    """x ~ q per row by inverse CDF (token 0 where q has no mass). The CDF ends at exactly 1,
    so u < 1 never lands past the support."""
    cdf = q.cumsum(-1)
    total = cdf[:, -1:]
    u = torch.rand(q.shape[0], 1, dtype=torch.float64, generator=gen)
    x = (u >= cdf / total.clamp(min=1e-300)).sum(-1)
    return torch.where(total[:, 0] > 0, x, 0)


def _draft_trees(tree, tables, scheme: str, real: torch.Tensor, gen: torch.Generator):
    """Rounds of drafting, one per row of ``real`` [rows, N+1] (which nodes the row drafts):
    per node its token and the q it was drawn from by ``scheme`` among the family's real
    siblings, and the target's logits at every node. Nodes that are not real get id -1 and NaN
    q rows, which the sampler must never read."""
    target_rows, draft_rows = tables
    rows, vocab = real.shape[0], target_rows.shape[-1]
    code = torch.zeros(rows, tree.num_nodes + 1, dtype=torch.int64)
    ids = torch.zeros(rows, tree.num_nodes + 1, dtype=torch.int64)
    probs = torch.zeros(rows, tree.num_nodes + 1, vocab, dtype=torch.float64)
    for parent in range(tree.num_families):
        base = draft_rows[code[:, parent]]
        order = base.sort(dim=-1, descending=True, stable=True).indices  # ties: smallest id
        taken = torch.zeros(rows, vocab, dtype=torch.bool)
        earlier = torch.zeros(rows, dtype=torch.int64)  # real siblings drawn so far
        for child in tree.children(parent):
            if scheme == "top":
                x = order.gather(1, earlier[:, None]).squeeze(1)
                q = F.one_hot(x, vocab).double()
            else:
                q = base
                if scheme == "without_replacement":
                    q = base.masked_fill(taken, 0.0)
                    total = q.sum(-1, keepdim=True)
                    q = torch.where(total > 0, q / total.clamp(min=1e-300), 0.0)
                x = _draw_family_member(q, gen)
            taken |= F.one_hot(x, vocab).bool() & real[:, child, None]
            earlier += real[:, child]
            ids[:, child], probs[:, child] = x, q
            code[:, child] = code[:, parent] * (vocab + 1) + x + 1
    logits = target_rows[code].log().float()
    ids = ids[:, 1:].masked_fill(~real[:, 1:], -1)
    probs = probs[:, 1:].float().masked_fill(~real[:, 1:, None], float("nan"))
    return logits, ids, probs


def _real_nodes(tree, node_mask) -> list[bool]:
    """Per node 0..N: real, with every ancestor real."""
    real = [True]
    for j in range(1, tree.num_nodes + 1):
        real.append(node_mask[j - 1] and real[tree.parent[j]])
    return real


def _tally(token_ids: torch.Tensor) -> Counter:
    """The emitted tuples (each row's tokens before the placeholders) and their counts, counted
    as integers: the row's tokens + 1 as digits in a base above them, the placeholder a 0."""
    base = int(token_ids.max()) + 2
    codes = ((token_ids + 1) * base ** torch.arange(token_ids.shape[1])).sum(-1)
    tally = Counter()
    for code, n in zip(*(t.tolist() for t in codes.unique(return_counts=True))):
        digits = []
        while code:
            code, digit = divmod(code, base)
            digits.append(digit - 1)
        tally[tuple(digits)] = n
    return tally


def _sample_groups(scheme: str, method: str, seed: int, groups=GROUPS) -> list[Counter]:
    """Rounds through ``tree_rejection_sample`` in one eager call, ``groups`` rows of each
    kind; returns the Counter of emitted tuples per group."""
    tree = tree_shape(EMPIRICAL_BRANCHING)
    tables = _as_tensors(*_tables_2_2(), EMPIRICAL_VOCAB, tree.max_depth)
    gen = torch.Generator().manual_seed(seed)
    sizes = torch.tensor([rows for rows, _, _ in groups])
    per_group = [mask or (True,) * tree.num_nodes for _, _, mask in groups]
    node_mask = torch.tensor(per_group).repeat_interleave(sizes, dim=0)
    real = torch.tensor([_real_nodes(tree, m) for m in per_group]).repeat_interleave(sizes, dim=0)
    logits, ids, probs = _draft_trees(tree, tables, scheme, real, gen)
    out = tree_rejection_sample(
        logits,
        ids,
        None if scheme == "top" else probs,  # top: one-hot drafts, passed as None
        tree,
        temperature=torch.tensor([t for _, t, _ in groups]).repeat_interleave(sizes),
        generator=gen,
        method=method,
        node_mask=node_mask,
        compiled=False,
    )
    return [_tally(rows) for rows in out.token_ids.split(sizes.tolist())]


def _group_laws(scheme: str, rule: str = "standard") -> list[dict]:
    target, draft = _tables_2_2()
    laws = []
    for _, temperature, mask in GROUPS:
        greedy = temperature == 0
        law = exact_law.tree_round_law(
            _greedy(target) if greedy else target,
            draft,
            EMPIRICAL_BRANCHING,
            scheme,
            "greedy" if greedy else rule,
            mask,
        )
        laws.append({emitted: float(prob) for emitted, prob in law.items()})
    return laws


def _p_value(counts: Counter, law: dict) -> float:
    return exact_law.chi_square_sf(*exact_law.chi_square(counts, law))


@pytest.mark.parametrize("scheme", exact_law.SIBLING_SCHEMES)
def test_sampler_follows_the_law(scheme):
    """Random, greedy and masked rows in one call, each group's emitted tuples against its
    exact law: three checks at a false-alarm rate of 1e-6 each."""
    counts = _sample_groups(scheme, "standard", seed=1)
    for group, law in zip(counts, _group_laws(scheme)):
        assert _p_value(group, law) > FALSE_ALARM


def test_naive_sampler_fails():
    """Power: the naive rule, on the random rows of the test above (100k), follows its own
    (wrong) law and fails the check the exact rule passes, by far."""
    (counts,) = _sample_groups("iid", "naive", seed=2, groups=GROUPS[:1])
    assert _p_value(counts, _group_laws("iid")[0]) < 1e-30
    assert _p_value(counts, _group_laws("iid", "naive")[0]) > FALSE_ALARM


def test_guide_example_sampler():
    """The GUIDE example, 200k rounds of two siblings each, i.i.d. and without replacement, in
    one call: the emitted token follows p (a check at 1e-6 each), and acceptance is the exact
    law's 0.85 and 0.896 (a tolerance of 0.005, over 6 standard deviations), well above one
    candidate's 0.75."""
    tree = tree_shape((2,))
    target, draft = (lambda context: GUIDE_P), (lambda context: GUIDE_Q)
    tables = _as_tensors(target, draft, len(GUIDE_P), 1)
    gen = torch.Generator().manual_seed(3)
    schemes = ["iid", "without_replacement"]
    real = torch.ones(GUIDE_ROWS, tree.num_nodes + 1, dtype=torch.bool)
    drafted = [_draft_trees(tree, tables, scheme, real, gen) for scheme in schemes]
    logits, ids, probs = (torch.cat(parts) for parts in zip(*drafted))
    out = tree_rejection_sample(logits, ids, probs, tree, generator=gen, compiled=False)
    p = {(x,): float(w) for x, w in enumerate(GUIDE_P)}
    for i, scheme in enumerate(schemes):
        rows = slice(i * GUIDE_ROWS, (i + 1) * GUIDE_ROWS)
        first = _tally(out.token_ids[rows, :1])
        assert _p_value(first, p) > FALSE_ALARM
        law = exact_law.tree_round_law(target, draft, (2,), scheme)
        accepted = float(out.num_accepted[rows].double().mean())
        assert abs(accepted - float(exact_law.expected_accepted(law))) < 0.005
        assert accepted > 0.8


# --- 5. the arguments ---------------------------------------------------------------------------


def test_refuses_bad_arguments():
    tree, batch = _random_inputs((2, 1), seed=5, batch_size=4)
    del batch["top_k"], batch["top_p"]
    batch_size, num_nodes = batch["draft_token_ids"].shape
    cases = [
        (dict(method="block"), "method must be one of"),
        (dict(tree=(2, 1)), "tree must be a TreeShape"),
        (dict(tree=tree_shape((3,))), "must have N = 3 columns"),
        (dict(draft_probs=batch["draft_probs"][:, :1]), "draft_probs must have shape"),
        (dict(uniforms=batch["uniforms"][:, :1]), "uniforms must have shape"),
        (dict(exponentials=batch["exponentials"][:1]), "exponentials must have shape"),
        (dict(node_mask=batch["node_mask"].long()), "node_mask must be a bool"),
        (dict(uniforms=torch.ones(batch_size, num_nodes, dtype=torch.float64)), r"\[0, 1\)"),
        (dict(draft_probs=batch["draft_probs"] * 0.5), "must sum to 1"),
        (dict(draft_token_ids=torch.full((batch_size, num_nodes), 7)), r"\[0, V\)"),
    ]
    unmasked = dict(batch, node_mask=None, tree=tree)
    for change, message in cases:
        with pytest.raises(ValueError, match=message):
            tree_rejection_sample(**{**unmasked, **change}, compiled=False)
    # A node that is not real may hold anything: an id of -1, a NaN q row.
    node_mask = torch.ones(batch_size, num_nodes, dtype=torch.bool)
    node_mask[:, 1] = False
    ids, probs = batch["draft_token_ids"].clone(), batch["draft_probs"].clone()
    ids[:, 1], probs[:, 1] = -1, float("nan")
    masked = dict(unmasked, draft_token_ids=ids, draft_probs=probs, node_mask=node_mask)
    out = tree_rejection_sample(**masked, compiled=False)
    assert not (out.path == 2).any()
