"""`minispec train-head`'s work, once train_head.py's checks have passed.

  states  the frozen target runs once over random windows of the corpus, in float32, a chunk at
          a time into the states file (head_states.py), which a killed run continues;
  train   the head learns from those cached states, never running the target: soft
          cross-entropy against the target's next-token distribution (the target's head over
          the next true state) plus a small smooth-L1 pull toward that state, at each of
          `--depth` drafting steps fed with the head's own guesses (model/head.py, `unrolled`).
The held-out score is the per-depth alpha, mean sum min(p, q) at temperature 1, on held-out
files. Every --eval-every steps the head, its optimizer, the step and the settings it is trained
with are saved to train.pt, which the next run continues only under the same settings; the head
is saved as float16 safetensors with its command and scores.
"""

from __future__ import annotations

import argparse
import io
import json
import math
import sys
import time
from pathlib import Path

import torch
import torch.nn.functional as F

from minispec.commands.corpus import load_corpus
from minispec.commands.head_states import CHUNK, LOG, TRAINING_STATE, States, difference
from model.checkpoint import load_checkpoint, save_head
from model.folders import list_written
from model.gpt import GPT
from model.head import FeatureHead, HeadConfig
from model.storage import atomic_write, naming

WARMUP = 30  # steps of linear learning-rate warm-up


def window_tokens(corpus: torch.Tensor, starts: torch.Tensor, window: int) -> torch.Tensor:
    """The windows of `corpus` that begin at `starts`, int64 [len(starts), window]."""
    return torch.stack([corpus[s : s + window].long() for s in starts.tolist()])


def cache_states(target: GPT, corpus: torch.Tensor, starts: torch.Tensor, states: States) -> None:
    """The target's final states over every window, written chunk by chunk from the first that
    the states file does not have."""
    if not states.digests:
        states.allocate()
    n, t, _ = states.shape
    first, begin = states.done, time.time()
    with torch.no_grad():
        for index in range(len(states.digests), -(-n // CHUNK)):
            tokens = window_tokens(corpus, starts[index * CHUNK : (index + 1) * CHUNK], t)
            states.write(index, target.hidden(tokens).half().numpy().tobytes())
            if index % 50 == 0 or states.done == n:
                rate = (states.done - first) * t / (time.time() - begin)
                print(f"states {states.done}/{n} windows, {rate:,.0f} tokens/s", flush=True)


def batch_states(states: States, rows: torch.Tensor) -> torch.Tensor:
    """The cached states of windows `rows`, float32 [len(rows), window, width]."""
    _, t, c = states.shape
    data = bytearray(states.rows(rows.tolist()))  # writable, as torch.frombuffer asks
    return torch.frombuffer(data, dtype=torch.float16).view(len(rows), t, c).float()


def head_loss(head, target, states, tokens, depth: int):  # noqa: ANN001
    """Mean over depths of soft cross-entropy to the target's next distribution, plus 0.1 x
    smooth L1 to the next true state; and the per-depth alpha at temperature 1."""
    inputs, following = states[:, :-1], states[:, 1:]  # f_t, f_{t+1}
    guesses = head.unrolled(target, inputs, tokens[:, 1:], depth)
    p = F.softmax(target.logits(following), -1)
    losses, alphas = [], []
    for guess in guesses:
        log_q = F.log_softmax(target.logits(guess), -1)
        # Positions a step at depth j cannot reach in decoding (t < j) still train: harmless.
        ce = -(p * log_q).sum(-1).mean()
        losses.append(ce + 0.1 * F.smooth_l1_loss(guess, following))
        alphas.append(torch.minimum(p, log_q.exp()).sum(-1).mean().detach())
    return sum(losses) / len(losses), torch.stack(alphas)


def training_settings(args: argparse.Namespace, states: States) -> dict:
    """Every setting that shapes train.pt: the states' and the head's and its schedule's."""
    head = ("width", "heads", "mlp_hidden", "depth", "lr", "steps", "batch_size")
    return {**states.settings, **{name: getattr(args, name) for name in head}}


def read_training_state(path: Path, settings: dict) -> dict | None:
    """What train.pt holds (None without one), read before any work. ValueError for a file that
    does not load, or that was trained with other settings."""
    if not path.exists():
        return None
    try:
        saved = torch.load(path, weights_only=True)
    except Exception as exc:  # a damaged file fails in torch.load in many ways, none a bug
        raise ValueError(f"{path} does not load ({first_line(exc)}): {afresh(path)}") from None
    if not isinstance(saved, dict) or not isinstance(saved.get("settings"), dict):
        raise ValueError(f"{path} records no settings (an earlier minispec's): {afresh(path)}")
    if problem := difference(saved["settings"], settings, f"{path} was trained with"):
        keep = "continue it with the value it was trained with"
        raise ValueError(f"{problem}: {keep}, use a fresh --state-dir, or {afresh(path)}")
    return saved


def restore(path: Path, saved: dict, head: FeatureHead, opt: torch.optim.Optimizer) -> int:
    """The step `saved` (read from `path`) reached, with the head and optimizer restored."""
    try:
        head.load_state_dict(saved["head"])
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
    except (KeyError, TypeError, ValueError, RuntimeError) as exc:
        problem = f"{path} is not a training state ({first_line(exc)})"
        raise ValueError(f"{problem}: {afresh(path)}") from None
    if not isinstance(step, int) or not 0 <= step <= saved["settings"]["steps"]:
        raise ValueError(f"{path} records step {step!r}, not one of --steps: {afresh(path)}")
    return step


def afresh(path: Path) -> str:
    return f"remove {path} to train afresh on the cached states"


def first_line(exc: BaseException) -> str:
    """An error's first sentence (torch's go on for several), or its type's name."""
    return str(exc).strip().split("\n")[0].split(". ")[0] or type(exc).__name__


def save_training_state(
    path: Path, head: FeatureHead, opt: torch.optim.Optimizer, step: int, settings: dict
) -> None:
    """train.pt, written whole or not at all: serialised in memory, then an atomic write, whose
    failure (a full disk) names the file and leaves no temporary behind."""
    buffer = io.BytesIO()
    state = {"head": head.state_dict(), "opt": opt.state_dict(), "step": step}
    torch.save({**state, "settings": settings}, buffer)
    atomic_write(path, buffer.getvalue())


def append_log(path: Path, record: dict) -> None:
    with naming(path), open(path, "a") as log:
        log.write(json.dumps(record) + "\n")


def learning_rate(args: argparse.Namespace, step: int) -> float:
    """Linear warm-up, then a cosine from --lr down to a tenth of it at --steps."""
    lr = args.lr * min(1, (step + 1) / WARMUP)
    return lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))


def new_head(args: argparse.Namespace, target: GPT) -> FeatureHead:
    """A head of the flags' shape for `target`, initialised from --seed."""
    torch.manual_seed(args.seed)
    config = HeadConfig(
        target_width=target.config.d_model,
        d_model=args.width,
        n_head=args.heads,
        mlp_hidden=args.mlp_hidden,
        max_seq_len=target.config.max_seq_len,
        norm_eps=target.config.norm_eps,
    )
    return FeatureHead(config, target.config.vocab_size)


def held_out(held: torch.Tensor, target: GPT, window: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Up to 16 windows of the held-out files, and the target's states over them."""
    n = min(16, max(1, (len(held) - 1) // window))
    tokens = held[: n * window].long().view(n, window)
    with torch.no_grad():
        return tokens, target.hidden(tokens)


def evaluate(head: FeatureHead, target: GPT, held: tuple, depth: int) -> list[float]:
    """The held-out alpha per drafting depth."""
    tokens, states = held
    head.eval()
    with torch.no_grad():
        _, alphas = head_loss(head, target, states, tokens, depth)
    head.train()
    return [round(a, 4) for a in alphas.tolist()]


def train_step(
    args: argparse.Namespace,
    target: GPT,
    head: FeatureHead,
    opt: torch.optim.Optimizer,
    step: int,
    batch: tuple[torch.Tensor, torch.Tensor],
) -> dict:
    """One optimizer step on `batch` (states, tokens); its log record."""
    lr = learning_rate(args, step)
    for group in opt.param_groups:
        group["lr"] = lr
    loss, alphas = head_loss(head, target, *batch, args.depth)
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
    opt.step()
    alphas = [round(a, 4) for a in alphas.tolist()]
    return {"step": step + 1, "loss": round(loss.item(), 4), "lr": lr, "train_alpha": alphas}


def run(args: argparse.Namespace, target_path: Path, states: States, argv: list[str] | None) -> int:
    settings, saved = training_settings(args, states), states.folder / TRAINING_STATE
    resumed = read_training_state(saved, settings)
    if args.threads:
        torch.set_num_threads(args.threads)
    corpus = load_corpus(Path(states.corpus_root))
    target, target_meta = load_checkpoint(target_path)
    target.requires_grad_(False)
    head = new_head(args, target)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    step = restore(saved, resumed, head, opt) if resumed else 0
    if step:
        print(f"resumed at step {step}", flush=True)

    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(corpus.train) - args.window, (args.windows,), generator=g)
    cache_states(target, corpus.train, starts, states)
    held = held_out(corpus.held_out, target, args.window)
    begin = time.time()
    while step < args.steps:
        g = torch.Generator().manual_seed(args.seed * 100003 + step)
        rows = torch.randint(0, args.windows, (args.batch_size,), generator=g).sort().values
        batch = batch_states(states, rows), window_tokens(corpus.train, starts[rows], args.window)
        record = train_step(args, target, head, opt, step, batch)
        step, record["elapsed"] = step + 1, round(time.time() - begin, 1)
        if step % args.eval_every == 0 or step == args.steps:
            record["held_out_alpha"] = evaluate(head, target, held, args.depth)
            save_training_state(saved, head, opt, step, settings)
        append_log(states.folder / LOG, record)
        if step % 10 == 0:
            print(json.dumps(record), flush=True)
    final = evaluate(head, target, held, args.depth)
    out = Path(args.out)
    list_written(out.parent, [out.name])
    metadata = {
        "role": "head",
        "command": "python -m minispec train-head " + " ".join(argv or sys.argv[1:]),
        "target_sha256": target_meta["sha256"],
        "corpus_fingerprint": corpus.fingerprint,
        "held_out_alpha": json.dumps(final),
        "steps": str(step),
    }
    save_head(out, head, metadata)
    print(f"saved {out}: held-out alpha per depth {final}", flush=True)
    return 0
