"""`make bench-guard`: the speed guard. A few minutes of the harness, compared with a reference
the repository keeps (results/guard.json), so that a change to the round that costs speed shows
up the day it is made (docs/benchmarks.md, "The speed guard").

What it runs: B = 1, one thread for the rounds, rounds compiled ahead of time (aot), held-out
prompts; at each temperature K = 0 and that temperature's SETTINGS in the harness's shuffled
rotations (benchmarks/harness.py, `rotate`). Each rotation gives a setting one speedup, its
tok/s over the K = 0 run of the same rotation.

The rule: a setting FELL when new max < reference min, the two runs' min-max intervals apart,
the new one below. With nothing changed the m + n speedups are exchangeable, and all n new ones
fall below all m reference ones with probability 1 / C(m + n, n) (1 / 924 for 6 rotations each)
whatever the ratios' distribution: false alarms are rare. The price is sensitivity: a fall
within the runs' own spread passes (the harness's intervals, benchmarks/summary.py, see those).
The reference is written only with --update (or when there is none), so it changes only on
purpose. The exit code is 1 when a setting fell, else 0 (with --update, 0).

Nothing at the top of this module imports torch: the flags and the comparison stay light (the
comparison's test feeds it dicts), and the measurement imports the library when it runs.
"""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

from benchmarks.flags import guard_parser
from benchmarks.spread import format_spread, spread

# (temperature, K): K = 4 and auto at T = 0 and 1, and K = 8, the best fixed K at T = 0 in
# results/bench.md. Auto compiles rounds of its own at each of its widths (0, 2, 4, 8), so a
# cold cache builds them beside the fixed Ks'; a warm one loads them all.
SETTINGS: tuple[tuple[float, int | str], ...] = (
    (0.0, 4),
    (0.0, 8),
    (0.0, "auto"),
    (1.0, 4),
    (1.0, "auto"),
)
PROMPTS, MAX_NEW_TOKENS, THREADS = 4, 96, 1
COMMAND = "make bench-guard"


def setting_name(temperature: float, k: int | str) -> str:
    return f"T={temperature:g} K={k}"


def compare(reference: dict | None, new: dict) -> list[dict]:
    """One line per setting of the new run: {"setting", "reference", "new", "fell"}, where
    "reference" is None for a setting the reference lacks (it cannot fall), and a setting fell
    when its new max < the reference's min (the rule). reference and new: guard.json's dicts."""
    known = (reference or {}).get("settings", {})
    lines = []
    for name, row in new["settings"].items():
        ref, speedup = known.get(name, {}).get("speedup"), row["speedup"]
        line = {"setting": name, "reference": ref, "new": speedup}
        lines.append(line | {"fell": ref is not None and speedup["max"] < ref["min"]})
    return lines


def format_comparison(lines: list[dict]) -> str:
    out = []
    for line in lines:
        ref = line["reference"]
        before = format_spread(dict(ref, interval=None)) if ref else "no reference"
        after = format_spread(dict(line["new"], interval=None))
        verdict = "  FELL" if line["fell"] else ""
        out.append(f"  {line['setting']:<12} reference {before:<20} new {after}{verdict}")
    return "\n".join(out)


def mismatches(reference: dict, new: dict) -> list[str]:
    """What differs between the two runs' conditions beyond the code: a comparison across
    machines, torch builds or workloads says little about the round."""
    notes = []
    for key in ("prompts", "max_new_tokens", "threads", "pairs"):
        if reference.get(key) != new.get(key):
            notes.append(f"{key}: {reference.get(key)} then, {new.get(key)} now")
    for key in ("cpu", "cores", "torch"):
        then, now = reference.get("machine", {}).get(key), new["machine"].get(key)
        if then != now:
            notes.append(f"{key}: {then} then, {now} now")
    return notes


def commit() -> dict:
    """The commit measured, and whether tracked files differed from it."""

    def git(*args: str) -> str:
        try:
            done = subprocess.run(["git", *args], capture_output=True, text=True, check=True)
        except (OSError, subprocess.CalledProcessError):
            return ""
        return done.stdout.strip()

    return {"commit": git("rev-parse", "HEAD") or None, "dirty": bool(git("status", "-s", "-uno"))}


def measure(pairs: int) -> dict:
    """Every setting of SETTINGS against K = 0, as guard.json's dict, in the harness's
    rotations (the module's docstring says how)."""
    from types import SimpleNamespace

    import torch

    from benchmarks.decoding import warm_up
    from benchmarks.harness import rotate
    from benchmarks.methods import BASELINE, Method
    from benchmarks.summary import rate, rotation_stats, summed
    from benchmarks.timing import machine
    from minispec.api import DEFAULT_DRAFT, load_decoder
    from minispec.commands.prompts import held_out_prompts
    from model import tokenizer

    torch.set_num_threads(THREADS)
    start = time.perf_counter()
    decoder = load_decoder(device="cpu", compile="aot")
    prompts = {"held out": [tokenizer.encode(t) for t in held_out_prompts(PROMPTS)]}
    report = {"command": COMMAND, "machine": machine(torch.device("cpu"), THREADS), **commit()}
    report.update(compile_mode="aot", batch_size=1, threads=THREADS, prompts=PROMPTS)
    report.update(max_new_tokens=MAX_NEW_TOKENS, pairs=pairs, settings={})
    args = SimpleNamespace(draft_sample_method="auto", batch_size=1, seed=0, rotations=pairs)
    args.max_new_tokens = MAX_NEW_TOKENS
    # each temperature's settings, in SETTINGS's order
    at = {t: [Method("draft_model", k) for u, k in SETTINGS if u == t] for t, _ in SETTINGS}
    # Build (or load) every graph first, so that the time to build them, which only a cold
    # cache pays, is reported apart from the time the rotations take.
    for temperature, methods in at.items():
        specs = [m.spec("auto") for m in (BASELINE, *methods)]
        warm_up(decoder, prompts["held out"][:1], specs, temperature)
    report["graphs_s"] = round(time.perf_counter() - start, 1)
    for temperature, methods in at.items():
        runs, _ = rotate({DEFAULT_DRAFT: decoder}, [BASELINE, *methods], prompts, temperature, args)
        base = rotation_stats(runs[BASELINE.label], list(prompts))
        for m in methods:
            stats = rotation_stats(runs[m.label], list(prompts))
            ratios = [s.tokens_per_second / b.tokens_per_second for s, b in zip(stats, base)]
            total = summed(stats, m.k)
            name = setting_name(temperature, m.k)
            row = dict(temperature=temperature, K=m.k, speedup=spread(ratios), pairs=pairs)
            row.update(tokens_per_s=rate(stats), alpha=total.alpha)
            report["settings"][name] = row | {"k_histogram": dict(total.k_histogram)}
            print(f"  {name:<12} {format_spread(row['speedup'])}", flush=True)
    report["wall_s"] = round(time.perf_counter() - start, 1)
    return report


def render_markdown(report: dict) -> str:
    m = report["machine"]
    dirty = ", with uncommitted changes" if report.get("dirty") else ""
    lines = [
        "# Speed guard reference\n",
        f"Made by `{report['command']} ARGS=--update` (benchmarks/guard.py); "
        "docs/benchmarks.md says how the guard compares a run with it.\n",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, load average "
        f"{m.get('load_average_at_start', '-')} at the start; commit "
        f"{(report.get('commit') or 'unknown')[:12]}{dirty}. B = 1, {report['threads']} thread, "
        f"rounds compiled {report['compile_mode']}; {report['max_new_tokens']} new tokens for "
        f"each of {report['prompts']} held-out prompts; each setting is {report['pairs']} "
        f"shuffled rotations with K = 0, a speedup each. The run took {report['wall_s']:.0f} s, "
        f"{report['graphs_s']:.0f} s of it loading or building the graphs.\n",
        "| T | K | speedup median (min-max) | pairs | tok/s | alpha |",
        "|---|---|---|---|---|---|",
    ]
    for row in report["settings"].values():
        s = row["speedup"]
        lines.append(
            f"| {row['temperature']:g} | {row['K']} | {s['median']:.2f}x "
            f"({s['min']:.2f}-{s['max']:.2f}) | {row['pairs']} | {row['tokens_per_s']:.1f} | "
            f"{row['alpha']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def read_reference(path: Path) -> dict | None:
    """The kept reference, or None if there is none yet. ValueError naming the file for one
    that is not JSON or not guard.json's shape, before minutes of measuring that could not be
    compared with it."""
    if not path.exists():
        return None
    try:
        reference = json.loads(path.read_bytes())
    except ValueError as error:  # JSONDecodeError, or UnicodeDecodeError: not text
        problem = f"not valid JSON ({error})"
    else:
        if is_reference(reference):
            return reference
        problem = "not a speed guard reference"
    raise ValueError(f"{path} is {problem}: delete it, and {COMMAND} makes a new one")


def is_reference(data: object) -> bool:
    """Whether `data` has what compare and mismatches read: settings, each with a speedup's
    median, min and max, and a machine (if any) as a dict."""
    if not isinstance(data, dict) or not isinstance(data.get("machine", {}), dict):
        return False
    settings = data.get("settings")
    return isinstance(settings, dict) and all(
        isinstance(row, dict)
        and isinstance(row.get("speedup"), dict)
        and all(isinstance(row["speedup"].get(k), (int, float)) for k in ("median", "min", "max"))
        for row in settings.values()
    )


def main(argv: list[str]) -> int:
    args = guard_parser().parse_args(argv)
    path = Path(args.reference)
    reference = read_reference(path)
    print(f"reference: {path if reference else 'none yet'}", flush=True)
    new = measure(args.pairs)
    lines = compare(reference, new)
    print("speedup over K = 0, median (min-max); FELL: new max < reference min")
    print(format_comparison(lines))
    for note in mismatches(reference, new) if reference else []:
        print(f"  note: the runs differ in {note}")
    took = f"{new['wall_s']:.0f} s, {new['graphs_s']:.0f} s of it loading or building the graphs"
    print(f"guard run: {took}")
    if args.update or reference is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(new, indent=2) + "\n")
        path.with_suffix(".md").write_text(render_markdown(new))
        print(f"wrote {path} and {path.with_suffix('.md')}")
        return 0
    fallen = [line["setting"] for line in lines if line["fell"]]
    if fallen:
        print(f"FELL: {', '.join(fallen)} (reference kept; --update replaces it)")
        return 1
    return 0


if __name__ == "__main__":
    from minispec.commands.front_door import run

    raise SystemExit(run(main))
