"""make verify: the worked example that motivates minispec, through its own compiled sampler.

    python -m minispec verify [--draws 2000000] [--rounds 200000] [--loop-rows 40000] [--seed 0]

1. p = [0.50, 0.25, 0.15, 0.07, 0.03], q = [0.30, 0.40, 0.10, 0.15, 0.05], one draft per round.
   For a probabilistic draft (x ~ q), a one-hot argmax draft (x = 1) and naive resampling, it
   prints the acceptance rate, the output frequencies and the L1 distance to p. Expected:
   acceptance 0.75 / 0.25 / 0.75 (sum min(p, q), p(1), sum min(p, q)); output p, p, and for
   naive min(p, q) + 0.25 p, whose token 0 is 0.425 and whose L1 to p is 0.175.
2. Eq. (1) of Leviathan et al.: a round emits (1 - a^(g+1)) / (1 - a) tokens on average when
   every position accepts with probability a and g tokens are drafted. For a in {0.75, 0.9}
   and g in {3, 7} it simulates rounds through the sampler with a (p, q) pair whose
   sum min(p, q) is a, and prints the measured mean next to the formula.
3. Block verification (Sun et al. 2024, arXiv 2403.10444) on its toy example: V = {a, b},
   Mb = (1/3, 2/3), Ms = (2/3, 1/3) at every position, gamma = 2. The expected number of
   accepted drafts is 10/9 token-wise, 11/9 with block verification and 12/9 at the optimum,
   exact rationals from enumerating every draft block (sampling.exact_law); the first two are
   also simulated through the compiled sampler, and the first token of a round must follow Mb.
4. The exact rules (standard, block, drafter_invariant, the tree) through the decode loop, where a
   round may not reuse a number an earlier round's kept outcome depended on: a tiny random
   target (V = 5) and a draft close to it, prompt [1, 3], K = 3, T = 1, probabilistic drafts,
   --loop-rows rows with their own seeds, 3 new tokens each. The empirical law of the 125
   sequences against the target's, enumerated from its conditionals, by a chi-square over
   every cell; the run fails if p < 1e-6. (Noise that a later round reuses after block
   verification conditioned it fails this check: tests/test_noise_rounds.py.)

5. The tree rule (sampling/tree.py, --proposer tree) on part 1's p and q: two candidates for
   one token, drawn from q without replacement or i.i.d., and naive (the second candidate
   tested against p instead of the residual). Expected, exact from sampling.exact_law:
   acceptance 28943/32300 = 0.896 and 17/20, output p; naive's output is off p. Part 4 also
   runs the tree (two candidates at the first depth, K = 3) through the loop.

Every measured figure is compared with its exact expected value; the run fails (exit 1) if
any is off by more than 6 standard deviations of its sampling error (a false alarm has
probability about 2e-9 per figure), or if part 4's fit is below 1e-6.
"""

from __future__ import annotations

import argparse

from minispec.commands.args import OneLineParser, integer


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="minispec verify",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    # All draws are held in memory at once (about 100 bytes each): the bounds keep that in RAM.
    parser.add_argument("--draws", type=integer(1, 20_000_000), default=2_000_000)
    parser.add_argument("--rounds", type=integer(1, 2_000_000), default=200_000)
    parser.add_argument("--seed", type=integer(0), default=0)
    parser.add_argument("--loop-rows", type=integer(1, 1_000_000), default=40_000)
    parser.add_argument("--device", default="cpu", help="where the checks run: cpu, or cuda")
    args = parser.parse_args(argv)
    from minispec.commands.verify_checks import (  # deferred: torch, after the flags are checked
        SIGMAS,
        Verdict,
        block_toy_example,
        device_or_exit,
        through_the_loop,
        tokens_per_round,
        tree_example,
        worked_example,
    )

    print(
        "compiling the sampler's graphs on first use (cached on disk afterwards) ...\n", flush=True
    )
    verdict = Verdict()
    with device_or_exit(args.device):  # every tensor the checks make is made there
        worked_example(args.draws, args.seed, verdict)
        tokens_per_round(args.rounds, args.seed, verdict)
        block_toy_example(args.rounds, args.seed, verdict)
        through_the_loop(args.loop_rows, args.seed, verdict)
        tree_example(args.draws, args.seed, verdict)
    if verdict.failures:
        print("\nFAILED: " + "; ".join(verdict.failures))
        return 1
    print(f"\nall figures within {SIGMAS:g} sigma of their expected values")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
