"""`minispec train-head`: train a feature head (model/head.py) on the shipped target's states.

Two phases, each resumable from --state-dir:
  states  the frozen target runs once over random windows of the corpus, in float32, and its
          final states are kept as float16 on disk (768 bytes a token at width 384);
  train   the head learns from those cached states, several passes, never running the target:
          soft cross-entropy against the target's next-token distribution (the target's head
          over the next true state) plus a small smooth-L1 pull toward that state, at each of
          `--depth` drafting steps fed with the head's own guesses (model/head.py, `unrolled`).
The held-out score is the per-depth alpha, mean sum min(p, q) at temperature 1, on held-out
files. The head is saved as float16 safetensors with its command and scores.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from pathlib import Path

HELP = "train a feature-drafting head on the target's cached states"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="minispec train-head", description=HELP)
    p.add_argument("--target", default=None, help="target checkpoint (default: the shipped one)")
    p.add_argument("--corpus-root", default=None, help="a folder of .py files (default: stdlib)")
    p.add_argument("--state-dir", default="runs/head", help="cached states and training state")
    p.add_argument("--out", default="checkpoints/head.safetensors")
    p.add_argument("--windows", type=int, default=5000, help="corpus windows of the states")
    p.add_argument("--window", type=int, default=512)
    p.add_argument("--steps", type=int, default=1400)
    p.add_argument("--batch-size", type=int, default=16, help="windows a step")
    p.add_argument("--depth", type=int, default=3, help="drafting steps trained per position")
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--width", type=int, default=256, help="the head's layer width")
    p.add_argument("--mlp-hidden", type=int, default=704)
    p.add_argument("--heads", type=int, default=4)
    p.add_argument("--seed", type=int, default=1234)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--threads", type=int, default=None)
    p.add_argument("--force", action="store_true", help="replace an --out minispec did not write")
    return p


def check_args(args: argparse.Namespace) -> None:
    """ValueError naming the flag, before torch is imported."""
    from minispec.commands.corpus import corpus_root, size_problem, split_sizes
    from model.folders import unlisted

    for name in ("windows", "window", "steps", "batch_size", "depth", "width", "heads"):
        if getattr(args, name) <= 0:
            raise ValueError(f"--{name.replace('_', '-')} must be positive")
    if not 0 < args.lr < 1:
        raise ValueError("--lr must be in (0, 1)")
    if args.width % args.heads or (args.width // args.heads) % 2:
        raise ValueError(f"--width {args.width} must split into --heads {args.heads} even heads")
    if args.corpus_root is not None and not Path(args.corpus_root).is_dir():
        raise ValueError(f"--corpus-root {args.corpus_root!r}: not a folder")
    root = Path(args.corpus_root) if args.corpus_root else None
    if problem := size_problem(*split_sizes(root), args.window):
        raise ValueError(f"the corpus in {corpus_root(root)}: {problem}")
    out = Path(args.out)
    if not args.force and unlisted(out.parent, [out.name]):
        raise ValueError(f"{out} was not written by minispec: pass --force to replace it")


def cache_states(target, corpus, args, state_dir: Path):  # noqa: ANN001
    """The target's final states over args.windows random windows: float16 [N, T, C] on disk,
    with the tokens [N, T]; resumes where a killed run stopped (a progress file, written after
    each chunk)."""
    import numpy as np
    import torch

    n, t, c = args.windows, args.window, target.config.d_model
    g = torch.Generator().manual_seed(args.seed)
    starts = torch.randint(0, len(corpus) - t, (n,), generator=g)
    tokens = torch.stack([corpus[s : s + t].long() for s in starts.tolist()])
    np.save(state_dir / "tokens.npy", tokens.numpy().astype(np.int16))
    path, progress = state_dir / "states.f16", state_dir / "states.done"
    mode = "r+" if path.exists() else "w+"
    states = np.memmap(path, dtype=np.float16, mode=mode, shape=(n, t, c))
    done = int(progress.read_text()) if progress.exists() else 0
    chunk, begin = 8, time.time()
    with torch.no_grad():
        for i in range(done, n, chunk):
            batch = tokens[i : i + chunk]
            states[i : i + len(batch)] = target.hidden(batch).numpy().astype(np.float16)
            states.flush()
            progress.write_text(str(i + len(batch)))
            if (i // chunk) % 50 == 0:
                rate = (i + len(batch) - done) * t / (time.time() - begin)
                print(f"states {i + len(batch)}/{n} windows, {rate:,.0f} tokens/s", flush=True)
    return tokens, states


def head_loss(head, target, states, tokens, depth: int):  # noqa: ANN001
    """Mean over depths of soft cross-entropy to the target's next distribution, plus 0.1 x
    smooth L1 to the next true state; and the per-depth alpha at temperature 1."""
    import torch
    import torch.nn.functional as F

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


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    try:
        check_args(args)
    except ValueError as exc:
        print(f"minispec train-head: {exc}", file=sys.stderr)
        return 2
    import numpy as np
    import torch

    from minispec.commands.corpus import load_corpus
    from model.checkpoint import load_checkpoint, save_head
    from model.folders import list_written
    from model.head import FeatureHead, HeadConfig

    if args.threads:
        torch.set_num_threads(args.threads)
    state_dir = Path(args.state_dir)
    state_dir.mkdir(parents=True, exist_ok=True)
    shipped = Path(__file__).resolve().parents[2] / "checkpoints" / "target.safetensors"
    target_path = args.target or shipped
    target, target_meta = load_checkpoint(target_path)
    target.requires_grad_(False)
    corpus = load_corpus(Path(args.corpus_root) if args.corpus_root else None)
    source = f"{target_meta.get('sha256', '')} {corpus.fingerprint}"  # what a resume must match
    tokens, states = cache_states(target, corpus.train, args, state_dir)

    torch.manual_seed(args.seed)
    config = HeadConfig(
        target_width=target.config.d_model,
        d_model=args.width,
        n_head=args.heads,
        mlp_hidden=args.mlp_hidden,
        max_seq_len=target.config.max_seq_len,
        norm_eps=target.config.norm_eps,
    )
    head = FeatureHead(config, target.config.vocab_size)
    opt = torch.optim.AdamW(head.parameters(), lr=args.lr, weight_decay=0.0, betas=(0.9, 0.95))
    step, resume = 0, state_dir / "train.pt"
    if resume.exists():
        saved = torch.load(resume)
        if saved.get("source") not in (None, source):
            print(f"minispec train-head: {resume} trains another target or corpus", file=sys.stderr)
            return 2
        head.load_state_dict(saved["head"])
        opt.load_state_dict(saved["opt"])
        step = saved["step"]
        print(f"resumed at step {step}", flush=True)

    held = corpus.held_out.long()
    n_eval = min(16, max(1, (len(held) - 1) // args.window))
    eval_tokens = torch.stack(
        [held[i * args.window : (i + 1) * args.window] for i in range(n_eval)]
    )
    with torch.no_grad():
        eval_states = target.hidden(eval_tokens)

    def evaluate() -> list[float]:
        head.eval()
        with torch.no_grad():
            _, alphas = head_loss(head, target, eval_states, eval_tokens, args.depth)
        head.train()
        return [round(a, 4) for a in alphas.tolist()]

    log = open(state_dir / "head.log.jsonl", "a")
    warmup = 30
    begin = time.time()
    while step < args.steps:
        lr = args.lr * min(1, (step + 1) / warmup)
        lr *= 0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps))
        for group in opt.param_groups:
            group["lr"] = lr
        g = torch.Generator().manual_seed(args.seed * 100003 + step)
        rows = torch.randint(0, args.windows, (args.batch_size,), generator=g).sort().values
        batch_states = torch.from_numpy(np.asarray(states[rows.numpy()], dtype=np.float32))
        batch_tokens = tokens[rows]
        loss, alphas = head_loss(head, target, batch_states, batch_tokens, args.depth)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(head.parameters(), 1.0)
        opt.step()
        step += 1
        record = {
            "step": step,
            "loss": round(loss.item(), 4),
            "lr": lr,
            "train_alpha": [round(a, 4) for a in alphas.tolist()],
            "elapsed": round(time.time() - begin, 1),
        }
        if step % args.eval_every == 0 or step == args.steps:
            record["held_out_alpha"] = evaluate()
            tmp = state_dir / "train.pt.tmp"
            saved = {"head": head.state_dict(), "opt": opt.state_dict(), "step": step}
            torch.save({**saved, "source": source}, tmp)
            tmp.replace(resume)
        log.write(json.dumps(record) + "\n")
        log.flush()
        if step % 10 == 0:
            print(json.dumps(record), flush=True)
    final = evaluate()
    command = "python -m minispec train-head " + " ".join(argv or sys.argv[1:])
    list_written(Path(args.out).parent, [Path(args.out).name])
    save_head(
        args.out,
        head,
        {
            "role": "head",
            "command": command,
            "target_sha256": target_meta.get("sha256", ""),
            "corpus_fingerprint": corpus.fingerprint,
            "held_out_alpha": json.dumps(final),
            "steps": str(step),
        },
    )
    print(f"saved {args.out}: held-out alpha per depth {final}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
