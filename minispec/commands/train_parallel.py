"""`minispec train-parallel`: teach the shipped draft to draft K tokens in one forward (PARD).

A parallel drafter (An et al. 2025, arXiv 2504.18583) reads the prefix followed by K - 1 mask
tokens (model/tokenizer.py, MASK_TOKEN_ID) and predicts a draft at every one of the K positions
in one pass: the last real token's output is x_1, the j-th mask's is x_(j+1). It is the draft
model itself, fine-tuned; its real positions keep their ordinary next-token job, so the same
checkpoint drafts sequentially too.

Training rows (`training_rows`): a window of L real tokens, causal, and for A anchors t drawn
in it, a group of depth - 1 masks at positions t+1 .. t+depth-1 that see the real tokens up to
t and the masks of their own group before them: exactly what a mask sees at decode time, when
t is the last real token (minispec/proposers/parallel.py). Training only A of the L anchors is
PARD's way of keeping the mask groups cheap. Every position's output at position P predicts
the token at P + 1, so its teacher is the target's distribution at P on the true window: the
loss is 0.8 KL(target || draft) + 0.2 cross-entropy, the draft's own distillation objective,
on the real positions and on the masks, equally weighted.

The held-out score is alpha by depth: mean sum_v min(p, q) at temperature 1, depth 1 from the
real positions and depth d from the masks d - 1 after an anchor, over every anchor of held-out
windows. Resumable: --resume continues the state in --state-dir bit for bit; the state records
every setting that shapes it, and a different one is refused.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HELP = "fine-tune the draft to draft K tokens in one forward (a parallel drafter, PARD)"
DEFAULT_OUT = "checkpoints/parallel.safetensors"
# What a state must agree on with the run that resumes it.
SHAPING = ("seed", "window", "anchors", "depth", "batch_size", "lr", "steps")


def parser() -> argparse.ArgumentParser:
    from minispec.commands.args import OneLineParser, integer, real, thread_count

    p = OneLineParser(prog="minispec train-parallel", description=HELP)
    p.add_argument("--draft", default=None, help="the draft to start from (default: shipped)")
    p.add_argument("--target", default=None, help="the teacher (default: the shipped target)")
    p.add_argument("--out", default=DEFAULT_OUT, help=f"the parallel draft (default {DEFAULT_OUT})")
    p.add_argument("--state-dir", default="runs/parallel", help="the resumable training state")
    p.add_argument("--corpus-root", default=None, help="a folder of .py files (default: stdlib)")
    p.add_argument("--steps", type=integer(1, 10**7), default=1400, help="the schedule's length")
    p.add_argument(
        "--until",
        type=integer(1, 10**7),
        default=None,
        help="stop at this step and write the draft (default: --steps); --resume goes on",
    )
    p.add_argument("--batch-size", type=integer(1, 4096), default=16, help="windows a step")
    p.add_argument("--window", type=integer(16, 4096), default=256, help="real tokens a row")
    p.add_argument("--anchors", type=integer(1, 4096), default=48, help="mask groups a row")
    p.add_argument("--depth", type=integer(2, 32), default=8, help="drafts one forward trains")
    p.add_argument("--lr", type=real(1e-6, 1.0), default=1e-3)
    p.add_argument("--seed", type=integer(0, 2**31 - 1), default=1234)
    p.add_argument("--eval-every", type=integer(1, 10**7), default=100)
    p.add_argument("--save-every", type=integer(1, 10**7), default=50)
    p.add_argument("--threads", type=thread_count, default=None)
    p.add_argument("--resume", action="store_true", help="continue the state in --state-dir")
    return p


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before torch is imported (CheckpointError: an --out that
    is no checkpoint)."""
    from model.storage import header_metadata

    if args.anchors > args.window - args.depth + 1:
        raise ValueError(
            f"--anchors {args.anchors} is more than a --window of {args.window} holds at "
            f"--depth {args.depth} ({args.window - args.depth + 1})"
        )
    if args.corpus_root is not None and not Path(args.corpus_root).is_dir():
        raise ValueError(f"--corpus-root {args.corpus_root!r} is not a folder")
    inputs = {Path(p).resolve() for p in (args.draft, args.target) if p}
    if not args.out or Path(args.out).is_dir():
        raise ValueError(f"--out {args.out!r} must name a file")
    if Path(args.out).resolve() in inputs:
        raise ValueError(f"--out {args.out} is one of the inputs: it would be replaced")
    if Path(args.out).exists() and "mask_token_id" not in header_metadata(Path(args.out)):
        raise ValueError(f"--out {args.out} is not a parallel draft: name a file of its own")


def training_rows(x, anchors, depth: int, mask_token_id: int):
    """The tokens, positions and visibility of a batch's training rows, and each token's depth.

    x [B, L]: real windows; anchors [B, A]: distinct positions t <= L - depth, each the last
    real token of a group of depth - 1 masks. Returns tokens, positions and depths [B, T]
    (T = L + A (depth - 1): the real tokens, then the groups; a real token is at depth 1, the
    j-th mask of a group at depth j + 1) and visible [B, T, T]."""
    import torch

    B, L = x.shape
    steps = torch.arange(1, depth, device=x.device)  # a mask's distance from its anchor
    group_positions = (anchors[:, :, None] + steps).flatten(1)  # [B, A (depth - 1)]
    tokens = torch.cat([x, torch.full_like(group_positions, mask_token_id)], 1)
    positions = torch.cat([torch.arange(L, device=x.device).expand(B, L), group_positions], 1)
    # Each token's anchor (a real token is its own) and its distance from it.
    anchor = torch.cat([positions[:, :L], anchors.repeat_interleave(depth - 1, 1)], 1)
    distance = positions - anchor
    is_mask = distance > 0
    q, k = (
        (slice(None), slice(None), None),
        (slice(None), None, slice(None)),
    )  # [B, T, 1], [B, 1, T]
    sees_real = ~is_mask[k] & (positions[k] <= anchor[q])
    sees_mask = is_mask[q] & is_mask[k] & (anchor[k] == anchor[q]) & (distance[k] <= distance[q])
    return tokens, positions, distance + 1, sees_real | sees_mask


def draw_anchors(generator, batch_size: int, window: int, count: int, depth: int):
    """[B, count] distinct anchors per row in [0, window - depth], sorted."""
    import torch

    scores = torch.rand(batch_size, window - depth + 1, generator=generator)
    return scores.argsort(1)[:, :count].sort(1).values


def draft_log_probs(draft, tokens, positions, visible):
    """The draft's log q [B, T, V] over training rows: no cache, attention as `visible` says."""
    import torch.nn.functional as F

    from model.gpt import CacheLayout

    return F.log_softmax(draft(tokens, positions, CacheLayout(None, visible)), -1)


def teacher_at(teacher_logp, positions):
    """The target's log p at each token's position [B, T, V]: what an output at position P
    predicts is the token at P + 1, whose distribution the target gives at P."""
    return teacher_logp.gather(1, positions[..., None].expand(-1, -1, teacher_logp.shape[-1]))


def loss(log_q, log_p, labels, real: int):
    """0.8 KL(p || q) + 0.2 cross-entropy to the true next tokens [B, T], a mean over the first
    `real` positions plus a mean over the masks after them."""
    kl = (log_p.exp() * (log_p - log_q)).sum(-1)
    ce = -log_q.gather(-1, labels[..., None]).squeeze(-1)
    per_token = 0.8 * kl + 0.2 * ce
    return per_token[:, :real].mean() + per_token[:, real:].mean()


def alpha_by_depth(draft, target, windows, depth: int, mask_token_id: int) -> list[float]:
    """Held-out alpha (mean sum min(p, q), temperature 1) at each depth 1..depth, every anchor
    of windows [N, L] counted."""
    import torch

    N, L = windows.shape
    totals, counts = torch.zeros(depth + 1), torch.zeros(depth + 1)
    with torch.no_grad():
        for rows in windows.split(4):
            anchors = torch.arange(L - depth + 1).expand(rows.shape[0], -1)
            tokens, positions, depths, visible = training_rows(rows, anchors, depth, mask_token_id)
            q = draft_log_probs(draft, tokens, positions, visible).exp()
            p = teacher_at(torch.log_softmax(target(rows), -1), positions).exp()
            overlap = torch.minimum(p, q).sum(-1)
            totals.index_add_(0, depths.flatten(), overlap.flatten())
            counts.index_add_(0, depths.flatten(), torch.ones(overlap.numel()))
    return [round(a, 4) for a in (totals[1:] / counts[1:]).tolist()]


def main(argv: list[str] | None = None) -> int:
    from minispec.commands.args import fail
    from model.errors import CheckpointError

    args = parser().parse_args(argv)
    try:
        check_args(args)
        return train(args, "python -m minispec train-parallel " + " ".join(argv or sys.argv[1:]))
    except (ValueError, CheckpointError, OSError) as exc:  # OSError: a full disk, a bad path
        return fail(f"minispec train-parallel: {exc}")


def train(args: argparse.Namespace, command: str) -> int:
    import torch

    from minispec.commands.corpus import load_corpus
    from minispec.commands.train import (
        batch_generator,
        optimizer_for,
        optimizer_tensors,
        random_windows,
        restore_optimizer,
    )
    from model.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
    from model.folders import list_written
    from model.tokenizer import MASK_TOKEN_ID

    if args.threads:
        torch.set_num_threads(args.threads)
    shipped = Path(__file__).resolve().parents[2] / "checkpoints"
    target, target_meta = load_checkpoint(args.target or shipped / "target.safetensors")
    draft, draft_meta = load_checkpoint(args.draft or shipped / "draft.safetensors")
    if draft.config.vocab_size != target.config.vocab_size:
        raise ValueError("the draft and the target have different vocabularies")
    if args.window > min(draft.config.max_seq_len, target.config.max_seq_len):
        raise ValueError(f"--window {args.window} is longer than the models' context")
    target.requires_grad_(False)
    corpus = load_corpus(Path(args.corpus_root) if args.corpus_root else None)
    settings = {name: str(getattr(args, name)) for name in SHAPING}
    settings.update(
        target_sha256=target_meta["sha256"],
        draft_sha256=draft_meta["sha256"],
        corpus_fingerprint=corpus.fingerprint,
    )
    state_path = Path(args.state_dir) / "parallel.state.safetensors"
    state_path.parent.mkdir(parents=True, exist_ok=True)
    draft.train()
    opt = optimizer_for(draft, args.lr)
    step = 0
    if args.resume and state_path.is_file():
        resumed, meta = load_checkpoint(state_path)
        for name, value in settings.items():
            if meta.get(name) != value:
                raise ValueError(
                    f"--resume: {state_path} has {name} {meta.get(name)}, this run {value}; "
                    "use another --state-dir or drop --resume"
                )
        step = int(meta["step"])
        draft.load_state_dict(resumed.state_dict())
        restore_optimizer(draft, opt, read_checkpoint(state_path)[0], step)
        print(f"resumed at step {step} ({state_path})", flush=True)
    held = corpus.held_out.long()
    n_eval = min(16, (held.numel() - 1) // args.window)
    eval_windows = torch.stack(
        [held[i * args.window : (i + 1) * args.window] for i in range(n_eval)]
    )

    def evaluate() -> list[float]:
        draft.eval()
        alphas = alpha_by_depth(draft, target, eval_windows, args.depth, MASK_TOKEN_ID)
        draft.train()
        return alphas

    with open(Path(args.state_dir) / "parallel.log.jsonl", "a") as log:
        begin = time.time()
        if step == 0:
            record = {"step": 0, "held_out_alpha": evaluate()}
            print(json.dumps(record), flush=True)
            log.write(json.dumps(record) + "\n")
        until = min(args.until or args.steps, args.steps)
        while step < until:
            lr = args.lr * min(1.0, (step + 1) / 50)
            lr *= 0.1 + 0.45 * (1 + math.cos(math.pi * step / args.steps))
            for group in opt.param_groups:
                group["lr"] = lr
            g = batch_generator(args.seed, step)  # the windows, then the anchors
            windows = random_windows(corpus.train, args.batch_size, args.window, g)
            x, labels = windows[:, :-1], windows[:, 1:]
            anchors = draw_anchors(g, args.batch_size, args.window, args.anchors, args.depth)
            tokens, positions, _, visible = training_rows(x, anchors, args.depth, MASK_TOKEN_ID)
            with torch.no_grad():
                log_p = teacher_at(torch.log_softmax(target(x), -1), positions)
            log_q = draft_log_probs(draft, tokens, positions, visible)
            value = loss(log_q, log_p, labels.gather(1, positions), args.window)
            opt.zero_grad(set_to_none=True)
            value.backward()
            torch.nn.utils.clip_grad_norm_(draft.parameters(), 1.0)
            opt.step()
            step += 1
            record = {
                "step": step,
                "loss": round(value.item(), 4),
                "lr": round(lr, 6),
                "elapsed": round(time.time() - begin, 1),
            }
            if step % args.eval_every == 0 or step == until:
                record["held_out_alpha"] = evaluate()
            if step % args.save_every == 0 or step == until:
                save_checkpoint(
                    state_path,
                    draft,
                    {**settings, "step": str(step)},
                    extra=optimizer_tensors(draft, opt),
                )
            log.write(json.dumps(record) + "\n")
            log.flush()
            if step % 10 == 0 or "held_out_alpha" in record:
                print(json.dumps(record), flush=True)
    final = evaluate()
    list_written(Path(args.out).parent, [Path(args.out).name])
    save_checkpoint(
        args.out,
        draft,
        {
            **draft_meta_keep(draft_meta),
            "role": "draft",
            "parallel_depth": str(args.depth),
            "mask_token_id": str(MASK_TOKEN_ID),
            "train_command": command,
            "init_from_sha256": draft_meta["sha256"],
            "teacher_sha256": target_meta["sha256"],
            "corpus_fingerprint": corpus.fingerprint,
            "held_out_alpha_by_depth": json.dumps(final),
            "steps": f"{step} of a {args.steps}-step schedule",
        },
        dtype=torch.float16,
    )
    print(f"saved {args.out}: held-out alpha by depth {final}", flush=True)
    return 0


def draft_meta_keep(meta: dict[str, str]) -> dict[str, str]:
    """What the parallel draft inherits from the draft it started from: its preset and corpus."""
    return {k: v for k, v in meta.items() if k in ("preset", "corpus")}


if __name__ == "__main__":
    raise SystemExit(main())
