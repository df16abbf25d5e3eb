"""sampling/: logits and draft tokens in, token ids out. Knows nothing of models.

- ``rejection_sample``: the exact speculative rejection sampler (Leviathan et al. 2022, Alg. 1).
- ``sample``: plain sampling under temperature -> top-k -> top-p, returning the exact probabilities.
- ``sampling.reference``: a deliberately plain loop version of the rejection sampler, for tests.
"""

from sampling.constraints import SampleOutput, sample
from sampling.rejection import PLACEHOLDER_TOKEN_ID, RejectionOutput, rejection_sample

__all__ = ["PLACEHOLDER_TOKEN_ID", "RejectionOutput", "SampleOutput", "rejection_sample", "sample"]
