"""The training schedules, per preset and role: plain data with no torch, so that `minispec
train` checks its flags (--preset's choices) before torch is imported."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Schedule:
    steps: int
    batch_size: int
    seq_len: int
    lr: float
    warmup: int = 100
    distill_weight: float = (
        0.0  # weight of KL(target || draft); the rest is next-byte cross-entropy
    )
    # Share of rows that teach copying (get_batch); 0 for the shipped pair.
    copy_fraction: float = 0.0
    save_every: int = 200
    eval_every: int = 100  # held-out bits/byte on EVAL_WINDOWS windows, for the loss curve
    export_dtype: str = "float32"


EVAL_WINDOWS = 64  # 32k held-out bytes: a curve point in seconds; the final figure uses all of them


SCHEDULES: dict[str, dict[str, Schedule]] = {
    # The shipped pair's models, on a schedule that trains them in under two hours on one CPU
    # core. The shipped pair itself ran longer, on a GPU, with --steps and --batch-size
    # (checkpoints/README.md).
    "cpu": {
        "target": Schedule(
            steps=600,
            batch_size=16,
            seq_len=512,
            lr=2e-3,
            save_every=50,
            eval_every=50,
            export_dtype="float16",
        ),
        "draft": Schedule(
            steps=400,
            batch_size=16,
            seq_len=512,
            lr=3e-3,
            distill_weight=0.8,
            save_every=50,
            eval_every=50,
            export_dtype="float16",
        ),
    },
    "gpu": {
        "target": Schedule(steps=20000, batch_size=64, seq_len=512, lr=1e-3, save_every=1000),
        "draft": Schedule(
            steps=10000, batch_size=64, seq_len=512, lr=2e-3, distill_weight=0.8, save_every=1000
        ),
    },
    "tiny": {
        "target": Schedule(
            steps=30, batch_size=4, seq_len=64, lr=3e-3, warmup=5, save_every=10, eval_every=10
        ),
        "draft": Schedule(
            steps=30,
            batch_size=4,
            seq_len=64,
            lr=3e-3,
            warmup=5,
            distill_weight=0.8,
            save_every=10,
            eval_every=10,
        ),
    },
}
