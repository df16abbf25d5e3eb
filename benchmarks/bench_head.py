"""`make bench-head`: the feature head against the draft model, B = 1, on held-out prompts.

For each proposer, K and temperature: the row decodes each prompt as its own request,
interleaved with K = 0 (A B A B in one process, the rounds compiled as --compile-mode says),
and reports the median speedup over the pairs with its min and max, alpha, tokens per target
forward, per-position acceptance, c (one draft step of that proposer over the target's 1-token
step, each compiled alone and timed interleaved in this run) and Theorem 3.8's prediction.
Writes results/head.md and results/head.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch

from benchmarks.bench_proposers import decode_all, warm_up
from benchmarks.flags import COMPILE_MODES
from benchmarks.spread import format_spread, spread
from minispec.api import load_decoder
from minispec.commands.prompts import held_out_prompts
from minispec.compilation import compile_round
from minispec.params import SpeculativeConfig
from minispec.rules import TREE_PROPOSERS
from minispec.stats import predicted_speedup
from model import tokenizer


class HeadStep(torch.nn.Module):
    """One drafting step of the head: its layer at one position, then the target's LM head."""

    def __init__(self, target, head) -> None:
        super().__init__()
        self.target, self.head = target, head

    def forward(self, state, token, positions):
        return self.target.logits(self.head(self.target, state, token, positions))


@torch.no_grad()
def draft_step_ratios(decoder, repeats: int, compile) -> dict:
    """c per proposer: median of (its 1-token draft step / the target's 1-token step), the
    three steps compiled alone at position 320 and timed in rotation."""
    target, draft, head = decoder.target, decoder.draft, decoder.head
    for m in (target, draft, head):
        m.setup_cache(1)
    device = target.embed.weight.device
    token, positions = torch.zeros(1, 1, dtype=torch.long), torch.tensor([[320]])
    state = torch.zeros(1, 1, target.config.d_model)
    steps = {
        "target": (target, (token, positions)),
        "draft_model": (draft, (token, positions)),
        "feature_head": (HeadStep(target, head), (state, token, positions)),
    }
    calls = {
        name: (compile_round(m, f"{name} step", compile, device, torch.nn.ModuleList([m])), args)
        for name, (m, args) in steps.items()
    }
    times = {name: [] for name in calls}
    for _ in range(2):
        for fn, args in calls.values():
            fn(*args)  # compile and warm
    for _ in range(repeats):
        for name, (fn, args) in calls.items():
            start = time.perf_counter()
            fn(*args)
            times[name].append(time.perf_counter() - start)
    base = statistics.median(times["target"])
    return {name: statistics.median(times[name]) / base for name in ("draft_model", "feature_head")}


def row(decoder, prompts, proposer, k, temperature, max_new, pairs, c, branching=(2,)) -> dict:
    spec = SpeculativeConfig(k, proposer=proposer, tree_branching=branching)
    baseline = SpeculativeConfig(0)
    warm_up(decoder, prompts[:1], [spec, baseline], temperature)
    runs = [
        (
            decode_all(decoder, prompts, spec, temperature, max_new, 1000 * r, batch=False),
            decode_all(decoder, prompts, baseline, temperature, max_new, 1000 * r, batch=False),
        )
        for r in range(pairs)
    ]
    ratios = [s.speedup_over(b) for s, b in runs]
    median = sorted(runs, key=lambda sb: sb[0].tokens_per_second)[len(runs) // 2][0]
    alpha = median.alpha or 0.0
    tree = proposer in TREE_PROPOSERS
    return {
        "proposer": proposer + (f" {','.join(map(str, branching))}" if tree else ""),
        "K": k,
        "nodes": spec.verify_width,
        "temperature": temperature,
        "speedup": spread(ratios),
        "tokens_per_s": statistics.median(s.tokens_per_second for s, _ in runs),
        "tokens_per_s_K0": statistics.median(b.tokens_per_second for _, b in runs),
        "alpha": alpha,
        "tokens_per_target_forward": median.tokens_per_target_forward,
        "per_position_acceptance": median.per_position_acceptance,
        "c": c,
        "predicted_speedup": None if tree else predicted_speedup(alpha, k, c),
        "pairs": pairs,
    }


HEADER = (
    "| proposer | K | drafts verified | T | tok/s | tok/s K=0 | speedup [interval] (min-max) | "
    "alpha | tokens/target forward | per-position acceptance | c | predicted |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def format_row(r: dict) -> str:
    positions = " ".join(f"{a:.2f}" for a in r["per_position_acceptance"])
    predicted = "-" if r["predicted_speedup"] is None else f"{r['predicted_speedup']:.2f}x"
    return (
        f"| {r['proposer']} | {r['K']} | {r['nodes']} | {r['temperature']:g} | "
        f"{r['tokens_per_s']:.1f} | {r['tokens_per_s_K0']:.1f} | {format_spread(r['speedup'])} | "
        f"{r['alpha']:.3f} | {r['tokens_per_target_forward']:.2f} | {positions} | "
        f"{r['c']:.3f} | {predicted} |"
    )


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_head", description=__doc__)
    p.add_argument("--head-ks", default="2,4,6,8", help="the head's K")
    p.add_argument("--draft-ks", default="4", help="the draft model's K")
    p.add_argument(
        "--trees",
        default="4:2",
        help="the head's trees, K:branching;... (4:2: depth 4, two candidates for the first "
        "token, 8 nodes; compare with the head's chain of as many drafts)",
    )
    p.add_argument("--temperatures", default="0,1")
    p.add_argument("--prompts", type=int, default=6)
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--pairs", type=int, default=5)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--compile-mode", choices=tuple(COMPILE_MODES), default="aot")
    p.add_argument("--out", default="results")
    return p


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    torch.set_num_threads(args.threads)
    compile = COMPILE_MODES[args.compile_mode]
    decoder = load_decoder(compile=compile)
    if decoder.feature_head() is None:
        print("bench-head: no feature head (checkpoints/head.safetensors): make train-head")
        return 2
    texts = held_out_prompts(args.prompts)
    prompts = [tokenizer.encode(t) for t in texts]
    c = draft_step_ratios(decoder, 21, compile)
    print(f"c: draft model {c['draft_model']:.3f}, feature head {c['feature_head']:.3f}")
    print(HEADER, flush=True)
    rows = []
    settings = [("feature_head", int(k), (2,)) for k in args.head_ks.split(",") if k]
    settings += [("draft_model", int(k), (2,)) for k in args.draft_ks.split(",") if k]
    for tree in filter(None, args.trees.split(";")):
        k, branching = tree.split(":")
        settings.append(("head_tree", int(k), tuple(map(int, branching.split(",")))))
    for temperature in (float(t) for t in args.temperatures.split(",")):
        for proposer, k, branching in settings:
            cost = c["draft_model" if proposer == "draft_model" else "feature_head"]
            r = row(
                decoder, prompts, proposer, k, temperature, args.max_new_tokens,
                args.pairs, cost, branching,
            )  # fmt: skip
            print(format_row(r), flush=True)
            rows.append(r)
    out = Path(args.out)
    command = "python -m benchmarks.bench_head " + " ".join(sys.argv[1:] if argv is None else argv)
    report = {"command": command.strip(), "threads": args.threads, "c": c, "rows": rows}
    (out / "head.json").write_text(json.dumps(report, indent=1) + "\n")
    table = "\n".join([HEADER] + [format_row(r) for r in rows])
    (out / "head.md").write_text(
        "# The feature head against the draft model (B = 1, held-out prompts)\n\n"
        f"`{report['command']}` ({args.threads} thread, {args.compile_mode} rounds, "
        f"{args.pairs} interleaved pairs with K = 0 per row, {len(prompts)} prompts of "
        f"{args.max_new_tokens} new tokens). c: draft model {c['draft_model']:.3f}, feature "
        f"head {c['feature_head']:.3f} (one draft step over the target's 1-token step).\n\n"
        f"{table}\n"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
