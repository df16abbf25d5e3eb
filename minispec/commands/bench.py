"""`make bench`: measured speedup against Leviathan's theory, on the shipped pair, in one process.

1. End to end, B = 1: K x temperature -> tokens/s, speedup vs K = 0 (same process, same compile
   settings), alpha, acceptance length, tokens per target forward, c, Theorem 3.8's prediction,
   host syncs per round (counted by intercepting every tensor-to-Python read).
2. Batch: B in {1, 4, 16} at the best K, with and without speculation.
3. Sampler: minispec.commands.bench_sampler (compiled vs eager vs plain vs the read floor).
4. Start-up: `minispec decode` to its first token, cold (empty Inductor cache) and warm.

Every timed number is the median of >= 5 warm repeats; compile time is measured apart.
Writes results/bench.json, results/bench.md and results/speedup.png (or a text chart).
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

from minispec.api import load_decoder
from minispec.commands.args import (THREADS_HELP, OneLineParser, choice_list, comma_list,
                                     device_name, integer, real, thread_count)
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.stats import DecodeStats, predicted_speedup
from model import tokenizer

PROMPTS = [
    "import os\n\n\ndef ",
    "class Parser:\n    def __init__(self, text):\n        self.",
    "def read_config(path):\n    \"\"\"Read a config file.\"\"\"\n    with open(path) as f:\n",
    "    for i in range(len(items)):\n        if items[i] is None:\n",
    "# Copyright (C) 2001 Python Software Foundation\n\"\"\"Utilities for ",
]


@contextlib.contextmanager
def count_host_reads():
    """Count every read of tensor values into Python (.item, .tolist, bool(), int(), float())."""
    counter = {"reads": 0}
    names = ("item", "tolist", "__bool__", "__int__", "__float__", "__index__")
    originals = {n: getattr(torch.Tensor, n) for n in names}

    def counted(name):
        def wrapper(self, *args, **kwargs):
            counter["reads"] += 1
            return originals[name](self, *args, **kwargs)
        return wrapper

    for n in names:
        setattr(torch.Tensor, n, counted(n))
    try:
        yield counter
    finally:
        for n, f in originals.items():
            setattr(torch.Tensor, n, f)


def run_once(decoder: SpeculativeDecoder, prompts: list[str], k: int, temperature: float, max_new: int,
             seed: int, draft_method: str = "greedy") -> DecodeStats:
    """Decode every prompt as its own B = 1 request and sum the stats."""
    total = DecodeStats(k, position_accepted=[0] * k)
    for i, text in enumerate(prompts):
        params = [SamplingParams(temperature=temperature, seed=seed + i, max_new_tokens=max_new)]
        s = decoder.generate([tokenizer.encode(text)], params, SpeculativeConfig(k, draft_method)).stats
        for name in ("rounds", "drafted", "accepted", "emitted", "alpha_sum", "alpha_count", "batch_rounds",
                     "draft_calls", "host_syncs", "time_draft", "time_verify", "time_sampler", "time_other"):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.position_accepted = [a + b for a, b in zip(total.position_accepted, s.position_accepted)]
    return total


def measure(decoder, prompts, k, temperature, max_new, repeats, draft_method) -> dict:
    start = time.perf_counter()
    run_once(decoder, prompts[:1], k, temperature, 2, 0, draft_method)  # compile (and warm) this K's graphs
    compile_s = time.perf_counter() - start
    runs = [run_once(decoder, prompts, k, temperature, max_new, 1000 * r, draft_method) for r in range(repeats)]
    with count_host_reads() as reads:
        counted = run_once(decoder, prompts[:1], k, temperature, max_new, 7, draft_method)
    # One read per generate() happens after its last round: the final statistics.
    syncs_per_round = (reads["reads"] - 1) / counted.batch_rounds
    median = sorted(runs, key=lambda s: s.tokens_per_second)[len(runs) // 2]
    return {"K": k, "temperature": temperature, "draft_sample_method": draft_method,
            "tokens_per_s": statistics.median(r.tokens_per_second for r in runs),
            "alpha": median.alpha, "mean_acceptance_length": median.mean_acceptance_length,
            "tokens_per_target_forward": median.tokens_per_target_forward,
            "draft_acceptance_rate": median.draft_acceptance_rate,
            "draft_step_s": median.draft_step_time, "target_forward_s": median.target_forward_time,
            "time_split": median.to_dict()["time_s"], "host_syncs_per_round": syncs_per_round,
            "compile_s": compile_s, "repeats": repeats}


def end_to_end(decoder, ks, temperatures, max_new, repeats, draft_method) -> list[dict]:
    rows = []
    for temperature in temperatures:
        base = None
        for k in ks:
            row = measure(decoder, PROMPTS, k, temperature, max_new, repeats, draft_method)
            if k == 0:
                base = row
            else:
                row["c"] = row["draft_step_s"] / base["target_forward_s"]
                row["predicted_speedup"] = predicted_speedup(row["alpha"], k, row["c"])
            row["speedup"] = row["tokens_per_s"] / base["tokens_per_s"]
            if k:
                row["measured_over_predicted"] = row["speedup"] / row["predicted_speedup"]
            print(format_row(row), flush=True)
            rows.append(row)
    return rows


def batch_rows(decoder, best: dict[float, int], batch_sizes, max_new, repeats) -> list[dict]:
    rows = []
    for temperature, k in best.items():
        for b in batch_sizes:
            prompts = [tokenizer.encode(PROMPTS[i % len(PROMPTS)]) for i in range(b)]
            result = {"B": b, "temperature": temperature, "K": k}
            for kk in (0, k):
                params = [SamplingParams(temperature=temperature, seed=i, max_new_tokens=max_new) for i in range(b)]
                decoder.generate(prompts, [SamplingParams(temperature, seed=0, max_new_tokens=2)] * b, SpeculativeConfig(kk))
                speeds = [decoder.generate(prompts, params, SpeculativeConfig(kk)).stats.tokens_per_second
                          for _ in range(repeats)]
                result["tokens_per_s_K0" if kk == 0 else "tokens_per_s_spec"] = statistics.median(speeds)
            result["speedup"] = result["tokens_per_s_spec"] / result["tokens_per_s_K0"]
            print(f"  B={b:>2} T={temperature} K={k}: {result['tokens_per_s_K0']:.1f} -> "
                  f"{result['tokens_per_s_spec']:.1f} tok/s ({result['speedup']:.2f}x)", flush=True)
            rows.append(result)
    return rows


def startup(device: str, max_new: int = 8) -> dict:
    """Wall time from launching `python -m minispec decode` to its first token, cold then warm."""
    out = {}
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "TORCHINDUCTOR_CACHE_DIR": cache}
        for label in ("cold", "warm"):
            start = time.perf_counter()
            proc = subprocess.run([sys.executable, "-m", "minispec", "decode", "--json", "--temperature", "0",
                                   "--max-new-tokens", str(max_new), "--device", device], env=env, capture_output=True, text=True)
            wall = time.perf_counter() - start
            if proc.returncode:
                raise RuntimeError(f"decode failed: {proc.stderr.strip().splitlines()[-1:]}")
            report = json.loads(proc.stdout)
            out[label] = {"first_token_s": report["time_to_first_token_s"], "process_s": wall}
            print(f"  {label}: first token after {report['time_to_first_token_s']:.1f} s "
                  f"(process {wall:.1f} s)", flush=True)
    return out


def format_row(r: dict) -> str:
    pred = f"{r['predicted_speedup']:.2f}x" if r["K"] else "-"
    ratio = f"{r['measured_over_predicted']:.2f}" if r["K"] else "-"
    alpha = f"{r['alpha']:.3f}" if r["alpha"] is not None else "-"
    c = f"{r['c']:.3f}" if r.get("c") is not None else "-"
    return (f"| {r['K']} | {r['temperature']:g} | {r['tokens_per_s']:.1f} | {r['speedup']:.2f}x | {alpha} | "
            f"{r['mean_acceptance_length']:.2f} | {r['tokens_per_target_forward']:.2f} | {c} | {pred} | {ratio} | "
            f"{r['host_syncs_per_round']:.2f} | {r['compile_s']:.0f} |")


HEADER = ("| K | T | tok/s | speedup | alpha | accept len | tok/target fwd | c | predicted | measured/pred | "
          "syncs/round | compile s |\n|---|---|---|---|---|---|---|---|---|---|---|---|")


def chart(rows: list[dict], path: Path) -> str:
    """speedup against K, measured and predicted: a PNG with matplotlib, else a text chart."""
    lines = []
    for t in sorted({r["temperature"] for r in rows}):
        lines.append(f"T = {t:g}   (# measured, . predicted)")
        for r in (r for r in rows if r["temperature"] == t and r["K"]):
            lines.append(f"  K={r['K']:<2} {'#' * round(r['speedup'] * 20):<60} {r['speedup']:.2f}x")
            lines.append(f"       {'.' * round(r['predicted_speedup'] * 20):<60} {r['predicted_speedup']:.2f}x")
    try:
        import matplotlib
        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "\n".join(lines)
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in sorted({r["temperature"] for r in rows}):
        sel = [r for r in rows if r["temperature"] == t]
        ax.plot([r["K"] for r in sel], [r["speedup"] for r in sel], "o-", label=f"measured, T={t:g}")
        ax.plot([r["K"] for r in sel if r["K"]], [r["predicted_speedup"] for r in sel if r["K"]], "x--",
                label=f"Theorem 3.8, T={t:g}")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("K (num_speculative_tokens)")
    ax.set_ylabel("speedup vs K = 0")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return "\n".join(lines)


def machine(device: str) -> dict:
    cpu = platform.processor()
    with contextlib.suppress(OSError):
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else None
    return {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version(),
            "threads": torch.get_num_threads(), "device": gpu or "cpu"}


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(prog="minispec bench", description=__doc__,
                           formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--ks", type=comma_list(integer(0)), default="0,1,2,3,4,6,8")
    parser.add_argument("--temperatures", type=comma_list(real(0)), default="0,1")
    parser.add_argument("--batch-sizes", type=comma_list(integer(1)), default="1,4,16")
    parser.add_argument("--max-new-tokens", type=integer(1), default=128)
    parser.add_argument("--repeats", type=integer(1), default=5)
    parser.add_argument("--out", default="results")
    parser.add_argument("--device", type=device_name, default="cpu",
                        help="cpu or cuda (compiled with reduce-overhead there)")
    parser.add_argument("--threads", type=thread_count, default=1, help=THREADS_HELP)
    parser.add_argument("--draft-sample-method", default="greedy", help="greedy (one-hot q) or probabilistic")
    parser.add_argument("--skip", type=choice_list(("batch", "sampler", "startup")), default="",
                        help="comma list of parts to skip: batch,sampler,startup")
    args = parser.parse_args(argv)
    skip = set(filter(None, args.skip.split(",")))
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    torch.set_num_threads(args.threads)
    decoder = load_decoder(device=args.device)
    report: dict = {"machine": machine(args.device), "draft_sample_method": args.draft_sample_method,
                    "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
                    "prompts": PROMPTS}
    print("1. end to end, B = 1\n" + HEADER, flush=True)
    report["end_to_end"] = rows = end_to_end(decoder, [int(k) for k in args.ks.split(",")],
                                             [float(t) for t in args.temperatures.split(",")],
                                             args.max_new_tokens, args.repeats, args.draft_sample_method)
    best = {t: max((r for r in rows if r["temperature"] == t), key=lambda r: r["speedup"])["K"]
            for t in sorted({r["temperature"] for r in rows})}
    if "batch" not in skip:
        print("2. batch", flush=True)
        report["batch"] = batch_rows(decoder, best, [int(b) for b in args.batch_sizes.split(",")],
                                     args.max_new_tokens, max(3, args.repeats // 2 + 1))
    if "sampler" not in skip:
        print("3. sampler", flush=True)
        from minispec.commands.bench_sampler import main as bench_sampler_main
        bench_sampler_main(["--out", str(out), "--device", args.device, "--threads", "2,1"])
        report["sampler"] = json.loads((out / "sampler.json").read_text())
    if "startup" not in skip:
        print("4. start-up", flush=True)
        report["startup"] = startup(args.device)
    text_chart = chart(rows, out / "speedup.png")
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    (out / "bench.md").write_text(render_markdown(report, text_chart))
    print(text_chart)
    print(f"wrote {out / 'bench.md'} and {out / 'bench.json'}")
    return 0


def render_markdown(report: dict, text_chart: str) -> str:
    m = report["machine"]
    lines = [f"# minispec benchmark\n", f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
             f"{m['device']}. {report['draft_sample_method']} drafter, B = 1, {report['max_new_tokens']} new tokens per prompt, {len(report['prompts'])} "
             f"prompts, median of {report['repeats']} warm repeats.\n", "## End to end\n", HEADER]
    lines += [format_row(r) for r in report["end_to_end"]]
    if "batch" in report:
        lines += ["\n## Batch\n", "| B | T | K | tok/s K=0 | tok/s spec | speedup |", "|---|---|---|---|---|---|"]
        lines += [f"| {r['B']} | {r['temperature']:g} | {r['K']} | {r['tokens_per_s_K0']:.1f} | "
                  f"{r['tokens_per_s_spec']:.1f} | {r['speedup']:.2f}x |" for r in report["batch"]]
    if "startup" in report:
        s = report["startup"]
        lines += ["\n## Start-up (decode to first token)\n", "| cache | first token s | process s |", "|---|---|---|"]
        lines += [f"| {k} | {v['first_token_s']:.1f} | {v['process_s']:.1f} |" for k, v in s.items()]
    lines += ["\n## Speedup against K\n", "```", text_chart, "```"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    raise SystemExit(main())
