"""Peer rows for `make bench`: transformers on the exported pair, on the same prompts, thread
count and machine, interleaved with minispec's own runs.

Three transformers modes, each with the minispec mode it is compared to:
- target-only `generate` (vs minispec K = 0);
- assisted generation with the exported draft, the same K every round and the confidence stop
  off (vs minispec K);
- assisted generation with the library's default assistant settings (vs minispec K).
Assisted generation reads the draft's settings from the assistant's own generation config, where
None is silently refilled: assistant_confidence_threshold with 0.4 (0.0 turns the stop off),
num_assistant_tokens with 20 (adapted by a heuristic schedule). Sampling's top_k None is
refilled with 50, so every sampled call passes top_k=0. At T = 1 transformers samples its
drafts: compare it with minispec's probabilistic drafter.

Needs the `peer` extra (transformers, tokenizers).
"""

from __future__ import annotations

import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import torch

from model import tokenizer
from model.gpt import GPT
from model.hf import export_folder

# minispec_run(k) decodes every prompt once with K = k and returns (tokens emitted, seconds).
MinispecRun = Callable[[int], tuple[int, float]]


def assistant_settings(draft: torch.nn.Module, k: int | None) -> None:
    """K drafts every round with no confidence stop, or (None) the library's defaults. Reset
    before each pass: the default heuristic schedule carries its K over from call to call."""
    config = draft.generation_config
    config.num_assistant_tokens = k
    config.num_assistant_tokens_schedule = "constant" if k else None
    config.assistant_confidence_threshold = 0.0 if k else None


def transformers_run(
    target: torch.nn.Module,
    draft: torch.nn.Module | None,
    k: int | None,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float,
) -> tuple[int, float]:
    """One pass over the prompts, B = 1 each as minispec's bench does: (tokens, seconds)."""
    if draft is not None:
        assistant_settings(draft, k)
    sampling = (
        {"do_sample": True, "temperature": temperature, "top_k": 0, "top_p": 1.0}
        if temperature > 0
        else {"do_sample": False}
    )
    tokens, start = 0, time.perf_counter()
    for prompt in prompts:
        ids = torch.tensor([prompt])
        out = target.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=max_new_tokens,
            assistant_model=draft,
            pad_token_id=tokenizer.EOS_TOKEN_ID,
            **sampling,
        )
        tokens += out.shape[1] - len(prompt)
    return tokens, time.perf_counter() - start


def peer_rows(
    prompts: list[str],
    max_new_tokens: int,
    num_speculative_tokens: int,
    threads: int,
    temperature: float,
    target: GPT,
    draft: GPT,
    minispec_run: MinispecRun | None = None,
    repeats: int = 5,
) -> list[dict]:
    """tok/s of each transformers mode (median of `repeats` passes over `prompts`), and, with
    `minispec_run`, of the minispec mode it is compared to, measured in the same rounds
    (minispec, then transformers, mode by mode), and their ratio minispec / transformers."""
    from transformers import AutoModelForCausalLM, __version__

    threads_before = torch.get_num_threads()
    torch.set_num_threads(threads)
    k = num_speculative_tokens
    ids = [tokenizer.encode(p) for p in prompts]
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for role, model in (("target", target), ("draft", draft)):
                export_folder(model, Path(tmp) / role, torch.float32)
            hf_target, hf_draft = (
                AutoModelForCausalLM.from_pretrained(Path(tmp) / role).eval()
                for role in ("target", "draft")
            )
        modes = [
            ("target-only", None, None, 0),
            (f"assisted K={k}, confidence stop off", hf_draft, k, k),
            ("assisted, library defaults", hf_draft, None, k),
        ]
        times: dict[str, list[tuple[int, float]]] = {m[0]: [] for m in modes}
        ours: dict[int, list[tuple[int, float]]] = {0: [], k: []}
        with torch.no_grad():
            for (
                name,
                hf_drafter,
                hf_k,
                our_k,
            ) in modes:  # warm-up: first calls allocate and dispatch
                transformers_run(hf_target, hf_drafter, hf_k, ids[:1], 2, temperature)
                if minispec_run:
                    minispec_run(our_k)
            for _ in range(repeats):
                for name, hf_drafter, hf_k, our_k in modes:
                    if minispec_run and (name == modes[0][0] or name == modes[1][0]):
                        ours[our_k].append(minispec_run(our_k))
                    times[name].append(
                        transformers_run(
                            hf_target, hf_drafter, hf_k, ids, max_new_tokens, temperature
                        )
                    )
    finally:
        torch.set_num_threads(threads_before)

    def rate(runs):
        return statistics.median(n / s for n, s in runs)

    rows = []
    for name, _, _, our_k in modes:
        row = {
            "engine": f"transformers {__version__}",
            "mode": name,
            "temperature": temperature,
            "num_speculative_tokens": our_k,
            "threads": threads,
            "prompts": len(prompts),
            "max_new_tokens": max_new_tokens,
            "repeats": repeats,
            "tokens_per_s": rate(times[name]),
        }
        if minispec_run:
            row["minispec_tokens_per_s"] = rate(ours[our_k])
            row["ratio_minispec_over_transformers"] = (
                row["minispec_tokens_per_s"] / row["tokens_per_s"]
            )
        rows.append(row)
    return rows


def format_peer_row(row: dict) -> str:
    text = (
        f"T={row['temperature']:g} {row['engine']}, {row['mode']}: {row['tokens_per_s']:.1f} tok/s"
    )
    if "ratio_minispec_over_transformers" in row:
        text += (
            f"; minispec K={row['num_speculative_tokens']} "
            f"{row['minispec_tokens_per_s']:.1f} tok/s, "
            f"ratio {row['ratio_minispec_over_transformers']:.2f}"
        )
    return text
