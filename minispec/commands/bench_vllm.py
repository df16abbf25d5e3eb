"""`make bench` part 7: vLLM beside minispec, on the same pair, prompts and machine.

vLLM runs in its own virtual environment (`make vllm-check` builds .venv-vllm), so each vLLM
mode is one engine in a child process (minispec.commands.vllm_peer), started once; its start-up
is reported apart. At each batch size B and temperature T, four settings run in rotation, the
order shifted by one each rotation: vLLM target-only, vLLM with the exported draft
(`draft_model`, K = 4), minispec K = 0 and minispec K = "auto". B = 1 decodes each held-out
prompt as its own request, one after another; B = 16 decodes one batch of 16 prompts (the
held-out prompts repeated). vLLM's prefix caching is off: the prompts repeat (within a batch and
from rotation to rotation), and with it on vLLM would skip most of its prefill, which minispec
computes every time; this part compares decoding. While one engine runs, the other vLLM
engine's processes are stopped (SIGSTOP): an idle engine polls.

Each run reports tok/s (generated tokens over wall seconds, prefill included, as a user waits)
and CPU seconds per generated token: minispec's process time, and for vLLM the CPU time of the
engine's processes (vLLM's front end, engine core and worker). tok/s per CPU-second divides the
two: a measure of work that a shared or busy machine does not distort as much as wall time.

At T > 0 a vLLM mode counts as exact only when its samples score like vLLM target-only's under
minispec's target (minispec.commands.vllm_check.sampling_verdict, on the first rotation's
samples); ratios against "vLLM's best exact mode" use only those.
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

import torch

from minispec.commands import bench_proposers
from minispec.commands.bench_sampler import machine
from minispec.commands.spread import format_spread, spread
from minispec.commands.vllm_check import sample_nll, sampling_verdict, strip_eos
from minispec.commands.vllm_peer import ROOT, VLLMEngine
from minispec.params import SamplingParams, SpeculativeConfig
from model import tokenizer
from model.hf import export_folder

VLLM_K = 4
SETTINGS = ("vLLM target-only", f"vLLM draft_model K = {VLLM_K}", "minispec K = 0", "minispec auto")
VLLM_MODES = {SETTINGS[0]: "plain", SETTINGS[1]: "draft_model"}
SPECS = {SETTINGS[2]: SpeculativeConfig(0), SETTINGS[3]: SpeculativeConfig("auto")}
BATCH_SIZES = (16, 1)
DEFAULT_PYTHON = ".venv-vllm/bin/python"


def minispec_run(decoder, prompts, spec, temperature, max_new, seed, batch) -> dict:
    """Like a vLLM job: token ids, wall and CPU seconds (prefill included)."""
    groups = [prompts] if batch else [[p] for p in prompts]
    token_ids, decode_s = [], 0.0
    cpu, wall = time.process_time(), time.perf_counter()
    for g, group in enumerate(groups):
        params = [
            SamplingParams(temperature=temperature, seed=seed + g + i, max_new_tokens=max_new)
            for i in range(len(group))
        ]
        out = decoder.generate(group, params, spec)
        token_ids += out.token_ids
        decode_s += out.stats.decode_time
    return {
        "token_ids": token_ids,
        "wall_s": time.perf_counter() - wall,
        "cpu_s": time.process_time() - cpu,
        "decode_s": decode_s,
    }


def rotation_order(r: int) -> list[str]:
    """The settings in rotation r's order: shifted by r, so each setting runs first in turn."""
    shift = r % len(SETTINGS)
    return list(SETTINGS[shift:] + SETTINGS[:shift])


def summarize(runs: dict[str, list[dict]], exact: set[str]) -> dict:
    """Per setting, tok/s and tok/s per CPU-second over the rotations (median, min, max), and
    the ratios the goals name, each paired within a rotation."""
    out: dict = {"settings": {}}
    for name, rs in runs.items():
        tokens = [sum(map(len, r["token_ids"])) for r in rs]
        out["settings"][name] = {
            "tokens_per_s": spread([t / r["wall_s"] for t, r in zip(tokens, rs)]),
            "tokens_per_cpu_s": spread([t / r["cpu_s"] for t, r in zip(tokens, rs)]),
            "cpu_s_per_s": spread([r["cpu_s"] / r["wall_s"] for r in rs]),
            "exact": name in exact,
        }
    stats = out["settings"]
    best = max(
        (n for n in VLLM_MODES if n in exact), key=lambda n: stats[n]["tokens_per_s"]["median"]
    )
    out["best_exact_vllm"] = best
    auto, k0 = runs["minispec auto"], runs["minispec K = 0"]

    def paired(a: list[dict], b: list[dict], per_cpu: bool) -> dict:
        def rate(r: dict) -> float:
            return sum(map(len, r["token_ids"])) / (r["cpu_s"] if per_cpu else r["wall_s"])

        return spread([rate(x) / rate(y) for x, y in zip(a, b)])

    out["auto_over_best_vllm"] = paired(auto, runs[best], per_cpu=False)
    out["auto_over_best_vllm_per_cpu_s"] = paired(auto, runs[best], per_cpu=True)
    out["auto_over_k0"] = paired(auto, k0, per_cpu=False)
    return out


def exact_modes(decoder, prompts, runs: dict[str, list[dict]], temperature: float) -> tuple:
    """The vLLM modes that count as exact, and the T > 0 verdicts: at T = 0 every mode (the
    token ids are checked by `make vllm-check`); at T > 0 those whose samples, every rotation's,
    score like vLLM target-only's under the target (sampling_verdict)."""
    if temperature == 0:
        return set(VLLM_MODES), {}
    nll = {}
    for name in VLLM_MODES:
        samples = [strip_eos(s, decoder.eos_token_id) for r in runs[name] for s in r["token_ids"]]
        nll[name] = sample_nll(decoder.target, prompts * len(runs[name]), samples)
    reference = nll[SETTINGS[0]]
    verdicts = {SETTINGS[0]: {"mean_nll": statistics.fmean(reference), "agrees": True}}
    for name in VLLM_MODES:
        if name != SETTINGS[0]:
            verdicts[name] = sampling_verdict(nll[name], reference)
            verdicts[name]["mean_nll"] = statistics.fmean(nll[name])
    return {n for n, v in verdicts.items() if v["agrees"]}, verdicts


def measure(decoder, engines, texts, temperatures, max_new, rotations, on_row) -> list[dict]:
    """Every (B, T) point: the four settings in rotation, then the point's summary, handed to
    on_row(rows) as soon as it is known."""
    rows = []
    for temperature in temperatures:
        for b in BATCH_SIZES:
            batch = b > 1
            chosen = [texts[i % len(texts)] for i in range(b)] if batch else texts
            prompts = [tokenizer.encode(t) for t in chosen]
            warm = prompts if batch else prompts[:1]
            bench_proposers.warm_up(decoder, warm, SPECS.values(), temperature)
            runs: dict[str, list[dict]] = {name: [] for name in SETTINGS}
            for r in range(rotations):
                for name in rotation_order(r):
                    seed = 1000 * r
                    if name in VLLM_MODES:
                        engine = engines[VLLM_MODES[name]]
                        engine.resume()
                        result = engine.generate(prompts, temperature, max_new, seed, batch)
                        engine.pause()
                    else:
                        spec = SPECS[name]
                        result = minispec_run(
                            decoder, prompts, spec, temperature, max_new, seed, batch
                        )
                    runs[name].append(result)
            exact, verdicts = exact_modes(decoder, prompts, runs, temperature)
            row = {"B": b, "temperature": temperature, "prompts": len(prompts)}
            row.update(summarize(runs, exact), sampling_verdicts=verdicts, rotations=rotations)
            row["minispec_decode_only_tokens_per_s"] = {
                name: spread([sum(map(len, r["token_ids"])) / r["decode_s"] for r in runs[name]])
                for name in SPECS
            }
            print(format_row(row), flush=True)
            rows.append(row)
            on_row(rows)
    return rows


def format_row(row: dict) -> str:
    """One markdown row: each setting's tok/s and tok/s per CPU-second, then the ratios."""
    cells = [str(row["B"]), f"{row['temperature']:g}"]
    for name in SETTINGS:
        s = row["settings"][name]
        mark = "" if s["exact"] or name not in VLLM_MODES else " (not exact)"
        cells.append(
            f"{s['tokens_per_s']['median']:.0f} / {s['tokens_per_cpu_s']['median']:.0f}{mark}"
        )
    cells += [
        row["best_exact_vllm"].removeprefix("vLLM "),
        format_spread(row["auto_over_best_vllm"]),
        format_spread(row["auto_over_best_vllm_per_cpu_s"]),
        format_spread(row["auto_over_k0"]),
    ]
    return "| " + " | ".join(cells) + " |"


HEADER = (
    "| B | T | "
    + " | ".join(SETTINGS)
    + " | vLLM's best exact mode | auto / it, per second | auto / it, per CPU-second | "
    "auto / minispec K = 0 |\n|" + "---|" * (len(SETTINGS) + 6)
)


def render(report: dict, command: str) -> str:
    """results/vllm/bench.md."""
    m, rows = report["machine"], report["rows"]
    lines = [
        "# vLLM beside minispec: speed\n",
        f"`{command}`\n",
        f"Machine: {m['cpu']}, {m['cores']} cores shared with other work (the load average at the "
        f"start was {m.get('load_average_at_start', '?')}), torch {m['torch']}, {m['threads']} "
        f"thread(s) for minispec, rounds compiled {report['compile_mode']}; vLLM "
        f"{report['vllm']['version']} ({report['vllm']['device']}), float32, max_model_len 512, "
        "VLLM_CPU_KVCACHE_SPACE=1, prefix caching off. "
        f"{report['prompts']} held-out prompts of 300 bytes, "
        f"{report['max_new_tokens']} new tokens each; B = 16 repeats them. {rows[0]['rotations']} "
        "rotations, the order shifted each rotation. Each cell: median tok/s (wall clock, "
        "prefill included) / median tok/s per CPU-second. Ratios: median (min-max) of the "
        "per-rotation ratios.\n",
        HEADER,
        *(format_row(r) for r in rows),
        "",
        "CPU-seconds per second (median): "
        + "; ".join(
            f"B = {r['B']}, T = {r['temperature']:g}: "
            + ", ".join(f"{n} {s['cpu_s_per_s']['median']:.2f}" for n, s in r["settings"].items())
            for r in rows
        )
        + ".\n",
        "minispec's own decode-only tok/s (prefill left out, as `make bench`'s other parts report "
        "it): "
        + "; ".join(
            f"B = {r['B']}, T = {r['temperature']:g}: "
            + ", ".join(
                f"{n} {format_spread(s, '')}"
                for n, s in r["minispec_decode_only_tokens_per_s"].items()
            )
            for r in rows
        )
        + ".\n",
        "Engine start-up, to the first request (s): "
        + ", ".join(f"{n} {v:.0f}" for n, v in report["vllm"]["startup_s"].items())
        + ".",
    ]
    sampled = [r for r in rows if r["sampling_verdicts"]]
    if sampled:
        lines.append(
            "\nT > 0 samples under minispec's target (nats/token, mean over every rotation's "
            "samples): "
            + "; ".join(
                f"B = {r['B']}, T = {r['temperature']:g}: "
                + ", ".join(
                    f"{n} {v['mean_nll']:.2f}"
                    + ("" if v["agrees"] else " (differs from target-only)")
                    for n, v in r["sampling_verdicts"].items()
                )
                for r in sampled
            )
            + "."
        )
    return "\n".join(lines) + "\n"


def vllm_section(decoder, texts, args, path: Path) -> dict | str:
    """Part 7: start both engines, measure every point, write `path`; or, without the vLLM
    environment, one line saying why not."""
    python = Path(args.vllm_python)
    python = python if python.is_absolute() else ROOT / python
    if not python.exists():
        note = f"vLLM rows skipped: {args.vllm_python} not found (make vllm-check builds it)"
        print(f"  {note}", flush=True)
        return note
    temperatures = [float(t) for t in args.temperatures.split(",")]
    report: dict = {
        "machine": machine(torch.device(args.device), torch.get_num_threads()),
        "compile_mode": args.compile_mode,
        "prompts": len(texts),
        "max_new_tokens": args.max_new_tokens,
    }
    with tempfile.TemporaryDirectory(prefix="minispec-export-") as folder:
        for role, model in (("target", decoder.target), ("draft", decoder.draft)):
            export_folder(model, Path(folder) / role, torch.float32)
        engines = {}
        try:
            for mode in VLLM_MODES.values():
                engines[mode] = VLLMEngine(
                    str(python), Path(folder), mode, VLLM_K, prefix_caching=False
                )
                engines[mode].pause()
                print(f"  vLLM {mode}: engine ready in {engines[mode].startup_s:.0f} s", flush=True)
            info = engines["plain"].info
            report["vllm"] = {
                "version": info["vllm"],
                "device": info["device"],
                "startup_s": {m: e.startup_s for m, e in engines.items()},
            }
            print("  " + HEADER.replace("\n", "\n  "), flush=True)
            command = "make bench ARGS='" + " ".join(args.argv) + "'" if args.argv else "make bench"
            path.parent.mkdir(parents=True, exist_ok=True)

            def write(rows: list[dict]) -> None:  # after each point: a stopped run keeps its rows
                path.write_text(render({**report, "rows": rows}, command))

            report["rows"] = measure(
                decoder, engines, texts, temperatures, args.max_new_tokens, args.repeats, write
            )
        finally:
            for engine in engines.values():
                engine.close()
    return report
