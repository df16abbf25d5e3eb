"""Offline training of the draft/target pair: the target first, then a draft distilled from it.

The usage, the flags and what a run writes: train_args.py, which parses the flags before this
module (and torch) is imported. Here: the batches, the schedule's learning rate, the training
loop with its periodic state, and the export of the finished models.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import shlex
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as F

from minispec.commands.corpus import (
    Corpus,
    corpus_root,
    documents,
    fingerprint,
    load_corpus,
    size_problem,
    split_sizes,
)
from minispec.commands.curve import write_curve
from minispec.commands.schedules import EVAL_WINDOWS, SCHEDULES, Schedule
from minispec.machine import device_problem
from model.checkpoint import (
    OPTIMIZER_PREFIX,
    load_checkpoint,
    read_checkpoint,
    save_checkpoint,
)
from model.folders import MARKER, list_written, unlisted
from model.gpt import GPT, PRESETS, GPTConfig
from model.storage import header_metadata, remove_stale_temporaries

# The files a run writes into --out-dir besides the models: the loss curve is a PNG with
# matplotlib and a text chart without (curve.py).
CURVES = ("loss_curve.png", "loss_curve.txt")
COPY_SPAN = (48, 240)  # bytes a copy row repeats: a few lines of code, as an edit rewrites
BLANK_LINE = torch.tensor([ord("\n")] * 2)


def get_batch(
    data: torch.Tensor,
    batch_size: int,
    seq_len: int,
    seed: int,
    step: int,
    copy_fraction: float = 0.0,
) -> tuple[torch.Tensor, torch.Tensor]:
    """Random windows of the corpus; a function of (seed, step) alone so that resuming is exact.

    Each row is, with probability copy_fraction, a copy row: the first 48-239 bytes of its
    window, a blank line, the same bytes again, then the rest of the window. Only copying
    predicts the second span. The lookup proposers draft such copies, which a target trained on
    plain windows alone does not make (docs/training.md, "Copy rows and fine-tunes")."""
    g = batch_generator(seed, step)
    windows = random_windows(data, batch_size, seq_len, g)
    if copy_fraction > 0:  # drawn after the starts: plain rows stay the rows they were
        copies = torch.rand(batch_size, generator=g) < copy_fraction
        spans = torch.randint(*COPY_SPAN, (batch_size,), generator=g).tolist()
        for row in copies.nonzero()[:, 0].tolist():
            span = windows[row, : spans[row]]
            windows[row] = torch.cat([span, BLANK_LINE, windows[row]])[: seq_len + 1]
    return windows[:, :-1], windows[:, 1:]


def batch_generator(seed: int, step: int) -> torch.Generator:
    """The generator of step `step`'s batch: a function of (seed, step) alone."""
    return torch.Generator().manual_seed(seed * 1_000_003 + step)


def random_windows(
    data: torch.Tensor, batch_size: int, seq_len: int, generator: torch.Generator
) -> torch.Tensor:
    """[batch_size, seq_len + 1] windows of `data` at random starts, as long."""
    starts = torch.randint(0, data.numel() - seq_len - 1, (batch_size,), generator=generator)
    return torch.stack([data[s : s + seq_len + 1] for s in starts.tolist()]).long()


def learning_rate(schedule: Schedule, step: int) -> float:
    """Linear warm-up, then cosine decay to 10% of the peak."""
    warmup = min(schedule.warmup, schedule.steps // 10)  # short runs (sweeps) still mostly train
    if step < warmup:
        return schedule.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, schedule.steps - warmup)
    return schedule.lr * (0.1 + 0.45 * (1 + math.cos(math.pi * progress)))


@torch.no_grad()
def held_out_bits_per_byte(
    model: GPT, data: torch.Tensor, seq_len: int, max_windows: int | None = None
) -> float:
    """Mean next-byte cross-entropy on held-out files, in bits (tokens are bytes)."""
    model.eval()
    device = model.embed.weight.device
    n = (data.numel() - 1) // seq_len
    n = min(n, max_windows) if max_windows else n
    total = 0.0
    for i in range(0, n, 16):
        rows = torch.stack(
            [data[j * seq_len : (j + 1) * seq_len + 1] for j in range(i, min(n, i + 16))]
        ).to(device, torch.long)
        logits = model(rows[:, :-1])
        total += F.cross_entropy(
            logits.flatten(0, 1), rows[:, 1:].flatten(), reduction="sum"
        ).item()
    model.train()
    return total / (n * seq_len) / math.log(2)


def optimizer_for(model: GPT, lr: float) -> torch.optim.AdamW:
    # Decay matrices only: norms' gains and the like should not be pulled towards zero.
    decay = [p for p in model.parameters() if p.dim() >= 2]
    rest = [p for p in model.parameters() if p.dim() < 2]
    return torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=lr,
        betas=(0.9, 0.95),
    )


def optimizer_tensors(model: GPT, opt: torch.optim.AdamW) -> dict[str, torch.Tensor]:
    out = {}
    for name, p in model.named_parameters():
        state = opt.state.get(p)
        if state:
            out[f"{OPTIMIZER_PREFIX}exp_avg.{name}"] = state["exp_avg"]
            out[f"{OPTIMIZER_PREFIX}exp_avg_sq.{name}"] = state["exp_avg_sq"]
    return out


def restore_optimizer(
    model: GPT, opt: torch.optim.AdamW, tensors: dict[str, torch.Tensor], step: int
) -> None:
    for name, p in model.named_parameters():
        if f"{OPTIMIZER_PREFIX}exp_avg.{name}" in tensors:
            opt.state[p] = {
                "step": torch.tensor(float(step)),
                "exp_avg": tensors[f"{OPTIMIZER_PREFIX}exp_avg.{name}"].to(p.device),
                "exp_avg_sq": tensors[f"{OPTIMIZER_PREFIX}exp_avg_sq.{name}"].to(p.device),
            }


@dataclass(frozen=True, slots=True)
class Ranks:
    """This process's place in a torchrun launch (a plain `python -m minispec train`: 0 of 1)."""

    rank: int = 0
    world: int = 1

    @property
    def writer(self) -> bool:
        return self.rank == 0  # only rank 0 writes checkpoints, state and logs

    def shard(self, rows: torch.Tensor) -> torch.Tensor:
        """This rank's rows of a global batch: every rank draws the batch and takes its slice."""
        per_rank = rows.shape[0] // self.world
        return rows[self.rank * per_rank : (self.rank + 1) * per_rank]

    def barrier(self) -> None:
        if self.world > 1:
            torch.distributed.barrier()


def fast_bf16(device: torch.device) -> bool:
    """Whether bf16 matmuls beat fp32 here. CPUs without bf16 units (no AVX512-BF16 or AMX)
    emulate them: on the 2-core dev machine a bf16 matmul ran at a quarter of fp32's speed."""
    if device.type == "cuda":
        return torch.cuda.is_bf16_supported()
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return "avx512_bf16" in flags or "amx_bf16" in flags


def training_device(name: str) -> torch.device:
    """The device this process trains on: under torchrun on CUDA, GPU number LOCAL_RANK."""
    device = torch.device(name)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")))
    return device


def init_ranks() -> Ranks:
    """Join the process group torchrun set up (its environment variables), if any."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world == 1:
        return Ranks()
    import torch.distributed as dist

    if not dist.is_initialized():
        dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    return Ranks(dist.get_rank(), dist.get_world_size())


class ProgressLog:
    """Progress a person can read (stdout) and the same records as JSON lines beside the state."""

    def __init__(
        self, path: Path, role: str, schedule: Schedule, start: int, enabled: bool
    ) -> None:
        self.path, self.role, self.schedule, self.enabled = path, role, schedule, enabled
        self.last_step, self.last_time = start, time.perf_counter()
        if enabled:
            path.parent.mkdir(parents=True, exist_ok=True)
        if enabled and start == 0:
            path.unlink(missing_ok=True)  # a fresh run starts a fresh log; --resume appends

    def record(self, step: int, train_bpb: float, heldout_bpb: float | None) -> None:
        if not self.enabled:
            return
        s = self.schedule
        # The rate over the steps since the last printed record, so compile time does not distort
        # it.
        now = time.perf_counter()
        tok_s = (step - self.last_step) * s.batch_size * s.seq_len / (now - self.last_time)
        self.last_step, self.last_time = step, now
        eta = (s.steps - step) * s.batch_size * s.seq_len / tok_s
        entry = {
            "role": self.role,
            "step": step,
            "bytes_seen": step * s.batch_size * s.seq_len,
            "train_bpb": round(train_bpb, 4),
            "heldout_bpb": None if heldout_bpb is None else round(heldout_bpb, 4),
            "tokens_per_s": round(tok_s),
            "eta_s": round(eta),
            "lr": learning_rate(s, step - 1),
        }
        held = f" | held-out {heldout_bpb:.3f}" if heldout_bpb is not None else ""
        print(
            f"[{self.role}] step {step}/{s.steps} | {entry['bytes_seen'] / 1e6:.2f}M bytes | train "
            f"{train_bpb:.3f} bits/byte{held} | {tok_s:,.0f} tok/s | "
            f"ETA {int(eta // 60)}m{int(eta % 60):02d}s",
            flush=True,
        )
        with open(self.path, "a") as f:
            f.write(json.dumps(entry) + "\n")


def train_one(
    role: str,
    preset: str,
    corpus: Corpus,
    out_dir: Path,
    state_dir: Path,
    seed: int,
    command: str,
    resume: bool,
    teacher: GPT | None = None,
    compile: bool = True,
    ranks: Ranks = Ranks(),
    overrides: dict | None = None,
    autocast: bool = True,
    init_from: Path | None = None,
    device: torch.device = torch.device("cpu"),
) -> Path:
    """Train one model of the pair and export it to out_dir/<role>.safetensors; `init_from`: a
    checkpoint to start from (a fine-tune) instead of random weights."""
    schedule = dataclasses.replace(SCHEDULES[preset][role], **(overrides or {}))
    if schedule.batch_size % ranks.world:
        raise ValueError(
            f"the {role}'s global batch of {schedule.batch_size} does not split over "
            f"{ranks.world} processes"
        )
    state_path, final_path = (
        state_dir / f"{role}.state.safetensors",
        out_dir / f"{role}.safetensors",
    )
    torch.manual_seed(seed + (role == "draft"))
    config, start = PRESETS[preset][role], 0
    model = GPT(config) if init_from is None else initial_weights(init_from, config)
    if resume and state_path.is_file():
        model, meta = load_checkpoint(state_path)
        check_resumable(state_path, meta, preset, config, seed, corpus.fingerprint)
        start = int(meta["step"])
        if ranks.writer:
            print(f"[{role}] resuming from step {start} ({state_path})", flush=True)
    # The optimizer is made for the moved parameters, so its moments live on the device too.
    model.to(device)
    opt = optimizer_for(model, schedule.lr)
    if start:
        restore_optimizer(model, opt, read_checkpoint(state_path)[0], start)
    model.train()
    # Data parallel: each rank computes the gradient of its shard's mean loss, and DDP averages
    # them, which is the gradient of the global batch's mean loss (the shards are equal in size).
    wrapped = torch.nn.parallel.DistributedDataParallel(model) if ranks.world > 1 else model
    # Training runs compiled, and under bf16 autocast only where the hardware has bf16 units
    # (fast_bf16): without them a bf16 matmul is slower than fp32. Weights and AdamW state stay
    # fp32.
    forward = torch.compile(wrapped) if compile else wrapped
    teacher_forward = torch.compile(teacher) if compile and teacher is not None else teacher
    meta = {
        "role": role,
        "preset": preset,
        "train_command": command,
        "seed": str(seed),
        "corpus": "python stdlib .py sources (no test suites)",
        "corpus_fingerprint": corpus.fingerprint,
        **({} if init_from is None else {"init_from": str(init_from)}),
    }
    log = ProgressLog(state_dir / f"{role}.log.jsonl", role, schedule, start, ranks.writer)

    def save_state(step: int) -> None:
        if ranks.writer:
            save_checkpoint(
                state_path, model, {**meta, "step": str(step)}, extra=optimizer_tensors(model, opt)
            )
        ranks.barrier()  # no rank runs ahead of (or reads) a state rank 0 has not finished writing

    for step in range(start, schedule.steps):
        for group in opt.param_groups:
            group["lr"] = learning_rate(schedule, step)
        x, y = (
            ranks.shard(t).to(device)
            for t in get_batch(
                corpus.train,
                schedule.batch_size,
                schedule.seq_len,
                seed,
                step,
                copy_fraction=schedule.copy_fraction,
            )
        )
        with torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast):
            logits = forward(x).float()
        cross_entropy = F.cross_entropy(logits.flatten(0, 1), y.flatten())
        loss = cross_entropy
        if teacher is not None:
            # Distillation: a draft that imitates the target's distribution (not just the data)
            # raises alpha = sum min(p, q), which is what speculative decoding pays on.
            with (
                torch.no_grad(),
                torch.autocast(x.device.type, dtype=torch.bfloat16, enabled=autocast),
            ):
                teacher_logp = F.log_softmax(teacher_forward(x).float(), dim=-1)
            kl = F.kl_div(
                F.log_softmax(logits, dim=-1).flatten(0, 1),
                teacher_logp.flatten(0, 1),
                log_target=True,
                reduction="batchmean",
            )
            loss = schedule.distill_weight * kl + (1 - schedule.distill_weight) * cross_entropy
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        if (step + 1) % 10 == 0 or step + 1 == schedule.steps:
            evaluate = (step + 1) % schedule.eval_every == 0 and ranks.writer
            held = (
                held_out_bits_per_byte(model, corpus.held_out, schedule.seq_len, EVAL_WINDOWS)
                if evaluate
                else None
            )
            log.record(step + 1, cross_entropy.item() / math.log(2), held)
        if (step + 1) % schedule.save_every == 0:
            save_state(step + 1)
    save_state(schedule.steps)
    if ranks.writer:
        export_dtype = getattr(torch, schedule.export_dtype)
        # Evaluate the weights as exported (rounded to the export dtype), since those are what ship.
        exported = GPT(model.config).to(device)
        exported.load_state_dict(
            {k: v.to(export_dtype).float() for k, v in model.state_dict().items()}
        )
        bpb = held_out_bits_per_byte(exported, corpus.held_out, schedule.seq_len)
        print(
            f"[{role}] held-out {bpb:.4f} bits/byte (all {corpus.held_out.numel():,} held-out "
            f"bytes) -> {final_path}",
            flush=True,
        )
        save_checkpoint(
            final_path,
            model,
            {**meta, "steps": str(schedule.steps), "heldout_bpb": f"{bpb:.4f}"},
            dtype=export_dtype,
        )
    ranks.barrier()
    return final_path


def check_resumable(
    state_path: Path, meta: dict[str, str], preset: str, config: GPTConfig, seed: int, corpus: str
) -> None:
    """ValueError unless the state whose metadata is `meta` is one this run (its preset's
    `config`, `seed`, the fingerprint `corpus`) can continue."""
    if "step" not in meta:
        raise ValueError(
            f"--resume: {state_path} is a finished model, not a training state "
            f"(it records no step); remove it or drop --resume"
        )
    try:
        saved = GPTConfig.from_json(meta.get("config", ""))
    except ValueError:
        saved = None
    # Continuing another run's state under this run's name would record a seed and corpus
    # that only the second half of training saw.
    found = (saved, meta.get("seed"), meta.get("corpus_fingerprint"))
    if found != (config, str(seed), corpus):
        raise ValueError(
            f"--resume: {state_path} is from another run (preset {meta.get('preset')!r}, "
            f"seed {meta.get('seed')}, corpus {str(meta.get('corpus_fingerprint'))[:16]}; this "
            f"run: {preset!r}, seed {seed}, corpus {corpus[:16]}); "
            f"remove it or drop --resume"
        )


def check_corpus(args: argparse.Namespace, roles: list[str], sizes: tuple[int, int, int]) -> None:
    """ValueError when a corpus of `sizes` (files, training and held-out tokens) cannot train
    the roles' windows: otherwise the first batch fails deep in torch.randint, or the held-out
    loss is a division by zero."""
    seq_len = max(SCHEDULES[args.preset][role].seq_len for role in roles)
    if (problem := size_problem(*sizes, seq_len)) is not None:
        where = "--corpus-root" if args.corpus_root is not None else "the corpus in"
        raise ValueError(f"{where} {corpus_root(args.corpus_root)}: {problem}")


def check_corpus_ahead(args: argparse.Namespace, state_dir: Path, roles: list[str]) -> None:
    """What the corpus forbids, found from its files' sizes and bytes without loading it (the
    --check-args run, before torchrun starts processes that would each fail on it): a corpus too
    small, and a --resume of a state saved on another corpus."""
    check_corpus(args, roles, split_sizes(args.corpus_root))
    if not args.resume:  # with --resume, check_arguments has found a state to continue
        return
    corpus = fingerprint(documents(args.corpus_root))
    for role in roles:
        if (path := state_dir / f"{role}.state.safetensors").is_file():
            config = PRESETS[args.preset][role]
            check_resumable(path, header_metadata(path), args.preset, config, args.seed, corpus)


def initial_weights(path: Path, config: GPTConfig) -> GPT:
    """A fine-tune's starting point: the checkpoint's weights in fp32 (a fresh optimizer; the
    schedule's warm-up eases it in)."""
    model, _ = load_checkpoint(path)
    if model.config != config:
        raise ValueError(
            f"--init-from {path}: its model ({model.config}) is not this preset's ({config})"
        )
    return model


def outputs(roles: list[str]) -> list[str]:
    """The files a run of `roles` writes into --out-dir."""
    return [f"{role}.safetensors" for role in roles] + list(CURVES)


def check_folders(
    out_dir: Path, state_dir: Path, roles: list[str], keep_state: bool, force: bool
) -> None:
    """What would otherwise go wrong only after training, or silently: a folder that cannot be
    written (found at the first save), the state of an earlier run (overwritten at the first
    save), a file of the user's where a model goes (replaced at the export), and temporaries a
    killed save left behind (never removed). `keep_state`: --resume or --force said what to do
    with an earlier state; `force`: replace the user's files too."""
    for flag, folder in (("--out-dir", out_dir), ("--state-dir", state_dir)):
        try:
            folder.mkdir(parents=True, exist_ok=True)
            with tempfile.TemporaryFile(dir=folder):
                pass
        except OSError as exc:
            raise ValueError(
                f"{flag} {folder}: cannot write there ({exc.strerror or exc})"
            ) from None
        for path in remove_stale_temporaries(folder):
            print(f"removed {path}, left by an interrupted save", flush=True)
    earlier = [state_dir / f"{role}.state.safetensors" for role in roles]
    if not keep_state and (found := [p for p in earlier if p.exists()]):
        raise ValueError(
            f"{found[0]} holds an earlier run's state: continue it with --resume, "
            f"or start over with --force"
        )
    if not force and (theirs := unlisted(out_dir, outputs(roles))):
        # --resume cannot take --force: the file has to go, or the models elsewhere.
        fix = "move it away" if keep_state else "pass --force to replace it"
        raise ValueError(
            f"--out-dir {out_dir}: {theirs[0]} is not listed in {out_dir / MARKER} as written by "
            f"minispec train: refusing to replace it; {fix}, or choose another --out-dir"
        )


def check_arguments(args: argparse.Namespace, state_dir: Path, roles: list[str]) -> None:
    """What the flags ask for that cannot be done, found before any work (and under torchrun,
    before any process starts, by the --check-args run)."""
    if args.init_from is not None and args.only is None:
        raise ValueError("--init-from starts one model: say which with --only target or draft")
    if args.init_from is not None and not args.init_from.exists():
        raise ValueError(f"--init-from {args.init_from}: no such file or folder")
    if args.corpus_root is not None and not args.corpus_root.is_dir():
        raise ValueError(f"--corpus-root {args.corpus_root}: no such folder")
    try:
        device = torch.device(args.device)
    except RuntimeError:
        raise ValueError(f"--device {args.device!r}: not a device name (cpu, cuda)") from None
    if device.type == "meta":  # torch makes tensors there, but they hold no values
        raise ValueError("--device meta: meta is not a device to train on; train on cpu or cuda")
    if (problem := device_problem(training_device(args.device))) is not None:
        raise ValueError(f"--device {args.device}: {problem}; train on --device cpu")
    shortest = 2 * COPY_SPAN[0] + len(BLANK_LINE)  # the shortest copy row
    for role in roles:
        seq_len = SCHEDULES[args.preset][role].seq_len
        if args.copy_fraction and seq_len + 1 < shortest:
            raise ValueError(
                f"--copy-fraction: the {args.preset} preset's rows of {seq_len + 1} bytes are "
                f"too short for a copy row (at least {shortest}: a span, a blank line, the "
                f"span again), so none would be made"
            )
    states = [state_dir / f"{role}.state.safetensors" for role in roles]
    if args.resume and not any(path.is_file() for path in states):
        raise ValueError(
            f"--resume: there is no saved state to continue ({' or '.join(map(str, states))}); "
            f"start without --resume"
        )


def run(args: argparse.Namespace, argv: list[str] | None) -> int:
    """Train what the parsed flags ask for (train_args.py parses them before torch loads)."""
    out_dir, state_dir = Path(args.out_dir), Path(args.state_dir or f"runs/{args.preset}")
    roles = [r for r in ("target", "draft") if args.only in (None, r)]
    check_arguments(args, state_dir, roles)
    overrides = {
        k: v
        for k, v in (
            ("steps", args.steps),
            ("batch_size", args.batch_size),
            ("lr", args.lr),
            ("copy_fraction", args.copy_fraction),
        )
        if v is not None
    }
    command = "python -m minispec train " + shlex.join(argv if argv is not None else sys.argv[1:])
    ranks = Ranks() if args.check_args else init_ranks()
    if ranks.writer:  # before the corpus loads: a run that cannot finish fails in a second
        check_folders(
            out_dir, state_dir, roles, keep_state=args.resume or args.force, force=args.force
        )
    if args.only == "draft" and not (out_dir / "target.safetensors").is_file():
        raise ValueError(
            f"--only draft distils from a trained target, and "
            f"{out_dir / 'target.safetensors'} does not exist: train it first"
        )
    if args.check_args:
        check_corpus_ahead(args, state_dir, roles)
        return 0
    device = training_device(args.device)
    autocast = not args.fp32 and fast_bf16(device)
    corpus = load_corpus(args.corpus_root)
    check_corpus(args, roles, (corpus.num_files, corpus.train.numel(), corpus.held_out.numel()))
    if ranks.writer:
        list_written(out_dir, outputs(roles))  # before they are written (model/folders.py)
        print(
            f"corpus: {corpus.num_files} files, {corpus.train.numel():,} train / "
            f"{corpus.held_out.numel():,} "
            f"held-out bytes, fingerprint {corpus.fingerprint[:16]}, {ranks.world} process(es), "
            f"{'bf16 autocast' if autocast else 'fp32'}",
            flush=True,
        )
    try:
        target_path = out_dir / "target.safetensors"
        # On --resume the target always goes through train_one, even if a target.safetensors
        # exists: that file may be from another run (the shipped pair lives in checkpoints/), and
        # only the saved state tells how far this run got. A finished state costs one re-export.
        if args.only != "draft":
            train_one(
                "target",
                args.preset,
                corpus,
                out_dir,
                state_dir,
                args.seed,
                command,
                args.resume,
                compile=args.compile,
                ranks=ranks,
                overrides=overrides,
                autocast=autocast,
                init_from=args.init_from,
                device=device,
            )
        if args.only != "target":
            teacher, _ = load_checkpoint(target_path)
            teacher.requires_grad_(False).to(device)
            train_one(
                "draft",
                args.preset,
                corpus,
                out_dir,
                state_dir,
                args.seed,
                command,
                args.resume,
                teacher,
                compile=args.compile,
                ranks=ranks,
                overrides=overrides,
                autocast=autocast,
                init_from=args.init_from,
                device=device,
            )
        if ranks.writer and (curve := write_curve(state_dir, out_dir)) is not None:
            print(f"loss curve -> {curve}", flush=True)
    except KeyboardInterrupt:
        print(
            "\ninterrupted: the last saved state is intact; continue with --resume", file=sys.stderr
        )
        return 130
    finally:
        if ranks.world > 1:
            torch.distributed.destroy_process_group()
    return 0
