"""Which K finishes a call soonest: the prediction adaptive K (adaptive.py) acts on.

A round of K drafts emits n + 1 tokens per row, n the drafts it accepts. With a_d the measured
chance that the draft at depth d passes once the drafts before it did, n = j with probability
a_1 ... a_j (1 - a_{j+1}), and n = K with a_1 ... a_K: eq. (1) of Leviathan et al. is the case
a_d = alpha at every depth, which overvalues deep rounds, since a pair's acceptance falls with
depth. A call ends when its slowest row has emitted what it still has to. A row with r tokens to
go needs about r / mu rounds, mu and sigma^2 the mean and variance of a round's tokens, give or
take sigma sqrt(r / mu^3) (the renewal central limit theorem). Rows also differ beyond chance
(their prompts do): a row whose acceptance sits tau under the batch's (a_d - tau at every
depth, mean mu_tau) needs r (1 / mu_tau - 1 / mu) rounds more. The slowest of B rows needs about
z_B of the two spreads combined more, z_B the expected largest of B standard normals. So a call
at width K has left about

    time(K) = t(K) * (r / mu_K + z_B * sqrt(sigma_K^2 r / mu_K^3 + r^2 (1/mu_tau - 1/mu_K)^2))

t(K) the width's round time. At K = 0 both spreads are 0: every row ends on the same round,
which is why a batch that speculates pays for its unluckiest row and a K that wins at B = 1 can
lose at B = 16. At B = 64, T = 1 on this CPU, rows' rounds to finish at K = 2 spread 6-8 where
chance alone gives 3: without tau the rule predicts 64 rounds for the slowest row against 73-76
measured. Plain Python floats: the policy runs this on the host, once a round.
"""

from __future__ import annotations

import math
from functools import lru_cache
from typing import Sequence


def round_tokens(acceptance: Sequence[float], k: int) -> tuple[float, float]:
    """The mean and variance of the tokens one row emits in a round of k drafts; acceptance[d]:
    the chance the draft at depth d + 1 passes once those before it did."""
    mean = square = 0.0
    reach = 1.0  # the chance that the first j drafts all pass
    for j in range(k + 1):
        stop = 1.0 - acceptance[j] if j < k else 1.0  # the chance the round ends at j + 1 tokens
        mean += reach * stop * (j + 1)
        square += reach * stop * (j + 1) ** 2
        reach *= acceptance[j] if j < k else 0.0
    return mean, square - mean * mean


@lru_cache(maxsize=None)
def expected_largest_normal(rows: int) -> float:
    """z_B: the expected largest of `rows` independent standard normals (0 for one row), by the
    midpoint rule on E[max] = integral of x B phi(x) Phi(x)^(B-1) over [-8, 8]."""
    step, total = 1e-3, 0.0
    for i in range(16_000):
        x = -8 + (i + 0.5) * step
        density = math.exp(-x * x / 2) / math.sqrt(2 * math.pi)
        total += x * rows * density * (0.5 * (1 + math.erf(x / math.sqrt(2)))) ** (rows - 1)
    return total * step


def time_to_finish(
    acceptance: Sequence[float],
    k: int,
    round_time: float,
    remaining: int,
    rows: int,
    spread: float = 0.0,
) -> float:
    """time(K) above: the predicted time the call has left at width k, its slowest row having
    `remaining` tokens to go among `rows` active rows whose acceptance differs by `spread`
    (tau). A round drafts no more than that row can keep."""
    depth = min(k, max(remaining - 1, 0))
    mean, variance = round_tokens(acceptance, depth)
    z, between = expected_largest_normal(rows), 0.0
    if z and spread:  # read where the slowest row sits, z spreads under: 1 / mu is convex in a
        slow_mean, _ = round_tokens([max(a - z * spread, 0.0) for a in acceptance], depth)
        between = remaining * (1 / slow_mean - 1 / mean) / z
    rounds = remaining / mean + z * math.sqrt(variance * remaining / mean**3 + between**2)
    return round_time * rounds


def choose_width(times: Sequence[float], margin: float, current: int | None = None) -> int:
    """The index of the width to run: the current one (an index) while its predicted time is
    within a factor (1 + margin) of the least, else the least. A change of width costs a slow
    round: the other width must promise more than noise."""
    best = min(range(len(times)), key=times.__getitem__)
    if current is not None and times[current] <= times[best] * (1 + margin):
        return current
    return best
