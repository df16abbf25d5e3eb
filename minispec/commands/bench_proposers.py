"""The bench's proposer and adaptive-K parts: where drafts come from, and K chosen per round.

1. Proposers, B = 1: draft_model, ngram, suffix and hybrid, at each temperature, on two prompt
   sets from the corpus's held-out files: "plain" (continue a cut of a file) and "edit" (a
   held-out function, then its first line again: continuing means repeating code the prompt
   already holds, as an edit does). Each row runs interleaved with K = 0 (A B A B), K = "auto".
2. Adaptive K per batch size: K = "auto" with the draft model against K = 0, interleaved.

Every row reports the median of the per-pair speedups (min-max), alpha, the mean acceptance
length, the K chosen (a histogram) and the host lookup's share of the round time.
"""

from __future__ import annotations

import statistics
from collections import Counter

from minispec.commands.corpus import load_corpus
from minispec.decode import SpeculativeDecoder
from minispec.params import SamplingParams, SpeculativeConfig
from minispec.stats import DecodeStats
from model import tokenizer
from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID

PROPOSERS = ("draft_model", "ngram", "suffix", "hybrid")


def edit_prompts(count: int, max_length: int = 400) -> list[str]:
    """Held-out functions, each followed by a blank line and its own first line again: the
    model is asked to write the function once more. Functions of 3+ lines that fit max_length."""
    ids = load_corpus().held_out.tolist()
    text = bytes(t for t in ids if t not in (BOS_TOKEN_ID, EOS_TOKEN_ID)).decode("utf-8", "replace")
    prompts, at = [], 0
    while len(prompts) < count:
        at = text.find("\ndef ", at + 1)
        if at < 0:
            break
        end = min(
            (e for e in (text.find("\ndef ", at + 1), text.find("\nclass ", at + 1)) if e > 0),
            default=len(text),
        )
        function = text[at + 1 : end].rstrip()
        if function.count("\n") >= 2 and len(function) <= max_length:
            prompts.append(function + "\n\n" + function.split("\n")[0] + "\n")
    return prompts


def decode_all(
    decoder: SpeculativeDecoder,
    prompts: list[list[int]],
    spec: SpeculativeConfig,
    temperature: float,
    max_new: int,
    seed: int,
    batch: bool,
) -> DecodeStats:
    """One batch of all prompts, or (batch False) each prompt as its own B = 1 request, with
    the stats summed."""
    groups = [prompts] if batch else [[p] for p in prompts]
    total = DecodeStats(spec.num_speculative_tokens)
    for g, group in enumerate(groups):
        params = [
            SamplingParams(
                temperature=temperature, seed=seed + g * len(group) + i, max_new_tokens=max_new
            )
            for i in range(len(group))
        ]
        s = decoder.generate(group, params, spec).stats
        for name in (
            "rounds",
            "accepted",
            "emitted",
            "alpha_sum",
            "alpha_count",
            "batch_rounds",
            "time_round",
            "time_emit",
            "time_lookup",
        ):
            setattr(total, name, getattr(total, name) + getattr(s, name))
        total.k_histogram.update(s.k_histogram)
    return total


def paired_row(
    decoder: SpeculativeDecoder,
    prompts: list[list[int]],
    spec: SpeculativeConfig,
    temperature: float,
    max_new: int,
    pairs: int,
    batch: bool,
) -> dict:
    """spec against K = 0, interleaved: the median speedup of the pairs, and spec's stats."""
    baseline = SpeculativeConfig(0)
    for s in (spec, baseline):  # compile every graph either side can use
        params = [
            SamplingParams(temperature=temperature, seed=0, max_new_tokens=max_new) for _ in prompts
        ]
        decoder.generate(prompts, params, s, warm_up=True)
    runs = [
        (
            decode_all(decoder, prompts, spec, temperature, max_new, 1000 * r, batch),
            decode_all(decoder, prompts, baseline, temperature, max_new, 1000 * r, batch),
        )
        for r in range(pairs)
    ]
    ratios = [s.tokens_per_second / b.tokens_per_second for s, b in runs]
    stats = [s for s, _ in runs]
    return {
        "proposer": spec.proposer,
        "temperature": temperature,
        "speedup": {"median": statistics.median(ratios), "min": min(ratios), "max": max(ratios)},
        "tokens_per_s": statistics.median(s.tokens_per_second for s in stats),
        "alpha": statistics.median(s.alpha or 0.0 for s in stats),
        "mean_acceptance_length": statistics.median(s.mean_acceptance_length for s in stats),
        "k_histogram": dict(sorted(sum((s.k_histogram for s in stats), Counter()).items())),
        "lookup_share": sum(s.time_lookup for s in stats) / sum(s.time_round for s in stats),
    }


def proposer_table(
    decoder: SpeculativeDecoder,
    plain: list[str],
    temperatures: list[float],
    max_new: int,
    pairs: int,
) -> list[dict]:
    """Part 1: every proposer x temperature x prompt set, B = 1, K = auto."""
    sets = {"plain": plain, "edit": edit_prompts(len(plain))}
    rows = []
    for name, texts in sets.items():
        prompts = [tokenizer.encode(t) for t in texts]
        for temperature in temperatures:
            for proposer in PROPOSERS:
                row = paired_row(
                    decoder,
                    prompts,
                    SpeculativeConfig(proposer=proposer),
                    temperature,
                    max_new,
                    pairs,
                    batch=False,
                )
                row["prompt_set"] = name
                print(format_row(row), flush=True)
                rows.append(row)
    return rows


def adaptive_rows(
    decoder: SpeculativeDecoder,
    texts: list[str],
    temperatures: list[float],
    batch_sizes: list[int],
    max_new: int,
    pairs: int,
) -> list[dict]:
    """Part 2: K = auto with the draft model against K = 0, one batch of B prompts."""
    rows = []
    for b in batch_sizes:
        prompts = [tokenizer.encode(texts[i % len(texts)]) for i in range(b)]
        for temperature in temperatures:
            row = paired_row(
                decoder, prompts, SpeculativeConfig(), temperature, max_new, pairs, batch=True
            )
            row.update(prompt_set="plain", B=b)
            print(format_row(row), flush=True)
            rows.append(row)
    return rows


HEADER = (
    "| set | B | T | proposer | speedup (min-max) | tok/s | alpha | accept len | K chosen | "
    "lookup share |\n|---|---|---|---|---|---|---|---|---|---|"
)


def format_row(r: dict) -> str:
    s = r["speedup"]
    ks = " ".join(f"{k}:{n}" for k, n in r["k_histogram"].items())
    return (
        f"| {r['prompt_set']} | {r.get('B', 1)} | {r['temperature']:g} | {r['proposer']} | "
        f"{s['median']:.2f}x ({s['min']:.2f}-{s['max']:.2f}) | {r['tokens_per_s']:.1f} | "
        f"{r['alpha']:.3f} | {r['mean_acceptance_length']:.2f} | {ks} | "
        f"{100 * r['lookup_share']:.1f} % |"
    )


def render(report: dict) -> list[str]:
    """The bench.md lines of both parts."""
    lines = ["\n## Proposers (B = 1, K = auto, each row interleaved with K = 0)\n", HEADER]
    lines += [format_row(r) for r in report["proposers"]]
    lines += ["\n## Adaptive K by batch size (draft model, K = auto vs K = 0)\n", HEADER]
    lines += [format_row(r) for r in report["adaptive"]]
    return lines
