"""The rejection rules, one entry each: the name a caller passes (``method``, the decode loop's
rejection_sample_method) and, as fields, what sets the rule apart from the others.

A sampler looks the name up once, at its entry (``rule_named``), and from there branches on the
entry's fields, never on its name: ``rejection_sample`` and ``tree_rejection_sample``, the
round's noise (sampling/noise.py), and the oracles (reference.py, exact_law.py), which read the
fields but none of the samplers' code. A new rule is one entry here, then a branch on its new
field wherever it differs.
"""

from typing import NamedTuple


class Rule(NamedTuple):
    """A rule: its name, and as fields what the samplers do differently under it."""

    name: str
    # Keeps each draft while it equals the target's own race argmax p_t / E_t at its position
    # (drafter_invariant, Daliri et al. 2024): its noise is one Exp(1) row per position, keyed by
    # the position, and no uniforms. The other rules test each draft with a uniform and race
    # once per round, for the corrective or bonus token.
    races_every_position: bool
    # Block verification (Sun et al. 2024): n is the LAST position that passes its test, and the
    # corrective token comes from p weighted by the block's likelihood ratio, less q.
    block_verification: bool
    # After a rejection, the corrective token (and a tree's next sibling's test) reads the
    # residual norm(max(r - q, 0)) of the law r that rejected. False: the naive rule, wrong on
    # purpose to show the tests' power: a chain draws its corrective token from p itself, a tree
    # tests every sibling against p (and draws from p's residual against its last sibling's q).
    subtracts_rejected: bool
    # sampling/tree.py verifies a tree of drafts by it.
    verifies_trees: bool


RULES = {
    rule.name: rule
    for rule in (
        # Leviathan et al. 2022, Algorithm 1, as vLLM v1 runs it: each draft tested on its own
        Rule(
            "standard",
            races_every_position=False,
            block_verification=False,
            subtracts_rejected=True,
            verifies_trees=True,
        ),
        Rule(
            "block",
            races_every_position=False,
            block_verification=True,
            subtracts_rejected=True,
            verifies_trees=False,
        ),
        # Draws no residual: its corrective token is the target's race at the mismatch.
        Rule(
            "drafter_invariant",
            races_every_position=True,
            block_verification=False,
            subtracts_rejected=True,
            verifies_trees=False,
        ),
        Rule(
            "naive",
            races_every_position=False,
            block_verification=False,
            subtracts_rejected=False,
            verifies_trees=True,
        ),
    )
}

# The names each sampler takes; minispec/rules.py holds a torch-free copy of both for the CLI.
REJECTION_SAMPLE_METHODS = tuple(RULES)
TREE_SAMPLE_METHODS = tuple(name for name, rule in RULES.items() if rule.verifies_trees)
# The rule of a caller that names none (a compile line leaves it unsaid).
DEFAULT_METHOD = "standard"


def rule_named(name: str, names: tuple[str, ...] = REJECTION_SAMPLE_METHODS) -> Rule:
    """The rule called ``name``; ValueError unless it is one of ``names``."""
    if name not in names:
        raise ValueError(f"method must be one of {names}, got {name!r}")
    return RULES[name]
