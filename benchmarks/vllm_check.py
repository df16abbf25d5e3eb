"""`make vllm-check`: the exported pair in vLLM, checked against minispec on held-out prompts.

Runs with any Python that has vLLM (its CPU or CUDA build) and minispec's dependencies; each
vLLM mode runs in its own child process (benchmarks.vllm_peer), one engine at a time.

1. Exports the pair (`python -m minispec export`) to a temporary folder.
2. T = 0: the token ids of vLLM target-only, vLLM with the exported draft (`draft_model`,
   K drafts, drawn greedily as vLLM's default `draft_sample_method` does, and drawn
   `probabilistic`) and vLLM with prompt lookup (`ngram`, K drafts), each against minispec's
   K = 0 (eager, float32), prompt by prompt; minispec with K drafts too.
3. T = 1: every engine samples `--samples` continuations of each prompt and minispec's target
   scores them: the mean negative log-likelihood per sampled token, in nats. An exact sampler
   draws from the target's own distribution, so each mode's mean must agree with vLLM
   target-only sampling's within the noise (`sampling_verdict`).
4. Prints one table and writes it to --out, each sample's score beside it (.json).

Exit 0 when the tokenizers agree, every T = 0 run equals minispec's K = 0, and vLLM target-only
sampling agrees with minispec's: the export is then right at T = 0 and at T = 1. A vLLM
speculative mode whose T = 1 samples disagree with target-only's is marked in the table, and
fails the check (exit 1) only with --strict-sampling.
"""

from __future__ import annotations

import argparse
import json
import math
import shlex
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.vllm_peer import MODES, ROOT, VLLMEngine
from minispec.commands.args import OneLineParser, integer

# A T = 1 mean differs from the reference's when the difference exceeds this many standard
# errors: two-sided, a false alarm about once in 16,000 under the normal approximation.
Z_LIMIT = 4.0
SEED = 1000


def strip_eos(ids: list[int], eos: int) -> list[int]:
    """The tokens before the first EOS: engines differ in whether they return it."""
    return list(ids[: ids.index(eos)] if eos in ids else ids)


def compare_ids(runs: list[list[int]], reference: list[list[int]]) -> tuple[int, str | None]:
    """(rows equal to the reference, where the first unequal row first differs)."""
    equal, where = 0, None
    for row, (x, y) in enumerate(zip(runs, reference, strict=True)):
        if x == y:
            equal += 1
        elif where is None:
            at = next((i for i, (s, t) in enumerate(zip(x, y)) if s != t), min(len(x), len(y)))
            where = f"prompt {row}, token {at}"
    return equal, where


def mean_and_error(values: list[float]) -> tuple[float, float]:
    """The mean and its standard error."""
    return statistics.fmean(values), statistics.stdev(values) / math.sqrt(len(values))


def sampling_verdict(sample_means: list[float], reference_means: list[float]) -> dict:
    """Whether two engines' per-sample mean NLLs can come from one distribution: their means'
    difference in standard errors (Welch's z), flagged beyond Z_LIMIT."""
    m, se = mean_and_error(sample_means)
    r, se_r = mean_and_error(reference_means)
    spread = math.hypot(se, se_r)
    z = (m - r) / spread if spread else (0.0 if m == r else math.inf)
    return {"difference": m - r, "z": z, "agrees": abs(z) <= Z_LIMIT}


def sample_nll(target, prompts: list[list[int]], samples: list[list[int]]) -> list[float]:
    """Each sample's mean negative log-likelihood after its prompt (nats/token, the target at
    temperature 1); empty samples are left out."""
    import torch

    out = []
    with torch.no_grad():
        for prompt, sample in zip(prompts, samples, strict=True):
            if sample:
                tokens = torch.tensor([prompt + sample], device=target.embed.weight.device)
                logits = target(tokens)[0, len(prompt) - 1 : -1].double()
                logp = torch.log_softmax(logits, -1).gather(-1, tokens[0, len(prompt) :, None])
                out.append(-logp.mean().item())
    return out


def minispec_rows(decoder, prompts, sampled, max_new: int, k: int) -> dict[str, dict]:
    """minispec K = 0 and K = k, one call each: greedy on `prompts`, sampled on `sampled`
    (row i seeded SEED + i)."""
    from benchmarks.decoding import decode
    from minispec.params import SpeculativeConfig

    def token_ids(k: int, rows: list[list[int]], temperature: float) -> list[list[int]]:
        _, ids = decode(decoder, SpeculativeConfig(k), rows, temperature, max_new, SEED, len(rows))
        return ids

    return {
        f"K = {kk}": {"greedy": token_ids(kk, prompts, 0.0), "sampled": token_ids(kk, sampled, 1.0)}
        for kk in (0, k)
    }


def vllm_rows(args, folder: Path, prompts, sampled) -> tuple[dict, dict]:
    """Each vLLM mode of args.modes in its own engine, one at a time: greedy, then sampled."""
    rows, info = {}, {}
    for mode in args.modes:
        print(f"vLLM {mode}: starting the engine", flush=True)
        with VLLMEngine(args.vllm_python, folder, mode, args.k, args.dtype) as engine:
            info[mode] = {**engine.info, "startup_s": engine.startup_s}
            rows[mode] = {
                "greedy": engine.generate(prompts, 0.0, args.max_new_tokens)["token_ids"],
                "sampled": engine.generate(sampled, 1.0, args.max_new_tokens, SEED)["token_ids"],
            }
    return rows, info


def check_table(rows: dict[str, dict], reference_key: str) -> tuple[list[str], dict]:
    """The table's lines and the verdicts. rows: label -> {"equal", "where", "nll"}; the T = 1
    reference is rows[reference_key]."""
    lines = [
        "| engine, mode | T = 0: prompts equal to minispec K = 0 | T = 1: nats/token under the "
        "target (mean ± s.e., samples) | T = 1 against vLLM target-only |",
        "|---|---|---|---|",
    ]
    verdicts = {}
    reference = rows[reference_key]["nll"]
    for label, row in rows.items():
        equal = f"{row['equal']}/{row['total']}" if row["equal"] is not None else "reference"
        if row["where"]:
            equal += f" (first difference: {row['where']})"
        m, se = mean_and_error(row["nll"])
        if label == reference_key:
            against = "reference"
        else:
            v = verdicts[label] = sampling_verdict(row["nll"], reference)
            word = "agrees" if v["agrees"] else "**differs**"
            against = f"{word} ({v['difference']:+.2f} nats/token, z = {v['z']:.1f})"
        lines.append(f"| {label} | {equal} | {m:.3f} ± {se:.3f} ({len(row['nll'])}) | {against} |")
    return lines, verdicts


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = OneLineParser(
        prog="python -m benchmarks.vllm_check",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--prompts", type=integer(1, 50), default=9, help="held-out prompts, 300 B each")
    p.add_argument("--max-new-tokens", type=integer(1, 128), default=128)
    p.add_argument("--samples", type=integer(2), default=4, help="T = 1 samples of each prompt")
    p.add_argument("--k", type=integer(1, 16), default=4, help="num_speculative_tokens, all modes")
    p.add_argument("--dtype", default="float32", help="vLLM's and the export's dtype")
    p.add_argument("--vllm-python", default=sys.executable, help="a Python that has vLLM")
    p.add_argument("--out", default="results/vllm/check.md")
    p.add_argument(
        "--modes",
        type=lambda text: text.split(","),
        default=list(MODES),
        help="vLLM modes, a comma list of " + ",".join(MODES) + " (plain is always run)",
    )
    p.add_argument("--strict-sampling", action="store_true", help="exit 1 on any T = 1 mismatch")
    args = p.parse_args(argv)
    unknown = set(args.modes) - set(MODES)
    if unknown:
        p.error(f"--modes: unknown mode {sorted(unknown)[0]!r}; choose from {', '.join(MODES)}")
    args.modes = ["plain", *(m for m in MODES if m in args.modes and m != "plain")]
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    import torch

    from minispec.api import load_decoder
    from minispec.commands.prompts import held_out_prompts
    from model import tokenizer
    from model.tokenizer import EOS_TOKEN_ID

    device = "cuda" if torch.cuda.is_available() else "cpu"
    prompts = [tokenizer.encode(t) for t in held_out_prompts(args.prompts)]
    sampled = [p for _ in range(args.samples) for p in prompts]
    with tempfile.TemporaryDirectory(prefix="minispec-export-") as folder:
        export = [sys.executable, "-m", "minispec", "export", folder, "--dtype", args.dtype]
        subprocess.run(export, cwd=ROOT, check=True, stdout=subprocess.DEVNULL)
        vllm, info = vllm_rows(args, Path(folder), prompts, sampled)
    print("minispec: greedy and sampled, eager", flush=True)
    decoder = load_decoder(device=device, compile=False)
    ours = minispec_rows(decoder, prompts, sampled, args.max_new_tokens, args.k)

    def clean(rows: list[list[int]]) -> list[list[int]]:
        return [strip_eos(r, EOS_TOKEN_ID) for r in rows]

    reference = clean(ours["K = 0"]["greedy"])
    labelled = {f"minispec {name}": run for name, run in ours.items()}
    names = {
        "plain": "target-only",
        "draft_model": f"draft_model K = {args.k} (greedy drafts)",
        "draft_model_probabilistic": f"draft_model K = {args.k} (probabilistic drafts)",
        "ngram": f"ngram K = {args.k}",
    }
    labelled.update({f"vLLM {names[mode]}": run for mode, run in vllm.items()})
    rows = {}
    for label, run in labelled.items():
        equal, where = compare_ids(clean(run["greedy"]), reference)
        rows[label] = {
            "equal": None if label == "minispec K = 0" else equal,
            "where": where,
            "total": len(prompts),
            "nll": sample_nll(decoder.target, sampled, clean(run["sampled"])),
        }
    lines, verdicts = check_table(rows, "vLLM target-only")
    out = Path(args.out)
    samples_file = out.with_suffix(".json")
    out.parent.mkdir(parents=True, exist_ok=True)
    samples_file.write_text(json.dumps({label: row["nll"] for label, row in rows.items()}))
    probe = info["plain"]
    tokenizer_ok = probe["tokenizer_ids"] == tokenizer.encode(probe["probe"])
    greedy_ok = all(r["equal"] in (None, r["total"]) for r in rows.values())
    export_ok = all(verdicts[f"minispec {name}"]["agrees"] for name in ours)
    sampling_ok = all(v["agrees"] for label, v in verdicts.items() if label.startswith("vLLM"))
    vocab = decoder.target.config.vocab_size
    command = "make vllm-check" + (f" ARGS='{shlex.join(argv)}'" if argv else "")
    text = "\n".join(
        [
            "# The exported pair in vLLM, checked against minispec\n",
            f"`{command}` (`python -m benchmarks.vllm_check`). vLLM {probe['vllm']}, "
            f"torch {probe['torch']}, {probe['device']}, dtype {args.dtype}, max_model_len 512. "
            f"{len(prompts)} held-out prompts (300 bytes), {args.max_new_tokens} new tokens; "
            f"T = 1: {args.samples} seeded samples of each prompt per engine, scored by "
            f"minispec's target in float32 (uniform over the {vocab} ids would score "
            f"{math.log(vocab):.2f}). Agreement: |z| <= {Z_LIMIT:g} (Welch, per-sample means).\n",
            *lines,
            "",
            f"- Tokenizer: vLLM's encoding of a probe "
            f"{'equals' if tokenizer_ok else 'DIFFERS from'} minispec's.",
            f"- Each sample's score: `{samples_file.name}`. Worst sample (nats/token): "
            + ", ".join(f"{label} {max(row['nll']):.2f}" for label, row in rows.items())
            + ".",
            "- Engine start-up (s): "
            + ", ".join(f"{mode} {v['startup_s']:.0f}" for mode, v in info.items())
            + ".",
        ]
    )
    print(text)
    out.write_text(text + "\n")
    print(f"wrote {out}")
    ok = tokenizer_ok and greedy_ok and export_ok and (sampling_ok or not args.strict_sampling)
    note = "" if sampling_ok else " (a vLLM speculative mode's T = 1 samples differ; see table)"
    print(f"vllm-check: {'ok' if ok else 'FAILED'}{note}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
