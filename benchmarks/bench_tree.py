"""`make bench-tree`: a tree of drafts against a chain of as many verified nodes (--proposer tree).

At each batch size B and temperature T, K = 0, the chains and the trees of SETTINGS run in
rotation (K = 0, chain, tree, ..., K = 0, ...) on held-out prompts, in one process. A tree and a
chain with the same N verify N drafts in one target forward of N + 1 tokens; the tree spends
some of them on second candidates, the chain on deeper positions. Each setting reports:
- tokens per target forward (every round is one target forward): the emitted tokens over the
  rounds, summed over the rotations' rows;
- tok/s and the speedup over the K = 0 run of its rotation;
- the tree over the chain with the same N, paired by rotation.
Ratios are the median and (min-max) of the rotations' (benchmarks.spread). Writes
results/tree.md and results/tree.json (--out PATH: PATH.md and PATH.json).
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import time
from pathlib import Path

# (name, K, tree_branching or None for a chain). A chain of K verifies N = K drafts; the trees
# put two or four candidates at the first depth over a chain: N = 2K or 4K.
SETTINGS = (
    ("chain K=2", 2, None),
    ("chain K=4", 4, None),
    ("chain K=8", 8, None),
    ("tree 2x2", 2, (2,)),
    ("tree 2x4", 4, (2,)),
    ("tree 4x2", 2, (4,)),
)


def chain_with(nodes: int) -> str:
    return f"chain K={nodes}"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m benchmarks.bench_tree", description=__doc__)
    p.add_argument("--batch-sizes", default="1,16", help="comma-separated (default 1,16)")
    p.add_argument("--temperatures", default="0,1", help="comma-separated (default 0,1)")
    p.add_argument("--rotations", type=int, default=5, help="rotations per point (default 5)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--prompts", type=int, default=4, help="held-out prompts per B = 1 point")
    p.add_argument("--compile-mode", choices=("jit", "eager"), default="jit")
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu", help="cpu, or cuda (rounds under CUDA graphs)")
    p.add_argument(
        "--settings",
        default=",".join(name for name, _, _ in SETTINGS),
        help="comma-separated names from SETTINGS (default: all)",
    )
    p.add_argument("--out", default="results/tree", help="writes OUT.md and OUT.json")
    return p


def spec_of(k: int, branching: tuple[int, ...] | None):
    from minispec.params import SpeculativeConfig

    if branching is None:
        return SpeculativeConfig(k)
    return SpeculativeConfig(k, proposer="tree", tree_branching=branching)


def point(decoder, prompts, settings, temperature: float, batch: bool, rotations: int, max_new):
    """One (B, T) point: every setting and K = 0 in rotation; one row per setting."""
    from benchmarks.bench_proposers import decode_all, warm_up
    from benchmarks.spread import spread
    from minispec.params import SpeculativeConfig

    specs = {"K=0": SpeculativeConfig(0)} | {n: spec_of(k, b) for n, k, b in settings}
    warm_up(decoder, prompts if batch else prompts[:1], list(specs.values()), temperature)
    runs = [
        {
            name: decode_all(decoder, prompts, s, temperature, max_new, 1000 * r, batch)
            for name, s in specs.items()
        }
        for r in range(rotations)
    ]
    rows = {}
    for name, k, branching in settings:
        stats = [rotation[name] for rotation in runs]
        rounds, emitted = sum(s.rounds for s in stats), sum(s.emitted for s in stats)
        rows[name] = {
            "K": k,
            "tree_branching": branching,
            "nodes": spec_of(k, branching).verify_width,
            "tokens_per_target_forward": emitted / rounds,
            "tokens_per_s": statistics.median(s.tokens_per_second for s in stats),
            "speedup": spread([r[name].speedup_over(r["K=0"]) for r in runs]),
        }
    for name, row in rows.items():
        # Against the chain that verifies as many nodes, and the one as deep (as many drafts
        # accepted at most, as many draft steps), where each ran.
        for key, chain in (
            ("same_nodes", chain_with(row["nodes"])),
            ("same_depth", chain_with(row["K"])),
        ):
            if row["tree_branching"] and chain in rows:
                row[key] = {
                    "chain": chain,
                    "tokens_per_target_forward": row["tokens_per_target_forward"]
                    / rows[chain]["tokens_per_target_forward"],
                    "tokens_per_s": spread(
                        [r[name].tokens_per_second / r[chain].tokens_per_second for r in runs]
                    ),
                }
    base = statistics.median(r["K=0"].tokens_per_second for r in runs)
    return {"tokens_per_s_K0": base, "settings": rows}


def render(report: dict) -> str:
    from benchmarks.spread import format_spread

    lines = [
        "# Trees of drafts against chains\n",
        f"Made by `{report['command']}` (benchmarks/bench_tree.py, whose docstring says what "
        f"each column is). {report['machine']}; {report['threads']} thread, rounds "
        f"{report['compile_mode']}; {report['max_new_tokens']} new tokens per held-out prompt, "
        f"{report['rotations']} rotations per point; {report['wall_s']:.0f} s in all.\n",
        "| B | T | setting | nodes | tokens / target forward | tok/s | over K = 0 | "
        "against the chain of as many nodes: tokens / forward, tok/s | against the chain as "
        "deep: tokens / forward, tok/s |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for p in report["points"]:
        for name, row in p["settings"].items():
            against = []
            for key in ("same_nodes", "same_depth"):
                c = row.get(key)
                against.append(
                    f"{c['tokens_per_target_forward']:.2f}x, {format_spread(c['tokens_per_s'])} "
                    f"({c['chain']})"
                    if c
                    else "-"
                )
            cells = [
                p["B"],
                f"{p['T']:g}",
                name,
                row["nodes"],
                f"{row['tokens_per_target_forward']:.2f}",
                f"{row['tokens_per_s']:.1f}",
                format_spread(row["speedup"]),
                *against,
            ]
            lines.append("| " + " | ".join(map(str, cells)) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    flags = parser()
    args = flags.parse_args(argv)
    import torch

    from benchmarks.bench_sampler import machine
    from minispec.api import load_decoder
    from minispec.commands.prompts import held_out_prompts
    from model import tokenizer

    names = args.settings.split(",")
    settings = [s for s in SETTINGS if s[0] in names]
    if len(settings) != len(names):
        flags.error(f"--settings: choose from {', '.join(n for n, _, _ in SETTINGS)}")
    torch.set_num_threads(args.threads)
    start = time.perf_counter()
    decoder = load_decoder(device=args.device, compile=args.compile_mode == "jit")
    texts = held_out_prompts(max(args.prompts, 16))
    m = machine(torch.device(args.device), args.threads)
    report = {
        "command": "make bench-tree" + (f' ARGS="{shlex.join(argv)}"' if argv else ""),
        "machine": f"{m.get('gpu', m['cpu'])}, {m['cores']} cores, torch {m['torch']}, "
        f"load average {m.get('load_average_at_start', '-')} at the start",
        "threads": args.threads,
        "compile_mode": args.compile_mode,
        "max_new_tokens": args.max_new_tokens,
        "rotations": args.rotations,
        "points": [],
    }
    for b in map(int, args.batch_sizes.split(",")):
        batch = b > 1
        count = b if batch else args.prompts
        prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(count)]
        for t in map(float, args.temperatures.split(",")):
            p = point(decoder, prompts, settings, t, batch, args.rotations, args.max_new_tokens)
            report["points"].append({"B": b, "T": t, **p})
            print(json.dumps({"B": b, "T": t, **p["settings"]}, default=str)[:2000], flush=True)
    report["wall_s"] = time.perf_counter() - start
    out = Path(args.out)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    out.with_suffix(".md").write_text(render(report))
    print(f"wrote {out}.md and {out}.json")
    return 0


if __name__ == "__main__":
    from minispec.commands.front_door import run

    raise SystemExit(run(main))
