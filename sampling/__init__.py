"""sampling/: logits and draft tokens in, token ids out. Knows nothing of models.

- ``rejection_sample``: the exact speculative rejection sampler (Leviathan et al. 2022, Alg. 1),
  token-wise, by block verification (Sun et al. 2024) or drafter-invariant (Daliri et al. 2024),
  for rows of up to K drafts.
- ``tree_rejection_sample``: the same guarantee for a tree of drafts with several candidates
  per position (SpecInfer's multi-step speculative sampling, Miao et al. 2023), whose shape
  ``tree_shape`` builds.
- ``sampling.rules``: the rules by name (``method``), each with the fields that set it apart.
- ``sample``: plain sampling under temperature -> top-k -> top-p, returning the exact probabilities.
- ``sampling.reference``: a deliberately plain loop version of the rejection sampler, for tests.
- ``sampling.exact_law``: the exact law of one round by enumeration, in fractions.
"""

from sampling.constraints import SampleOutput, sample
from sampling.rejection import PLACEHOLDER_TOKEN_ID, RejectionOutput, rejection_sample
from sampling.rules import REJECTION_SAMPLE_METHODS, TREE_SAMPLE_METHODS
from sampling.tree import TreeOutput, TreeShape, tree_rejection_sample, tree_shape

__all__ = [
    "PLACEHOLDER_TOKEN_ID",
    "REJECTION_SAMPLE_METHODS",
    "RejectionOutput",
    "SampleOutput",
    "TREE_SAMPLE_METHODS",
    "TreeOutput",
    "TreeShape",
    "rejection_sample",
    "sample",
    "tree_rejection_sample",
    "tree_shape",
]
