"""Offline training: a short tiny-preset run learns, and an interrupted run resumes exactly."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch

from minispec.commands import train, train_args
from minispec.commands.corpus import Corpus, load_corpus
from minispec.commands.train import Schedule
from model.checkpoint import load_checkpoint, read_checkpoint, save_checkpoint
from model.gpt import GPT, PRESETS
from model.tokenizer import BOS_TOKEN_ID, EOS_TOKEN_ID, VOCAB_SIZE

UNIFORM_BITS = math.log2(VOCAB_SIZE)  # ~8.01: the loss of a model that knows nothing


@pytest.fixture(scope="module", autouse=True)
def one_thread():
    """The tiny models' kernels are too small to split: on a busy 2-core machine a second
    intra-op thread mostly waits for the first (10x slower here while a training job runs)."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def stdlib_corpus() -> Corpus:
    return load_corpus()  # a few seconds: load once for the module


def synthetic_corpus() -> Corpus:
    """A small corpus in the real one's format, for tests that need batches, not Python."""
    docs = [f"def f{i}(x):\n    return x * {i % 7} + {i}\n".encode() for i in range(600)]
    ids = [t for doc in docs for t in (BOS_TOKEN_ID, *doc, EOS_TOKEN_ID)]
    split = len(ids) * 9 // 10
    as_tensor = lambda part: torch.tensor(part, dtype=torch.int16)  # noqa: E731
    return Corpus(
        as_tensor(ids[:split]), as_tensor(ids[split:]), fingerprint="synthetic", num_files=600
    )


def run_train(monkeypatch: pytest.MonkeyPatch, corpus: Corpus, tmp: Path, *extra: str) -> int:
    monkeypatch.setattr(train, "load_corpus", lambda root=None: corpus)
    return train_args.main(
        [
            "--preset",
            "tiny",
            "--out-dir",
            str(tmp / "out"),
            "--state-dir",
            str(tmp / "state"),
            "--no-compile",
            *extra,
        ]
    )


def test_short_tiny_run_reduces_the_loss(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    stdlib_corpus: Corpus,
) -> None:
    seq_len = train.SCHEDULES["tiny"]["target"].seq_len
    # An untrained model is close to uniform, so "reduces" is measured from ~8 bits/byte.
    torch.manual_seed(0)
    untrained = train.held_out_bits_per_byte(
        GPT(PRESETS["tiny"]["target"]), stdlib_corpus.held_out, seq_len, 64
    )
    assert abs(untrained - UNIFORM_BITS) < 0.3

    assert run_train(monkeypatch, stdlib_corpus, tmp_path) == 0
    out = capsys.readouterr().out
    for role, bound in (("target", 6.0), ("draft", 7.0)):
        model, meta = load_checkpoint(tmp_path / "out" / f"{role}.safetensors")
        assert model.config == PRESETS["tiny"][role]
        assert float(meta["heldout_bpb"]) < bound, (role, meta["heldout_bpb"])
        assert meta["corpus_fingerprint"] == stdlib_corpus.fingerprint
        assert meta["seed"] == "1234" and meta["role"] == role
        assert meta["train_command"].startswith("python -m minispec train --preset tiny")
        steps = train.SCHEDULES["tiny"][role].steps
        line = (
            rf"\[{role}\] step {steps}/{steps} \| [\d.]+M bytes \| "
            r"train [\d.]+ bits/byte \| held-out [\d.]+"
        )
        assert re.search(line + r" \| [\d,]+ tok/s \| ETA 0m00s", out)
        assert (tmp_path / "state" / f"{role}.state.safetensors").is_file()
        # The same records, as JSON lines beside the state: one per 10 steps, held-out every 10.
        records = [
            json.loads(x)
            for x in (tmp_path / "state" / f"{role}.log.jsonl").read_text().splitlines()
        ]
        assert [r["step"] for r in records] == list(range(10, steps + 1, 10))
        assert all(r["heldout_bpb"] is not None for r in records)
        seq = train.SCHEDULES["tiny"][role]
        assert records[-1]["bytes_seen"] == steps * seq.batch_size * seq.seq_len
        assert records[-1]["heldout_bpb"] < records[0]["heldout_bpb"]
    train_bits = [
        float(x)
        for x in re.findall(r"\[target\] step \d+/\d+ \| [\d.]+M bytes \| train ([\d.]+)", out)
    ]
    assert train_bits[-1] < 0.75 * UNIFORM_BITS
    curve = next(
        (tmp_path / "out").glob("loss_curve.*")
    )  # a PNG with matplotlib, a text chart without
    assert curve.stat().st_size > 0


RESUME_SCHEDULES = {
    "tiny": {
        "target": Schedule(steps=12, batch_size=2, seq_len=32, lr=3e-3, warmup=3, save_every=5),
        "draft": Schedule(
            steps=8, batch_size=2, seq_len=32, lr=3e-3, warmup=3, distill_weight=0.8, save_every=5
        ),
    },
}


@pytest.mark.parametrize("role, cut_at, saved_at", [("target", 7, 5), ("draft", 6, 5)])
def test_resumed_run_continues_from_the_saved_step_and_ends_bit_identical(
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture,
    tmp_path: Path,
    role: str,
    cut_at: int,
    saved_at: int,
) -> None:
    """Batches are a function of (seed, step) and the state holds the AdamW moments, so an
    interrupted-then-resumed run must end with the very same bits as an uninterrupted one."""
    corpus = synthetic_corpus()
    monkeypatch.setattr(train, "SCHEDULES", RESUME_SCHEDULES)
    real_get_batch = train.get_batch
    calls: list[int] = []  # the step of every batch drawn, target's then draft's
    target_steps, draft_steps = (
        RESUME_SCHEDULES["tiny"]["target"].steps,
        RESUME_SCHEDULES["tiny"]["draft"].steps,
    )
    cut_call = cut_at + (target_steps if role == "draft" else 0)

    def recording_get_batch(*args, interrupt: bool = False, **kwargs):
        if interrupt and len(calls) == cut_call:
            raise KeyboardInterrupt  # as Ctrl-C would, mid-run
        calls.append(args[-1])
        return real_get_batch(*args, **kwargs)

    # The reference: one uninterrupted run of both models.
    monkeypatch.setattr(train, "get_batch", recording_get_batch)
    assert run_train(monkeypatch, corpus, tmp_path / "whole") == 0
    assert calls == [*range(target_steps), *range(draft_steps)]

    # The same run, interrupted after the save at step `saved_at`.
    calls.clear()
    monkeypatch.setattr(
        train, "get_batch", lambda *a, **k: recording_get_batch(*a, interrupt=True, **k)
    )
    assert run_train(monkeypatch, corpus, tmp_path / "cut") == 130
    assert read_checkpoint(tmp_path / "cut" / "state" / f"{role}.state.safetensors")[1][
        "step"
    ] == str(saved_at)
    assert not (tmp_path / "cut" / "out" / f"{role}.safetensors").exists()
    # A target from some other run sits in the output folder, under a name this run listed as its
    # own when it started (model/folders.py): resuming must finish and use this run's target, not
    # adopt that one.
    torch.manual_seed(99)
    save_checkpoint(tmp_path / "cut" / "out" / "target.safetensors", GPT(PRESETS["tiny"]["target"]))

    calls.clear()
    capsys.readouterr()
    monkeypatch.setattr(train, "get_batch", recording_get_batch)
    assert run_train(monkeypatch, corpus, tmp_path / "cut", "--resume") == 0
    assert f"[{role}] resuming from step {saved_at}" in capsys.readouterr().out
    if role == "target":
        assert calls == [*range(saved_at, target_steps), *range(draft_steps)]
    else:
        assert calls == list(
            range(saved_at, draft_steps)
        )  # the finished target is only re-exported

    for name in (
        "out/target.safetensors",
        "out/draft.safetensors",
        "state/target.state.safetensors",
        "state/draft.state.safetensors",
    ):
        whole, whole_meta = read_checkpoint(tmp_path / "whole" / name)
        cut, cut_meta = read_checkpoint(tmp_path / "cut" / name)
        assert whole.keys() == cut.keys()
        assert all(torch.equal(whole[k], cut[k]) for k in whole), name  # weights and AdamW moments
        for key in ("step", "heldout_bpb"):
            assert whole_meta.get(key) == cut_meta.get(key), (name, key)


@pytest.mark.parametrize("change", [["--seed", "5"], "corpus"])
def test_resume_refuses_the_state_of_another_run(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, change: list[str] | str
) -> None:
    corpus = synthetic_corpus()
    monkeypatch.setattr(train, "SCHEDULES", RESUME_SCHEDULES)
    assert run_train(monkeypatch, corpus, tmp_path, "--only", "target") == 0
    extra = change if isinstance(change, list) else []
    if change == "corpus":
        corpus = Corpus(
            corpus.train, corpus.held_out, fingerprint="another", num_files=corpus.num_files
        )
    with pytest.raises(
        ValueError, match="--resume: .*target.state.safetensors is from another run"
    ):
        run_train(monkeypatch, corpus, tmp_path, "--only", "target", "--resume", *extra)


def test_copy_rows_repeat_a_span_after_a_blank_line_and_leave_plain_rows_alone() -> None:
    data = synthetic_corpus().train
    seq_len, rows = 512, 64
    plain_x, plain_y = train.get_batch(data, rows, seq_len, seed=3, step=7)
    x, y = train.get_batch(data, rows, seq_len, seed=3, step=7, copy_fraction=0.5)
    assert torch.equal(x[:, 1:], y[:, :-1])  # still next-token pairs
    plain, copies = torch.cat([plain_x, plain_y[:, -1:]], 1), torch.cat([x, y[:, -1:]], 1)
    copied = 0
    for before, row in zip(plain, copies):
        if torch.equal(row, before):
            continue
        copied += 1
        # The row is the window's first n bytes, a blank line, then the window, for some n.
        assert any(
            row[n : n + 2].tolist() == [10, 10]
            and torch.equal(row[:n], before[:n])
            and torch.equal(row[n + 2 :], before[: seq_len - n - 1])
            for n in range(*train.COPY_SPAN)
        )
    # Binomial(64, 1/2): outside [16, 48] with probability below 1e-4 (and the seed is fixed).
    assert 16 <= copied <= 48
    every = train.get_batch(data, rows, seq_len, seed=3, step=7, copy_fraction=1.0)[0]
    assert not (every == plain_x).all(1).any()


def test_init_from_starts_the_model_from_the_checkpoint(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setattr(train, "SCHEDULES", RESUME_SCHEDULES)
    torch.manual_seed(11)
    start = GPT(PRESETS["tiny"]["target"])
    save_checkpoint(tmp_path / "start.safetensors", start, {"role": "target"})
    # A rate of 1e-9 keeps the weights where they began, so they show where that was.
    flags = ["--only", "target", "--lr", "1e-9", "--init-from", str(tmp_path / "start.safetensors")]
    assert run_train(monkeypatch, synthetic_corpus(), tmp_path, *flags) == 0
    tuned, meta = load_checkpoint(tmp_path / "out" / "target.safetensors")
    assert meta["init_from"] == str(tmp_path / "start.safetensors")
    for name, weight in start.state_dict().items():
        torch.testing.assert_close(tuned.state_dict()[name], weight, atol=1e-6, rtol=0)


def test_init_from_refuses_a_model_of_another_shape(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    save_checkpoint(tmp_path / "draft.safetensors", GPT(PRESETS["tiny"]["draft"]))
    flags = ["--only", "target", "--init-from", str(tmp_path / "draft.safetensors")]
    with pytest.raises(ValueError, match="--init-from .*draft.safetensors: its model .* is not"):
        run_train(monkeypatch, synthetic_corpus(), tmp_path, *flags)
    with pytest.raises(ValueError, match="--init-from starts one model: say which with --only"):
        run_train(monkeypatch, synthetic_corpus(), tmp_path, *flags[2:])
    with pytest.raises(ValueError, match="--init-from nowhere.safetensors: no such file"):
        run_train(monkeypatch, synthetic_corpus(), tmp_path, *flags[:3], "nowhere.safetensors")
    with pytest.raises(SystemExit) as exit_info:
        run_train(monkeypatch, synthetic_corpus(), tmp_path, "--copy-fraction", "1.5")
    assert exit_info.value.code == 2
