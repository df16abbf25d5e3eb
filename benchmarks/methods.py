"""The methods the harness times, one row each: a proposer at a K (or "auto") with its options.

Adding a row is one line in METHODS. A row that cannot run here (`unavailable`) is left out of
the run with a note, so the list may name what a checkout does not have yet. `--methods` picks
rows by label, or asks for others: "draft_model:6", "tree:4:2" (depth 4, 2 candidates first).

Light: nothing here imports torch at the top, so that flags.py checks a label while parsing.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from minispec.rules import DEFAULT_TREE_BRANCHING, PROPOSER_NAMES, TREE_PROPOSERS


@dataclass(frozen=True)
class Method:
    proposer: str  # a name in minispec.proposers.PROPOSERS
    k: int | str  # K, or "auto" (K chosen each round)
    branching: tuple[int, ...] = DEFAULT_TREE_BRANCHING  # a tree's candidates at its first depths

    @property
    def label(self) -> str:
        if self.k == 0:
            return "K=0"
        tree = ":" + ",".join(map(str, self.branching)) if self.proposer in TREE_PROPOSERS else ""
        return f"{self.proposer}:{self.k}{tree}"

    def spec(self, draft_sample_method: str):
        from minispec.params import SpeculativeConfig

        return SpeculativeConfig(
            self.k, draft_sample_method, proposer=self.proposer, tree_branching=self.branching
        )


BASELINE = Method("draft_model", 0)  # the target alone: every row is divided by it
METHODS = (
    BASELINE,
    Method("draft_model", 4),
    Method("draft_model", "auto"),
    Method("feature_head", 4),
    Method("ngram", "auto"),
    Method("parallel", 4),
    Method("parallel", 8),
    Method("parallel", "auto"),
    Method("parallel_tree", 4, (2,)),
)
# Theorem 3.8 prices a round's drafting as K steps of a model of cost c each (in target
# steps). The parallel drafter takes one pass instead, over 2K positions (the last K + 1
# tokens and K - 1 masks: minispec/proposers/parallel.py): its c is that pass.
SEQUENTIAL = {"draft_model": "draft", "feature_head": "head"}
ONE_PASS = {"parallel": "draft"}


def pass_width(k: int) -> int:
    """The positions of the parallel drafter's one forward at K."""
    return 2 * k


def parse(label: str) -> Method:
    """A Method from its label, "proposer:K" or "tree:K:b1,b2" (ValueError if malformed)."""
    proposer, _, rest = label.partition(":")
    k, _, tree = rest.partition(":")
    ks = k == "auto" or k.isdigit()
    if proposer not in PROPOSER_NAMES or not ks or not re.fullmatch(r"(\d+(,\d+)*)?", tree):
        raise ValueError(
            f"{label!r}: write proposer:K, proposer:auto or tree:K:b1,b2, the proposer one of "
            + ", ".join(PROPOSER_NAMES)
        )
    branching = tuple(int(b) for b in tree.split(",")) if tree else DEFAULT_TREE_BRANCHING
    return Method(proposer, k if k == "auto" else int(k), branching)


def unavailable(method: Method, has_head: bool) -> str | None:
    """Why `method` cannot run in this checkout, or None."""
    from minispec.api import default_draft
    from minispec.proposers import PROPOSERS

    registered = PROPOSERS.get(method.proposer)
    if registered is None:
        return f"no proposer named {method.proposer!r} is registered"
    if not (draft := default_draft(method.proposer)).is_file():
        return f"no checkpoints/{draft.name}"
    if registered.needs == "head" and not has_head:
        return "no feature head (make train-head)"
    return None


def draft_cost(method: Method, c: dict[str, dict[str, float]]) -> float | None:
    """A round's drafting in target steps, as Theorem 3.8 prices it (K c), from c[model][width]
    (one forward of that many tokens over the target's 1-token step, widths as str: JSON's
    keys); None where the theorem does not apply: K = 0, auto, lookups and trees."""
    if not isinstance(method.k, int) or not method.k:
        return None
    if method.proposer in SEQUENTIAL:
        return method.k * c[SEQUENTIAL[method.proposer]]["1"]
    if method.proposer in ONE_PASS:
        return c[ONE_PASS[method.proposer]][str(pass_width(method.k))]
    return None
