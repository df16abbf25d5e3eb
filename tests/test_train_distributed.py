"""Training under torchrun: DDP over gloo on the CPU is the same training as one process.

Each rank takes its slice of the global batch (a function of seed and step) and DDP averages
the gradients, so 2 processes must end where 1 process ends with the same global batch, up to
float32 rounding in the all-reduce. Only rank 0 writes; --resume works for any process count.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from test_train import synthetic_corpus

from minispec.commands import train
from model.checkpoint import OPTIMIZER_PREFIX, read_checkpoint
from model.folders import MARKER

ROOT = Path(__file__).resolve().parents[1]


def torchrun(tmp: Path, nproc: int, *extra: str) -> subprocess.Popen:
    """`torchrun --nproc_per_node=N -m minispec train` on the tiny preset, target only."""
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--standalone",
        f"--nproc_per_node={nproc}",
        "-m",
        "minispec",
        "train",
        "--preset",
        "tiny",
        "--only",
        "target",
        "--no-compile",
        "--fp32",
        "--out-dir",
        str(tmp / "out"),
        "--state-dir",
        str(tmp / "state"),
        *extra,
    ]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    return subprocess.Popen(
        cmd,
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        start_new_session=True,
    )


def finish(proc: subprocess.Popen) -> str:
    out, _ = proc.communicate(timeout=300)
    assert proc.returncode == 0, out
    return out


def weights(path: Path) -> dict[str, torch.Tensor]:
    return {k: v for k, v in read_checkpoint(path)[0].items() if not k.startswith(OPTIMIZER_PREFIX)}


@pytest.fixture(scope="module")
def two_process_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    tmp = tmp_path_factory.mktemp("ddp")
    out = finish(torchrun(tmp, 2))
    assert "2 process(es)" in out
    return tmp


def test_two_processes_end_with_the_weights_of_one(two_process_run: Path, tmp_path: Path) -> None:
    single = finish(torchrun(tmp_path, 1))
    assert "1 process(es)" in single
    two, one = (
        weights(two_process_run / "out" / "target.safetensors"),
        weights(tmp_path / "out" / "target.safetensors"),
    )
    assert two.keys() == one.keys()
    for name in one:
        torch.testing.assert_close(two[name], one[name], rtol=1e-4, atol=1e-5, msg=name)


def test_ranks_split_the_global_batch_into_disjoint_equal_shards() -> None:
    # Equal weights alone would not show it: ranks that each trained on the whole batch would
    # average identical gradients and end in the same place, at twice the cost.
    batch = torch.arange(24).view(8, 3)
    shards = [train.Ranks(rank, 4).shard(batch) for rank in range(4)]
    assert all(s.shape == (2, 3) for s in shards)
    assert torch.equal(torch.cat(shards), batch)


def test_only_rank_zero_writes(two_process_run: Path) -> None:
    # Both ranks would write the same names, so check the files are whole and nothing else appeared.
    assert sorted(p.name for p in (two_process_run / "out").iterdir()) in (
        [curve, MARKER, "target.safetensors"] for curve in ("loss_curve.png", "loss_curve.txt")
    )
    assert sorted(p.name for p in (two_process_run / "state").iterdir()) == [
        "target.log.jsonl",
        "target.state.safetensors",
    ]
    lines = (two_process_run / "state" / "target.log.jsonl").read_text().splitlines()
    assert (
        len(lines) == train.SCHEDULES["tiny"]["target"].steps // 10
    )  # one writer: no duplicated records


def test_rank_one_writes_nothing(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """In-process: rank 1 of 2 (on a 1-process gloo group) trains but leaves no file behind."""
    import torch.distributed as dist

    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        train.train_one(
            "target",
            "tiny",
            synthetic_corpus(),
            tmp_path / "out",
            tmp_path / "state",
            1234,
            "test",
            resume=False,
            compile=False,
            ranks=train.Ranks(rank=1, world=2),
        )
    finally:
        dist.destroy_process_group()
    assert not (tmp_path / "out").exists() and not (tmp_path / "state").exists()


def test_two_process_resume_after_a_kill_matches_the_whole_run(
    two_process_run: Path, tmp_path: Path
) -> None:
    proc = torchrun(tmp_path, 2)
    state = tmp_path / "state" / "target.state.safetensors"
    deadline = time.monotonic() + 240
    while not state.exists() and proc.poll() is None and time.monotonic() < deadline:
        time.sleep(0.05)
    os.killpg(proc.pid, signal.SIGKILL)  # the launcher and both ranks, mid-run
    proc.communicate()
    saved_at = int(read_checkpoint(state)[1]["step"])
    out = finish(torchrun(tmp_path, 2, "--resume"))
    if saved_at < train.SCHEDULES["tiny"]["target"].steps:
        assert f"resuming from step {saved_at}" in out
    whole, resumed = (
        weights(two_process_run / "out" / "target.safetensors"),
        weights(tmp_path / "out" / "target.safetensors"),
    )
    for name in whole:
        torch.testing.assert_close(resumed[name], whole[name], rtol=0, atol=0, msg=name)
