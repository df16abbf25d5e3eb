"""The harness's tables: bench.md from a run's record, and the README's block made from it.

Everything here reads the record (bench.json) through summary.py, so a table can be remade
from the file, and tests/test_bench_readme.py checks that the README's block is.
"""

from __future__ import annotations

from benchmarks import summary
from benchmarks.methods import BASELINE, parse
from minispec.rules import TREE_PROPOSERS

README_BEGIN = "<!-- results: made by `make bench` from results/bench.json; do not edit -->"
README_END = "<!-- end of results -->"
# The README's rows, where the run has them: the default (auto), the K the field reports, the
# head, a lookup, and the parallel drafter.
HEADLINE = (
    "draft_model:auto",
    "draft_model:4",
    "feature_head:4",
    "ngram:auto",
    "parallel:4",
    "parallel:auto",
)
ABOVE_MARK = "†"


def method_cells(label: str) -> list[str]:
    """(method, K) as the tables print them."""
    if label == BASELINE.label:
        return ["target alone", "0"]
    m = parse(label)
    tree = f" {'x'.join(map(str, m.branching))}" if m.proposer in TREE_PROPOSERS else ""
    return [m.proposer + tree, str(m.k)]


def number(value: float | None, digits: int = 2, unit: str = "") -> str:
    return "-" if value is None else f"{value:.{digits}f}{unit}"


def speedup_cell(row: dict) -> str:
    s = row["speedup"]
    mark = f" {ABOVE_MARK}" if row.get("above") else ""
    return f"{s['median']:.2f}x [{s['low']:.2f}-{s['high']:.2f}]{mark}"


def correctness_cell(report: dict, temperature: str, label: str) -> str:
    """T = 0: prompts whose text equals K = 0's, and the first that differs; T > 0: the mean
    target log-likelihood per token of the samples, and Welch's z against K = 0's."""
    check = report["temperatures"][temperature]["correctness"][label]
    if "equal" in check:
        where = f" ({check['first_difference']})" if check["first_difference"] else ""
        return f"{check['equal']}/{check['of']}{where}"
    z = "" if label == BASELINE.label else f", z {check['z']:+.1f}"
    flag = "" if check.get("agrees", True) else " **differs**"
    return f"{check['log_likelihood']:.3f}{z}{flag}"


def histogram(row: dict) -> str:
    if not str(row["label"]).endswith(":auto"):
        return "-"
    counts = sorted(row["k_histogram"].items(), key=lambda kn: int(kn[0]))  # JSON's str keys
    return " ".join(f"{k}:{n}" for k, n in counts)


def method_table(report: dict, temperature: str) -> list[str]:
    greedy = float(temperature) == 0
    check = "same text as K = 0" if greedy else "log-likelihood / token (z vs K = 0)"
    lines = [
        f"| method | K | tok/s | speedup [95 %] | τ | α | per-position acceptance | c | "
        f"Theorem 3.8 | {check} | K chosen (rounds) |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in summary.rows(report, temperature):
        positions = " ".join(f"{a:.2f}" for a in row["per_position"]) or "-"
        cells = [
            *method_cells(row["label"]),
            f"{row['tokens_per_s']:.1f}",
            speedup_cell(row),
            f"{row['tau']:.2f}",
            number(row["alpha"], 3),
            positions,
            number(row["c"], 3),
            number(row["predicted"], 2, "x"),
            correctness_cell(report, temperature, row["label"]),
            histogram(row),
        ]
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def category_table(report: dict, temperature: str) -> list[str]:
    categories = [c for c, prompts in report["prompts"].items() if prompts]
    lines = [
        "| method | K | " + " | ".join(categories) + " | all |",
        "|---|---|" + "---|" * (len(categories) + 1),
    ]
    overall = {r["label"]: r for r in summary.rows(report, temperature, categories)}
    per = {c: {r["label"]: r for r in summary.rows(report, temperature, [c])} for c in categories}
    for label in overall:
        if label == BASELINE.label:
            continue
        cells = [f"{per[c][label]['speedup']['median']:.2f}x" for c in categories]
        cells.append(f"**{overall[label]['speedup']['median']:.2f}x**")
        lines.append("| " + " | ".join(method_cells(label) + cells) + " |")
    base = [f"{per[c][BASELINE.label]['tokens_per_s']:.0f}" for c in categories]
    lines.append("| K = 0 tok/s | | " + " | ".join(base) + " | |")
    return lines


def setting_line(report: dict) -> str:
    s, m = report["settings"], report["machine"]
    counts = ", ".join(f"{c} {len(p)}" for c, p in report["prompts"].items())
    return (
        f"{m['cpu']}, {m['cores']} cores, torch {m['torch']}, {m.get('gpu', m['device'])}, "
        f"{s['threads']} thread(s), rounds compiled {s['compile_mode']}, load average "
        f"{m.get('load_average_at_start', '-')} at the start. B = {s['batch_size']}, "
        f"{s['max_new_tokens']} new tokens per prompt; prompts per category: {counts}; "
        f"{s['rotations']} rotations; draft sample method {s['draft_sample_method']}."
    )


def render(report: dict) -> str:
    """bench.md."""
    lines = [
        "# Every method against one K = 0 baseline\n",
        f"Made by `{report['command']}` in {report['wall_s'] / 60:.0f} min. "
        f"{setting_line(report)}\n",
        "Each rotation runs every method once over every prompt (B = 1: one request each), "
        "category by category, in an order shuffled anew for each (seeded); the graphs are "
        "built or loaded and run once before the first rotation, untimed. tok/s is new tokens "
        "over decode seconds (the prefill left out), pooled over the rotations. The speedup is "
        "the median over rotations of a row's tok/s over the run's one pooled K = 0 tok/s; "
        "[95 %]: a "
        "percentile bootstrap over rotations, the row's and K = 0's runs drawn from the same "
        "rotations (benchmarks/summary.py). τ: tokens per target forward, the bonus token "
        "included. c: one draft forward over the target's 1-token step, measured in this "
        "process; Theorem 3.8 prices a chain's drafting at K c (the parallel drafter's one "
        f"pass at its c). {ABOVE_MARK}: faster than Theorem 3.8 predicts by more than 10 %, a "
        "sign of a slow baseline.\n",
    ]
    for label, reason in report["skipped"].items():
        lines.append(f"- {label} not run: {reason}.")
    lines += ["\n## Steps (B = 1, one forward each, compiled as the rounds are)\n"]
    lines += steps_table(report["steps"])
    for temperature in report["temperatures"]:
        lines += [f"\n## T = {temperature}\n", *method_table(report, temperature)]
        lines += ["\nSpeedup by prompt category (median over rotations):\n"]
        lines += category_table(report, temperature)
    return "\n".join(lines) + "\n"


def steps_table(steps: dict) -> list[str]:
    lines = ["| model | tokens | ms | floor ms | x floor | / target 1-token step |"]
    lines.append("|---|---|---|---|---|---|")
    for name, widths in steps["ms"].items():
        floor = steps["floor_ms"].get(name)
        for width, ms in sorted(widths.items(), key=lambda item: int(item[0])):
            over = number(ms / floor if floor else None, 1, "x")
            c = number(steps["c"][name][width], 3)
            lines.append(f"| {name} | {width} | {ms:.2f} | {number(floor)} | {over} | {c} |")
    return lines


def readme_block(report: dict) -> str:
    """The README's results, between its markers: the HEADLINE rows the run has, T = 0 and
    T = 1 side by side, over every category."""
    temperatures = list(report["temperatures"])
    by_t = {t: {r["label"]: r for r in summary.rows(report, t)} for t in temperatures}
    base = ", ".join(
        f"{by_t[t][BASELINE.label]['tokens_per_s']:.0f} tok/s at T = {t}" for t in temperatures
    )
    lines = [
        README_BEGIN,
        f"{setting_line(report)} K = 0: {base}. Made by `{report['command']}` "
        "([results/bench.md](results/bench.md): every method, per category, the steps).\n",
        "| method | K | "
        + " | ".join(f"speedup T = {t} [95 %]" for t in temperatures)
        + " | τ | α | c | Theorem 3.8 |",
        "|---|---|" + "---|" * (len(temperatures) + 4),
    ]
    first = by_t[temperatures[0]]
    for label in (label for label in HEADLINE if label in first):
        r = first[label]
        cells = [*method_cells(label), *(speedup_cell(by_t[t][label]) for t in temperatures)]
        cells += [f"{r['tau']:.2f}", number(r["alpha"], 3), number(r["c"], 3)]
        cells.append(number(r["predicted"], 2, "x"))
        lines.append("| " + " | ".join(cells) + " |")
    lines.append(
        f"\nτ, α, c and Theorem 3.8 at T = {temperatures[0]}; {ABOVE_MARK}: above Theorem 3.8 by "
        f"more than 10 %. {README_END}"
    )
    return "\n".join(lines)
