"""`make bench`: measured speedup against Leviathan's theory, on the shipped pair, in one process.

1. Steps: the target's and the draft's 1-token step and (K+1)-token verify step (each model
   forward compiled alone, B = 1), beside their memory floor: weight bytes plus live KV bytes
   over the read bandwidth measured in this run (a big tensor's sum()).
2. End to end, B = 1, on prompts cut from the corpus's held-out files (never trained on): each
   speculative row runs interleaved with its K = 0 baseline, A B A B in one process, and reports
   the median of the per-pair speedups with their min and max, alpha, acceptance length, c,
   Theorem 3.8's prediction, and the guard checks and host reads per round (host reads counted
   by intercepting every tensor-to-Python read).
3. Batch: at each B in {1, 4, 16, 64} and T, K = 0, K in {2, 4, 8} and K = "auto" in rotation;
   each setting's speedup over the K = 0 run of its rotation, and auto against the best fixed K
   (paired by rotation; the best K picked from every rotation, and without the one compared).
   3b. Proposers (draft model, n-gram, suffix) on plain and "edit" prompts, each row
   interleaved with K = 0 (bench_proposers.py).
4. Sampler: benchmarks.bench_sampler (compiled vs eager vs plain vs the read floor).
5. Start-up (bench_startup.py): `minispec decode` processes on a fresh cache and a warm one,
   default and a first `--temperature 0`: first token, done, full speed.
6. Peer: transformers on the same pair (exported), on the same prompts and threads, target-only
   and assisted generation, interleaved with minispec, at T = 0 and T = 1 (results/peer.md);
   skipped with a note when transformers is not installed.
7. vLLM: vLLM target-only and with the draft beside minispec K = 0 and auto (rounds on the
   bench's thread count and on every core), B = 1 and 16, T = 0 and 1, in rotation: tok/s and
   tok/s per CPU-second of whole calls, minispec's rounds alone, and issue 32's goals as
   "goal / measured / met?" lines (bench_vllm.py, results/vllm/bench.md); skipped with a note
   when vLLM's environment (`make vllm-check` builds it) is absent.

The flags are in flags.py (`python -m benchmarks --help`). Compile time is measured apart.
`--quick` is a smoke run: K = 4, T = 0, two pairs, 32 tokens. Writes results/bench.json,
results/bench.md, results/peer.md and results/speedup.png (or a text chart). bench.md and
bench.json hold the parts run; a run of only parts that write a report of their own (sampler,
peer, vLLM) leaves them as they are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import time
from pathlib import Path

import torch

from benchmarks import bench_proposers, bench_vllm
from benchmarks.bench_sampler import machine
from benchmarks.flags import COMPILE_MODES, OWN_REPORT, PARTS, sampler_parser
from benchmarks.spread import format_spread, spread
from minispec.api import load_decoder
from minispec.commands.prompts import held_out_prompts
from minispec.compilation import compile_round
from minispec.decode import SpeculativeDecoder
from minispec.params import SpeculativeConfig
from minispec.stats import DecodeStats, predicted_speedup
from model import tokenizer
from model.gpt import GPT


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


def read_bandwidth(megabytes: int = 256, repeats: int = 7) -> float:
    """Bytes per second one sum() reads from memory, median over repeats."""
    x = torch.ones(megabytes * 2**18)  # float32
    x.sum()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        x.sum()
        times.append(time.perf_counter() - start)
    return x.numel() * 4 / statistics.median(times)


def model_bytes(model: GPT, live_tokens: int) -> int:
    """Weight bytes plus the KV bytes of `live_tokens` positions (B = 1): one step's reads."""
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    c = model.config
    return weights + 2 * c.n_layer * live_tokens * c.d_model * model.embed.weight.element_size()


@torch.no_grad()
def step_times(
    model: GPT, widths: list[int], repeats: int, compile: bool | str, position: int = 320
) -> dict[int, dict]:
    """One forward of [1, T] tokens at each width T, compiled as the decoder compiles its
    rounds, timed interleaved (T1 T2 T1 T2), median/min/max of `repeats` each."""
    model.setup_cache(1)
    device = model.embed.weight.device
    step = compile_round(model, "step", compile, device, torch.nn.ModuleList([model]), "bench step")
    inputs = {
        t: (torch.zeros(1, t, dtype=torch.long), position + torch.arange(t)[None]) for t in widths
    }
    for t in widths:
        step(*inputs[t])  # compile
    times: dict[int, list[float]] = {t: [] for t in widths}
    for _ in range(repeats):
        for t in widths:
            start = time.perf_counter()
            step(*inputs[t])
            times[t].append(time.perf_counter() - start)
    return {t: spread(v) for t, v in times.items()}


def steps(decoder: SpeculativeDecoder, ks: list[int], repeats: int, live_tokens: int) -> dict:
    """Part 1: the two models' step times against their memory floors, compiled as the
    decoder's rounds are (aot: frozen weights, prepacked)."""
    bandwidth = read_bandwidth()
    out = {"read_bandwidth_GBps": bandwidth / 1e9, "live_tokens": live_tokens}
    widths = sorted({1, *(k + 1 for k in ks if k)})
    for name, model in (("target", decoder.target), ("draft", decoder.draft)):
        floor = model_bytes(model, live_tokens) / bandwidth
        times = step_times(model, widths if name == "target" else [1], repeats, decoder.compile)
        out[name] = {
            "dtype": str(model.embed.weight.dtype).removeprefix("torch."),
            "floor_s": floor,
            "steps": {str(t): v for t, v in times.items()},
        }
        for t, v in times.items():
            print(
                f"  {name} {t}-token step {1e3 * v['median']:.2f} ms (min {1e3 * v['min']:.2f},"
                f" max {1e3 * v['max']:.2f}); floor {1e3 * floor:.2f} ms, "
                f"{v['median'] / floor:.1f}x the floor",
                flush=True,
            )
    return out


def run_once(
    decoder: SpeculativeDecoder,
    prompts: list[str],
    k: int,
    temperature: float,
    max_new: int,
    seed: int,
    draft_method: str = "auto",
) -> DecodeStats:
    """Decode every prompt as its own B = 1 request and sum the stats."""
    ids = [tokenizer.encode(text) for text in prompts]
    spec = SpeculativeConfig(k, draft_method)
    return bench_proposers.decode_all(decoder, ids, spec, temperature, max_new, seed, batch=False)


def host_reads_per_round(
    decoder, prompt: str, k: int, temperature: float, max_new: int, draft_method: str
) -> float:
    """Every tensor-to-Python read of one generate(), over its rounds; the per-call reads
    outside the rounds (the seed draw for an unseeded request, the final statistics) excluded."""
    with count_host_reads() as reads:
        stats = run_once(decoder, [prompt], k, temperature, max_new, 7, draft_method)
    return (reads["reads"] - 1) / stats.batch_rounds


def pair_row(decoder, prompts, k, temperature, max_new, pairs, draft_method, c) -> dict:
    """Part 2, one row: K against K = 0, interleaved A B A B; the speedup of each pair."""
    start = time.perf_counter()
    for kk in (k, 0):  # compile (and warm) both rows' graphs
        run_once(decoder, prompts[:1], kk, temperature, 2, 0, draft_method)
    compile_s = time.perf_counter() - start
    runs = []
    for r in range(pairs):
        spec = run_once(decoder, prompts, k, temperature, max_new, 1000 * r, draft_method)
        base = run_once(decoder, prompts, 0, temperature, max_new, 1000 * r, draft_method)
        runs.append((spec, base))
    ratios = [s.speedup_over(b) for s, b in runs]
    median = sorted(runs, key=lambda sb: sb[0].tokens_per_second)[len(runs) // 2][0]
    return {
        "K": k,
        "temperature": temperature,
        "draft_sample_method": draft_method,
        "speedup": spread(ratios),
        "tokens_per_s": statistics.median(s.tokens_per_second for s, _ in runs),
        "tokens_per_s_K0": statistics.median(b.tokens_per_second for _, b in runs),
        "alpha": median.alpha,
        "mean_acceptance_length": median.mean_acceptance_length,
        "tokens_per_target_forward": median.tokens_per_target_forward,
        "draft_acceptance_rate": median.draft_acceptance_rate,
        "c": c,
        "predicted_speedup": predicted_speedup(median.alpha, k, c)
        if median.alpha is not None
        else None,
        "guard_checks_per_round": median.per_round(median.compiled_calls),
        "host_reads_per_round": host_reads_per_round(
            decoder, prompts[0], k, temperature, max_new, draft_method
        ),
        "compile_s": compile_s,
        "pairs": pairs,
    }


def end_to_end(
    decoder, prompts, ks, temperatures, max_new, pairs, draft_method, c: float
) -> list[dict]:
    rows = []
    for temperature in temperatures:
        for k in (k for k in ks if k):
            row = pair_row(decoder, prompts, k, temperature, max_new, pairs, draft_method, c)
            print(format_row(row), flush=True)
            rows.append(row)
    return rows


def format_row(r: dict) -> str:
    sp = r["speedup"]
    pred = f"{r['predicted_speedup']:.2f}x" if r["predicted_speedup"] else "-"
    alpha = f"{r['alpha']:.3f}" if r["alpha"] is not None else "-"
    return (
        f"| {r['K']} | {r['temperature']:g} | {r['tokens_per_s']:.1f} | "
        f"{r['tokens_per_s_K0']:.1f} | {format_spread(sp)} | "
        f"{alpha} | {r['mean_acceptance_length']:.2f} | {r['c']:.3f} | {pred} | "
        f"{r['guard_checks_per_round']:.2f} | {r['host_reads_per_round']:.2f} | "
        f"{r['compile_s']:.0f} |"
    )


HEADER = (
    "| K | T | tok/s | tok/s K=0 | speedup [interval] (min-max) | alpha | accept len | c | "
    "predicted | guard checks/round | host reads/round | compile s |\n"
    "|---|---|---|---|---|---|---|---|---|---|---|---|"
)


def chart(rows: list[dict], path: Path) -> str:
    """speedup against K, measured and predicted: a PNG with matplotlib, else a text chart."""
    lines = []
    for t in sorted({r["temperature"] for r in rows}):
        lines.append(f"T = {t:g}   (# measured, . predicted)")
        for r in (r for r in rows if r["temperature"] == t):
            measured, predicted = r["speedup"]["median"], r["predicted_speedup"] or 0.0
            lines.append(f"  K={r['K']:<2} {'#' * round(measured * 20):<60} {measured:.2f}x")
            lines.append(f"       {'.' * round(predicted * 20):<60} {predicted:.2f}x")
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return "\n".join(lines)
    fig, ax = plt.subplots(figsize=(6, 4))
    for t in sorted({r["temperature"] for r in rows}):
        sel = [r for r in rows if r["temperature"] == t]
        ks = [r["K"] for r in sel]
        ax.errorbar(
            ks,
            [r["speedup"]["median"] for r in sel],
            fmt="o-",
            yerr=[
                [r["speedup"]["median"] - r["speedup"]["min"] for r in sel],
                [r["speedup"]["max"] - r["speedup"]["median"] for r in sel],
            ],
            label=f"measured (min-max), T={t:g}",
        )
        ax.plot(ks, [r["predicted_speedup"] for r in sel], "x--", label=f"Theorem 3.8, T={t:g}")
    ax.axhline(1.0, color="grey", lw=0.5)
    ax.set_xlabel("K (num_speculative_tokens)")
    ax.set_ylabel("speedup vs K = 0 (interleaved pairs)")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    return "\n".join(lines)


def run(args: argparse.Namespace) -> int:
    """Every part not in --skip (args: benchmarks.flags.parse_bench's)."""
    skip = set(filter(None, args.skip.split(",")))
    ks, temperatures = comma_ints(args.ks), [float(t) for t in args.temperatures.split(",")]
    out = Path(args.out)
    out.mkdir(exist_ok=True)
    torch.set_num_threads(args.threads)
    decoder = load_decoder(device=args.device, compile=COMPILE_MODES[args.compile_mode])
    prompts = held_out_prompts(args.prompts)
    report: dict = {
        "machine": machine(torch.device(args.device), torch.get_num_threads()),
        "compile_mode": args.compile_mode,
        "quick": args.quick,
        "draft_sample_method": args.draft_sample_method,
        "max_new_tokens": args.max_new_tokens,
        "pairs": args.repeats,
        "batch_ks": comma_ints(args.batch_ks),
        "prompts": prompts,
    }
    c = None
    if "steps" not in skip:
        print("1. steps, B = 1", flush=True)
        live_tokens = 300 + args.max_new_tokens // 2  # a prompt, and half the new tokens
        report["steps"] = s = steps(decoder, ks, max(2 * args.repeats, 5), live_tokens)
        c = s["draft"]["steps"]["1"]["median"] / s["target"]["steps"]["1"]["median"]
    if "end_to_end" not in skip:
        print("2. end to end, B = 1, each row paired with K = 0\n" + HEADER, flush=True)
        report["end_to_end"] = end_to_end(
            decoder,
            prompts,
            ks,
            temperatures,
            args.max_new_tokens,
            args.repeats,
            args.draft_sample_method,
            c or 0.0,
        )
    if "batch" not in skip:
        batch_sizes, ks_batch = comma_ints(args.batch_sizes), comma_ints(args.batch_ks)
        print("3. batch\n" + bench_proposers.batch_header(ks_batch), flush=True)
        names = [p.strip() for p in args.batch_proposers.split(",") if p.strip()]
        batch_proposers = tuple(
            p for p in names if p != "feature_head" or decoder.feature_head() is not None
        )
        # Each row its own text: at T = 0 copies of one prompt decode alike, so a batch of
        # copies has fewer independent rows than it seems.
        report["batch"] = bench_proposers.batch_table(
            decoder,
            held_out_prompts(max(len(prompts), *batch_sizes)),
            temperatures,
            batch_sizes,
            ks_batch,
            args.max_new_tokens,
            args.repeats,
            batch_proposers,
        )
    if "proposers" not in skip:
        run_proposers(report, decoder, prompts, temperatures, args)
    if "sampler" not in skip:
        print("4. sampler", flush=True)
        from benchmarks.bench_sampler import run as run_sampler

        flags = ["--out", str(out), "--device", args.device, "--threads", "2,1"]
        run_sampler(sampler_parser().parse_args(flags))
        report["sampler"] = json.loads((out / "sampler.json").read_text())
    if "startup" not in skip:
        print("5. start-up", flush=True)
        from benchmarks import bench_startup

        report["startup"] = bench_startup.run(args.device)
    if "peer" not in skip:
        print("6. peer (transformers)", flush=True)
        report["peer"] = peer_section(decoder, prompts, best_k(report), args, out / "peer.md")
    if "vllm" not in skip:
        print("7. vLLM", flush=True)
        report["vllm"] = bench_vllm.vllm_section(decoder, prompts, args, out / "vllm" / "bench.md")
    if not set(PARTS) - skip - set(OWN_REPORT):
        print(f"{out / 'bench.md'} left as it is: the parts run wrote reports of their own")
        return 0
    text_chart = chart(report["end_to_end"], out / "speedup.png") if "end_to_end" in report else ""
    (out / "bench.json").write_text(json.dumps(report, indent=2))
    (out / "bench.md").write_text(render_markdown(report, text_chart))
    print(text_chart)
    print(f"wrote {out / 'bench.md'} and {out / 'bench.json'}")
    under = [r for r in report.get("batch", []) if not r["auto_kept_bound"]]
    for r in under:
        held_out = r["auto_over_best_fixed_held_out"]["median"]
        print(
            f"auto under {bench_proposers.AUTO_BOUND}x the best fixed K: {r['proposer']}, "
            f"B = {r['B']}, T = {r['temperature']:g}: {held_out:.2f}"
        )
    return 1 if under else 0


def run_proposers(
    report: dict,
    decoder: SpeculativeDecoder,
    prompts: list[str],
    temperatures: list[float],
    args: argparse.Namespace,
) -> None:
    """Part 3b: the proposer table (benchmarks/bench_proposers.py), with the suffix index
    over the training corpus (built on first use)."""
    from minispec.commands.build_index import cached_index

    decoder.suffix_index = decoder.suffix_index or cached_index()
    print("3b. proposers, B = 1, K = auto\n" + bench_proposers.HEADER, flush=True)
    report["proposers"] = bench_proposers.proposer_table(
        decoder,
        prompts,
        temperatures,
        args.max_new_tokens,
        args.repeats,
        tuple(p.strip() for p in args.proposers.split(",") if p.strip()),
    )


def best_k(report: dict) -> dict[float, int]:
    """The end-to-end part's fastest K at each temperature."""
    rows = report["end_to_end"]
    return {
        t: max((r for r in rows if r["temperature"] == t), key=lambda r: r["speedup"]["median"])[
            "K"
        ]
        for t in sorted({r["temperature"] for r in rows})
    }


def comma_ints(text: str) -> list[int]:
    return [int(v) for v in text.split(",")]


PEER_TEMPERATURES = (0.0, 1.0)


def peer_section(
    decoder: SpeculativeDecoder,
    prompts: list[str],
    best: dict[float, int],
    args: argparse.Namespace,
    path: Path,
) -> list[dict] | str:
    """Part 6: bench_peer's transformers rows at T = 0 and T = 1, each mode interleaved with
    the minispec mode it is compared to (at T > 0 minispec's probabilistic drafter, since
    transformers samples its drafts), at the best K measured for that T (else 4). Writes `path`
    and returns the rows, or the note saying why there are none."""
    try:
        import transformers  # noqa: F401 - the optional `peer` extra

        from benchmarks.bench_peer import format_peer_row, peer_rows
    except ImportError:
        note = "peer rows skipped: transformers is not installed (pip install 'minispec[peer]')"
    else:
        note = (
            None
            if args.device == "cpu"
            else f"peer rows skipped: run on {args.device}, "
            "and transformers runs the exported pair on the CPU only here"
        )
    if note:
        print(f"  {note}", flush=True)
        path.write_text(f"# Peer comparison\n\n{note}.\n")
        return note
    rows = []
    for temperature in PEER_TEMPERATURES:
        k = best.get(temperature, 4)
        method = "probabilistic" if temperature > 0 else "greedy"

        def minispec_run(kk: int, temperature=temperature, method=method) -> tuple[int, float]:
            start = time.perf_counter()  # wall clock, prefill included, as transformers' is
            stats = run_once(
                decoder,
                prompts,
                kk,
                temperature,
                args.max_new_tokens,
                0,
                method if kk else "greedy",
            )  # K = 0: one graph, whatever the T
            return stats.emitted, time.perf_counter() - start

        for row in peer_rows(
            prompts,
            args.max_new_tokens,
            k,
            args.threads,
            temperature,
            decoder.target,
            decoder.draft,
            minispec_run,
            args.repeats,
        ):
            row["minispec_draft_sample_method"] = method if row["num_speculative_tokens"] else "-"
            print(f"  {format_peer_row(row)}", flush=True)
            rows.append(row)
    path.write_text(render_peer_markdown(rows, len(prompts), args.compile_mode))
    return rows


def render_peer_markdown(rows: list[dict], prompts: int, compile_mode: str) -> str:
    first = rows[0]
    lines = [
        "# Peer comparison: transformers on the exported pair\n",
        f"{first['engine']}, eager, float32; minispec compiled {compile_mode}. B = 1, "
        f"{prompts} held-out "
        f"prompts, {first['max_new_tokens']} new tokens, {first['threads']} thread(s); each "
        f"figure is the median of {first['repeats']} passes, minispec and transformers "
        "interleaved mode by mode. Wall clock, prefill included.\n",
        "| T | transformers mode | tok/s | minispec (K, drafter) | tok/s | minispec / "
        "transformers |",
        "|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['temperature']:g} | {r['mode']} | {r['tokens_per_s']:.1f} | "
            f"K={r['num_speculative_tokens']}, {r['minispec_draft_sample_method']} | "
            f"{r['minispec_tokens_per_s']:.1f} | "
            f"{r['ratio_minispec_over_transformers']:.2f} |"
        )
    return "\n".join(lines) + "\n"


def render_markdown(report: dict, text_chart: str) -> str:
    m = report["machine"]
    lines = [
        "# minispec benchmark\n",
        f"Machine: {m['cpu']}, {m['cores']} cores, torch {m['torch']}, "
        f"{m.get('gpu', m['device'])}, {m['threads']} thread(s), rounds compiled "
        f"{report.get('compile_mode', 'jit')}. {report['draft_sample_method']} drafter, B = 1, "
        f"{report['max_new_tokens']} new tokens for each of {len(report['prompts'])} "
        f"held-out prompts; each row is {report['pairs']} interleaved pairs against "
        "K = 0: the median speedup, [its 95 % interval: order statistics, none under 6 pairs] "
        "(min-max).\n",
    ]
    if "steps" in report:
        s = report["steps"]
        lines += [
            "## Steps (B = 1, median of interleaved repeats)\n",
            f"Read bandwidth {s['read_bandwidth_GBps']:.1f} GB/s (sum() of 256 MB); floor = "
            f"(weights + KV of {s['live_tokens']} positions) / bandwidth.\n",
            "| model | dtype | tokens | ms (min-max) | floor ms | x floor |",
            "|---|---|---|---|---|---|",
        ]
        for name in ("target", "draft"):
            floor = s[name]["floor_s"]
            lines += [
                f"| {name} | {s[name]['dtype']} | {t} | {1e3 * v['median']:.2f} "
                f"({1e3 * v['min']:.2f}-{1e3 * v['max']:.2f}) | {1e3 * floor:.2f} | "
                f"{v['median'] / floor:.1f}x |"
                for t, v in s[name]["steps"].items()
            ]
    if "end_to_end" in report:
        lines += ["\n## End to end\n", HEADER]
        lines += [format_row(r) for r in report["end_to_end"]]
    if "startup" in report:
        from benchmarks.bench_startup import render as render_startup

        lines += render_startup(report["startup"])
    lines += bench_proposers.render(report, report["batch_ks"])
    if text_chart:
        lines += ["\n## Speedup against K\n", "```", text_chart, "```"]
    return "\n".join(lines) + "\n"
