"""`make bench ARGS=--vllm`: vLLM beside minispec, on the same pair, prompts and machine.

vLLM runs in its own virtual environment (`make vllm-check` builds .venv-vllm), so each vLLM
mode is one engine in a child process (benchmarks.vllm_peer), started once; its start-up is
reported apart. At each batch size B and temperature T the settings run in rotation, the order
shifted by one each rotation: vLLM target-only, vLLM with the exported draft (`draft_model`,
K = 4), and minispec K = 0 and auto with its rounds on the bench's thread count (1 by default)
and on every core this process may use, each count with a decoder of its own (Inductor bakes
the thread count into its parallel loops); the prefill runs on every core in every setting
(minispec/machine.py). B = 1 decodes each prompt as its own request, one after another;
B = 16 one batch of the prompts repeated.

- vLLM's prefix caching is off: the prompts repeat, and with it on vLLM would skip most of its
  prefill, which minispec computes every time; this part compares decoding.
- While one engine runs, the other's processes are stopped (SIGSTOP): an idle engine polls.
- vLLM's requests carry no seed: timing needs none, and vLLM's CPU worker fails on a seeded
  request at T = 1 with prefix caching off ("CPU Generator does not use offset").
- Exact vLLM modes: at T = 0 both (their token ids equal minispec K = 0's in `make
  vllm-check`); at T > 0 target-only alone, because vLLM's speculative sampling on the CPU fails
  that check. The draft mode is timed at T > 0 all the same, its samples scored beside
  target-only's under minispec's target.

tok/s counts generated tokens over wall seconds, prefill included, as a user waits. CPU seconds
are minispec's process time and the vLLM engine's processes' (front end, engine core, worker):
tok/s per CPU-second measures work, which a shared machine distorts less than wall time.
minispec's rounds alone (prefill left out) are what speculation can shorten.
"""

from __future__ import annotations

import itertools
import statistics
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch

from benchmarks.decoding import decode, warm_up
from benchmarks.spread import format_spread, spread
from benchmarks.timing import machine
from benchmarks.vllm_check import sample_nll, sampling_verdict, strip_eos
from benchmarks.vllm_peer import ROOT, VLLMEngine
from minispec.decode import SpeculativeDecoder
from minispec.machine import torch_threads, usable_cores
from minispec.params import SpeculativeConfig
from model import tokenizer
from model.hf import export_folder

VLLM_K = 4
BATCH_SIZES = (16, 1)


@dataclass(frozen=True)
class Setting:
    """One column of the rotation: a vLLM engine's mode, or a minispec K on a thread count."""

    name: str
    vllm_mode: str | None = None
    spec: SpeculativeConfig | None = None
    threads: int = 0


TARGET_ONLY = Setting("vLLM target-only", vllm_mode="plain")
VLLM_SETTINGS = (TARGET_ONLY, Setting(f"vLLM draft_model K = {VLLM_K}", vllm_mode="draft_model"))


def threads_label(threads: int) -> str:
    return f"{threads} thread{'s' if threads > 1 else ''}"


def minispec_setting(k: int | str, threads: int) -> Setting:
    name = f"minispec {'auto' if k == 'auto' else f'K = {k}'}, {threads_label(threads)}"
    return Setting(name, spec=SpeculativeConfig(k), threads=threads)


def settings(thread_counts: list[int]) -> list[Setting]:
    """Every setting of the rotation: vLLM's two, then minispec K = 0 and auto per thread count."""
    return [*VLLM_SETTINGS, *(minispec_setting(k, t) for t in thread_counts for k in (0, "auto"))]


def rotation_order(all_settings: list[Setting], r: int) -> list[Setting]:
    """The settings in rotation r's order: shifted by r, so each setting runs first in turn."""
    shift = r % len(all_settings)
    return all_settings[shift:] + all_settings[:shift]


def exact_vllm_modes(temperature: float) -> set[str]:
    """The vLLM settings that count as exact (the module's docstring says why)."""
    return {s.name for s in VLLM_SETTINGS} if temperature == 0 else {TARGET_ONLY.name}


def minispec_run(decoder, prompts, setting, temperature, max_new, seed, batch) -> dict:
    """Like a vLLM job: token ids, wall and CPU seconds (prefill included), and the wall seconds
    of the rounds alone; the rounds on the setting's thread count."""
    rows = len(prompts) if batch else 1
    with torch_threads(setting.threads):
        cpu, wall = time.process_time(), time.perf_counter()
        stats, token_ids = decode(decoder, setting.spec, prompts, temperature, max_new, seed, rows)
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    return {"token_ids": token_ids, "wall_s": wall, "cpu_s": cpu, "rounds_s": stats.decode_time}


def tokens(run: dict) -> int:
    return sum(map(len, run["token_ids"]))


def rate(run: dict, clock: str) -> float:
    """Generated tokens per second of `clock`: wall_s, cpu_s or rounds_s."""
    return tokens(run) / run[clock]


def paired(a: list[dict], b: list[dict], clock: str) -> dict:
    """a's rate over b's, each rotation's pair on its own, then spread over the rotations."""
    return spread([rate(x, clock) / rate(y, clock) for x, y in zip(a, b)])


def summarize(runs: dict[str, list[dict]], exact: set[str], thread_counts: list[int]) -> dict:
    """Per setting, the spread over rotations of tok/s, tok/s per CPU-second, CPU-seconds per
    second and (minispec) rounds-only tok/s; per thread count, the ratios RATIOS names."""
    out: dict = {"settings": {}, "minispec": {}}
    for name, rs in runs.items():
        s = {
            "tokens_per_s": spread([rate(r, "wall_s") for r in rs]),
            "tokens_per_cpu_s": spread([rate(r, "cpu_s") for r in rs]),
            "cpu_s_per_s": spread([r["cpu_s"] / r["wall_s"] for r in rs]),
        }
        if "rounds_s" in rs[0]:
            s["rounds_tokens_per_s"] = spread([rate(r, "rounds_s") for r in rs])
        else:
            s["exact"] = name in exact
        out["settings"][name] = s
    out["best_exact_vllm"] = best = max(
        (s.name for s in VLLM_SETTINGS if s.name in exact),
        key=lambda n: out["settings"][n]["tokens_per_s"]["median"],
    )
    for t in thread_counts:
        auto = runs[minispec_setting("auto", t).name]
        k0 = runs[minispec_setting(0, t).name]
        out["minispec"][t] = {
            "auto_over_best_vllm": paired(auto, runs[best], "wall_s"),
            "auto_over_best_vllm_per_cpu_s": paired(auto, runs[best], "cpu_s"),
            "auto_over_k0": paired(auto, k0, "wall_s"),
            "auto_over_k0_rounds": paired(auto, k0, "rounds_s"),
        }
    return out


def sample_scores(decoder, prompts, runs: dict[str, list[dict]]) -> dict:
    """At T > 0: each vLLM mode's samples (every rotation's) scored under minispec's target,
    in nats/token, and whether they score like target-only's (sampling_verdict)."""
    nll = {}
    for s in VLLM_SETTINGS:
        rs = runs[s.name]
        samples = [strip_eos(x, decoder.eos_token_id) for r in rs for x in r["token_ids"]]
        nll[s.name] = sample_nll(decoder.target, prompts * len(rs), samples)
    reference = nll[TARGET_ONLY.name]
    verdicts = {TARGET_ONLY.name: {"mean_nll": statistics.fmean(reference), "agrees": True}}
    for name, values in nll.items():
        if name != TARGET_ONLY.name:
            verdicts[name] = sampling_verdict(values, reference)
            verdicts[name]["mean_nll"] = statistics.fmean(values)
    return verdicts


def measure(decoders, engines, texts, args, on_row) -> list[dict]:
    """Every (B, T) point: the settings in rotation, then the point's summary, handed to
    on_row(rows) as soon as it is known. decoders: one per minispec thread count."""
    thread_counts = list(decoders)
    all_settings = settings(thread_counts)
    max_new, rows = args.max_new_tokens, []
    for temperature, b in itertools.product(args.temperatures, BATCH_SIZES):
        batch = b > 1
        chosen = [texts[i % len(texts)] for i in range(b)] if batch else texts
        prompts = [tokenizer.encode(t) for t in chosen]
        warm = prompts if batch else prompts[:1]
        for t, decoder in decoders.items():
            with torch_threads(t):
                specs = [s.spec for s in all_settings if s.threads == t]
                warm_up(decoder, warm, specs, temperature)
        runs: dict[str, list[dict]] = {s.name: [] for s in all_settings}
        for r in range(args.rotations):
            seed = 1000 * r
            for s in rotation_order(all_settings, r):
                if s.vllm_mode:
                    engine = engines[s.vllm_mode]
                    engine.resume()
                    result = engine.generate(prompts, temperature, max_new, None, batch)
                    engine.pause()
                else:
                    decoder = decoders[s.threads]
                    result = minispec_run(decoder, prompts, s, temperature, max_new, seed, batch)
                runs[s.name].append(result)
        exact = exact_vllm_modes(temperature)
        row = {"B": b, "temperature": temperature, "prompts": len(prompts)}
        row.update(summarize(runs, exact, thread_counts), rotations=args.rotations)
        reference = decoders[thread_counts[0]]
        row["sample_scores"] = sample_scores(reference, prompts, runs) if temperature else {}
        print("\n".join(format_point(row)), flush=True)
        rows.append(row)
        on_row(rows)
    return rows


SETTINGS_HEADER = (
    "| B | T | setting | tok/s, whole calls | tok/s per CPU-second | CPU-seconds per second | "
    "tok/s, rounds only |\n|---|---|---|---|---|---|---|"
)
# The ratios table's columns, as summarize names them.
RATIOS = (
    "auto_over_best_vllm",
    "auto_over_best_vllm_per_cpu_s",
    "auto_over_k0",
    "auto_over_k0_rounds",
)
RATIOS_HEADER = (
    "| B | T | minispec's rounds on | vLLM's best exact mode | auto / it, per second | "
    "auto / it, per CPU-second | auto / own K = 0, whole calls | auto / own K = 0, rounds only |"
    "\n|---|---|---|---|---|---|---|---|"
)


def table_line(row: dict, cells: list[str]) -> str:
    """A line of a table of points: the point's B and T, then `cells`."""
    return "| " + " | ".join([str(row["B"]), f"{row['temperature']:g}", *cells]) + " |"


def format_settings(row: dict) -> list[str]:
    """The point's rows of the settings table: median (min-max) of each measure."""
    lines = []
    for name, s in row["settings"].items():
        mark = " (not exact)" if s.get("exact") is False else ""
        rounds = s.get("rounds_tokens_per_s")
        cells = [name + mark, format_spread(s["tokens_per_s"], "", 0)]
        cells += [format_spread(s["tokens_per_cpu_s"], "", 0), format_spread(s["cpu_s_per_s"], "")]
        lines.append(table_line(row, [*cells, format_spread(rounds, "", 0) if rounds else "-"]))
    return lines


def format_ratios(row: dict) -> list[str]:
    """The point's rows of the ratios table, one per minispec thread count."""
    best = row["best_exact_vllm"].removeprefix("vLLM ")
    return [
        table_line(row, [threads_label(int(t)), best, *(format_spread(r[key]) for key in RATIOS)])
        for t, r in row["minispec"].items()
    ]


def format_point(row: dict) -> list[str]:
    """What the console shows once a point is measured: both its tables."""
    return [SETTINGS_HEADER, *format_settings(row), "", RATIOS_HEADER, *format_ratios(row), ""]


# Issue 32's speed goals: (goal, B, T, the ratio it reads, the least value that meets it).
GOALS = (
    ("auto ≥ 1.3x vLLM's best exact mode, tok/s", 1, 0.0, "auto_over_best_vllm", 1.3),
    ("auto ≥ vLLM's best exact mode per CPU-second", 16, None, "auto_over_best_vllm_per_cpu_s", 1),
    ("auto ≥ 0.9x vLLM's best exact mode per second", 16, None, "auto_over_best_vllm", 0.9),
    ("auto ≥ 1.5x its own K = 0, whole calls", 16, 0.0, "auto_over_k0", 1.5),
    ("auto ≥ 1.5x its own K = 0, rounds only", 16, 0.0, "auto_over_k0_rounds", 1.5),
    ("auto ≥ 1.2x its own K = 0, whole calls", 16, 1.0, "auto_over_k0", 1.2),
    ("auto ≥ 1.2x its own K = 0, rounds only", 16, 1.0, "auto_over_k0_rounds", 1.2),
)


def verdict(s: dict, least: float) -> str:
    """Whether a ratio's rotations meet a goal: all of them, the median only, or not."""
    if s["min"] >= least:
        return "yes (every rotation)"
    if s["median"] >= least:
        return "yes (median; not every rotation)"
    return "no"


def goal_lines(rows: list[dict]) -> list[str]:
    """The goals table: a line per goal, measured point and minispec thread count (a goal with
    no T of its own is read at every T measured); unmeasured points are left out."""
    lines = [
        "| goal | B | T | minispec's rounds on | measured | met? |",
        "|---|---|---|---|---|---|",
    ]
    for goal, b, temperature, key, least in GOALS:
        for row in rows:
            if row["B"] != b or temperature not in (None, row["temperature"]):
                continue
            for t, ratios in row["minispec"].items():
                s = ratios[key]
                cells = [goal, str(b), f"{row['temperature']:g}", threads_label(int(t))]
                cells += [format_spread(s), verdict(s, least)]
                lines.append("| " + " | ".join(cells) + " |")
    return lines


def render(report: dict, command: str) -> str:
    """results/vllm/bench.md."""
    m, rows = report["machine"], report["rows"]
    counts = " and ".join(threads_label(t) for t in report["thread_counts"])
    lines = [
        "# vLLM beside minispec: speed\n",
        f"`{command}`\n",
        f"Machine: {m['cpu']}, {m['cores']} cores shared with other work (the load average at the "
        f"start was {m.get('load_average_at_start', '?')}), torch {m['torch']}. minispec: rounds "
        f"compiled {report['compile_mode']}, run on {counts} (a decoder compiled for each), the "
        f"prefill on all {report['usable_cores']} usable cores in every setting. vLLM "
        f"{report['vllm']['version']} ({report['vllm']['device']}), float32, max_model_len 512, "
        "VLLM_CPU_KVCACHE_SPACE=1, prefix caching off, requests unseeded (timing needs no seed; "
        "vLLM's CPU worker fails on seeded requests at T = 1). "
        f"{report['prompts']} held-out prompts of 300 bytes, "
        f"{report['max_new_tokens']} new tokens each; B = 16 repeats them. {rows[0]['rotations']} "
        "rotations, the order shifted each rotation. Each cell: median [an interval covering the "
        "median with at least 95 %, from 6 rotations on] (min-max) over the rotations; ratios "
        "are paired within a rotation first. Whole calls count the prefill, as vLLM is timed; "
        "rounds only (minispec) leave it out, in wall time (no CPU clock is kept for the rounds "
        "alone).\n",
        "Exact modes: at T = 0 both vLLM modes (`make vllm-check` finds their tokens equal to "
        "minispec K = 0's); at T > 0 vLLM target-only alone (its speculative sampling fails "
        "`make vllm-check` on the CPU, results/vllm/check.md): the draft mode is timed and marked "
        "not exact, and 'best exact mode' picks among exact modes only.\n",
        SETTINGS_HEADER,
        *(line for r in rows for line in format_settings(r)),
        "",
        RATIOS_HEADER,
        *(line for r in rows for line in format_ratios(r)),
        "",
        "Issue 32's speed goals, measured here (met: the median reaches the goal; 'every "
        "rotation': the smallest ratio does too):\n",
        *goal_lines(rows),
        "",
        "Engine start-up, to the first request (s): "
        + ", ".join(f"{n} {v:.0f}" for n, v in report["vllm"]["startup_s"].items())
        + ".",
    ]
    scores = []
    for r in rows:
        each = [
            f"{n} {v['mean_nll']:.2f}" + ("" if v["agrees"] else " (differs from target-only)")
            for n, v in r["sample_scores"].items()
        ]
        if each:
            scores.append(f"B = {r['B']}, T = {r['temperature']:g}: " + ", ".join(each))
    if scores:
        lines.append(
            "\nT > 0 samples under minispec's target (nats/token, mean over every rotation's "
            f"samples): {'; '.join(scores)}."
        )
    return "\n".join(lines) + "\n"


def decoders_per_thread_count(decoder: SpeculativeDecoder, threads: int) -> dict:
    """The bench's decoder on its thread count and, on a CPU with more usable cores, a second
    decoder on the same models for all of them, whose rounds compile on that count."""
    decoders = {threads: decoder}
    cores = usable_cores()
    if decoder.device.type == "cpu" and cores != threads:
        decoders[cores] = SpeculativeDecoder(
            decoder.target,
            decoder.draft,
            compile=decoder.compile,
            eos_token_id=decoder.eos_token_id,
        )
    return decoders


def vllm_section(decoder, texts, args, path: Path) -> dict | str:
    """Part 7: start both engines, measure every point, write `path`; or, without the vLLM
    environment, one line saying why not."""
    python = ROOT / args.vllm_python  # an absolute path stays as it is
    if not python.exists():
        note = f"vLLM rows skipped: {args.vllm_python} not found (make vllm-check builds it)"
        print(f"  {note}", flush=True)
        return note
    decoders = decoders_per_thread_count(decoder, args.threads)
    report: dict = {
        "machine": machine(torch.device(args.device), args.threads),
        "compile_mode": args.compile_mode,
        "thread_counts": list(decoders),
        "usable_cores": usable_cores(),
        "prompts": len(texts),
        "max_new_tokens": args.max_new_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="minispec-export-") as tmp:
        folder = Path(tmp)
        for role, model in (("target", decoder.target), ("draft", decoder.draft)):
            export_folder(model, folder / role, torch.float32)
        engines = {}
        try:
            for s in VLLM_SETTINGS:
                engine = VLLMEngine(str(python), folder, s.vllm_mode, VLLM_K, prefix_caching=False)
                engines[s.vllm_mode] = engine
                engine.pause()
                print(f"  vLLM {s.vllm_mode}: engine ready in {engine.startup_s:.0f} s", flush=True)
            info = engines["plain"].info
            startup = {m: e.startup_s for m, e in engines.items()}
            report["vllm"] = dict(version=info["vllm"], device=info["device"], startup_s=startup)
            path.parent.mkdir(parents=True, exist_ok=True)

            def write(rows: list[dict]) -> None:  # after each point: a stopped run keeps its rows
                path.write_text(render({**report, "rows": rows}, args.command))

            report["rows"] = measure(decoders, engines, texts, args, write)
            print("\n".join(goal_lines(report["rows"])), flush=True)
        finally:
            for engine in engines.values():
                engine.close()
    return report
