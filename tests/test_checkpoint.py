"""Safetensors checkpoints: bit-exact round trips, one clear error per bad file, atomic writes."""

from __future__ import annotations

import builtins
import json
import math
import os
import random
import struct
import subprocess
import warnings
from pathlib import Path

import pytest
import torch
from safetensors.torch import save as save_bytes

from model import checkpoint, storage
from model.checkpoint import (
    CheckpointError,
    load_checkpoint,
    load_pair,
    read_checkpoint,
    save_checkpoint,
    tensor_digest,
)
from model.gpt import GPT, GPTConfig

SMALL = GPTConfig(n_layer=2, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=32)


def make_model(config: GPTConfig = SMALL, seed: int = 0) -> GPT:
    torch.manual_seed(seed)
    return GPT(config).eval()


@pytest.fixture
def saved(tmp_path: Path) -> Path:
    path = tmp_path / "model.safetensors"
    save_checkpoint(path, make_model(), {"role": "target", "seed": 7})
    return path


def rewrite(path: Path, tensors: dict[str, torch.Tensor], meta: dict[str, str]) -> None:
    """Write a well-formed file whose checksum matches, so only the intended defect is present."""
    path.write_bytes(save_bytes(tensors, metadata={**meta, "sha256": tensor_digest(tensors)}))


def expect_error(path: Path, *fragments: str) -> str:
    with pytest.raises(CheckpointError) as info:
        load_checkpoint(path)
    message = str(info.value)
    assert str(path) in message, message
    for fragment in fragments:
        assert fragment in message, message
    return message


# ---- round trips --------------------------------------------------------------------------------


def test_float32_round_trip_is_bit_exact(saved: Path) -> None:
    original = make_model()
    loaded, meta = load_checkpoint(saved)
    assert loaded.config == original.config
    for (name, a), (_, b) in zip(original.state_dict().items(), loaded.state_dict().items()):
        assert a.dtype == b.dtype == torch.float32 and torch.equal(a, b), name
    assert loaded.lm_head.weight is loaded.embed.weight  # re-tied, not two copies
    assert not loaded.training
    tokens = torch.randint(0, SMALL.vocab_size, (2, 12), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        assert torch.equal(original(tokens), loaded(tokens))
    assert meta["role"] == "target" and meta["seed"] == "7"  # metadata values are stored as strings
    assert GPTConfig.from_json(meta["config"]) == SMALL
    assert json.loads(meta["tokenizer"])["vocab_size"] == SMALL.vocab_size


def test_float16_export_round_trip_is_bit_exact(tmp_path: Path) -> None:
    original, path = make_model(), tmp_path / "half.safetensors"
    save_checkpoint(path, original, dtype=torch.float16)
    tensors, _ = read_checkpoint(path)
    assert {t.dtype for t in tensors.values()} == {torch.float16}
    assert "lm_head.weight" not in tensors  # the tied matrix is stored once
    as_half, _ = load_checkpoint(path, dtype=torch.float16)
    as_float, _ = load_checkpoint(path)  # the default upcasts the stored halves, exactly
    for name, w in original.state_dict().items():
        assert torch.equal(as_half.state_dict()[name], w.half()), name
        assert torch.equal(as_float.state_dict()[name], w.half().float()), name


def test_saving_keeps_out_the_cache_and_the_compile_wrapper(tmp_path: Path) -> None:
    model = make_model()
    model.setup_cache(3)  # non-persistent buffers: not part of the checkpoint
    save_checkpoint(
        tmp_path / "a.safetensors", torch.compile(model)
    )  # wrapper keys are `_orig_mod.*`
    loaded, _ = load_checkpoint(tmp_path / "a.safetensors")
    assert all(
        torch.equal(a, b) for a, b in zip(model.state_dict().values(), loaded.state_dict().values())
    )


def test_extra_tensors_are_stored_but_not_loaded_as_weights(tmp_path: Path) -> None:
    model, path = make_model(), tmp_path / "state.safetensors"
    key = checkpoint.OPTIMIZER_PREFIX + "exp_avg.embed.weight"
    save_checkpoint(path, model, {"step": 5}, extra={key: torch.ones(3)})
    tensors, meta = read_checkpoint(path)
    assert torch.equal(tensors[key], torch.ones(3)) and meta["step"] == "5"
    load_checkpoint(path)  # no "unexpected key" complaint about optimizer state


# ---- one clear error per kind of bad file -------------------------------------------------------


def test_missing_file(tmp_path: Path) -> None:
    expect_error(tmp_path / "nope.safetensors", "not found")


@pytest.mark.parametrize(
    "content",
    [
        random.Random(0).randbytes(4096),
        b"def f(x):\n    return x\n" * 20,
        b"",
        b"{}",
    ],
)
def test_not_safetensors(tmp_path: Path, content: bytes) -> None:
    path = tmp_path / "model.safetensors"
    path.write_bytes(content)
    expect_error(path, "not a safetensors file")


def test_safetensors_but_not_a_minispec_checkpoint(tmp_path: Path) -> None:
    path = tmp_path / "other.safetensors"
    path.write_bytes(save_bytes({"w": torch.zeros(2)}))
    expect_error(path, "not a minispec checkpoint")


@pytest.mark.parametrize(
    "keep", [0.5, 0.999, 0.02]
)  # cut in the tensor data, at its very end, in the header
def test_truncated_file(saved: Path, keep: float) -> None:
    data = saved.read_bytes()
    saved.write_bytes(data[: int(len(data) * keep)])
    expect_error(saved, "truncated")


def test_flipped_byte_in_tensor_data_fails_the_checksum(saved: Path) -> None:
    data = bytearray(saved.read_bytes())
    data[-100] ^= 0x01  # one bit of one weight: still a valid float, so only the checksum can tell
    saved.write_bytes(bytes(data))
    expect_error(saved, "corrupt", "checksum")


def test_missing_keys(saved: Path) -> None:
    tensors, meta = read_checkpoint(saved)
    del tensors["blocks.1.mlp.up.weight"]
    rewrite(saved, tensors, meta)
    expect_error(saved, "missing keys ['blocks.1.mlp.up.weight']", "unexpected keys []")


def test_unexpected_keys(saved: Path) -> None:
    tensors, meta = read_checkpoint(saved)
    tensors["blocks.2.attn.wo.weight"] = torch.zeros(32, 32)
    rewrite(saved, tensors, meta)
    expect_error(saved, "missing keys []", "unexpected keys ['blocks.2.attn.wo.weight']")


def test_shape_mismatch(saved: Path) -> None:
    tensors, meta = read_checkpoint(saved)
    tensors["blocks.0.mlp.up.weight"] = torch.zeros(96, 32)
    rewrite(saved, tensors, meta)
    expect_error(saved, "shape mismatch for blocks.0.mlp.up.weight", "(96, 32)", "(64, 32)")


@pytest.mark.parametrize(
    "config",
    [
        "{not json",
        "",
        "[2, 2, 32]",
        '{"n_layer": 2, "no_such_field": 1}',
        '{"n_layer": "two"}',
        '{"n_layer": true}',
        '{"d_model": 30, "n_head": 4}',
        '{"rope_theta": "fast"}',
        '{"norm_eps": -1e-5}',
    ],
)
def test_config_that_does_not_parse(saved: Path, config: str) -> None:
    tensors, meta = read_checkpoint(saved)
    rewrite(saved, tensors, {**meta, "config": config})
    expect_error(saved, "model config does not parse")


def test_every_checkpoint_error_is_a_value_error() -> None:
    assert issubclass(CheckpointError, ValueError)


# ---- pairs --------------------------------------------------------------------------------------


def test_load_pair(tmp_path: Path) -> None:
    draft_config = GPTConfig(n_layer=1, n_head=2, d_model=16, mlp_hidden=32, max_seq_len=32)
    save_checkpoint(tmp_path / "t.safetensors", make_model())
    save_checkpoint(tmp_path / "d.safetensors", make_model(draft_config))
    target, draft = load_pair(tmp_path / "t.safetensors", tmp_path / "d.safetensors")
    assert (target.config, draft.config) == (SMALL, draft_config)


def test_load_pair_of_a_draft_and_its_target_gives_no_warning(tmp_path: Path) -> None:
    save_checkpoint(tmp_path / "t.safetensors", make_model(), {"role": "target"})
    save_checkpoint(tmp_path / "d.safetensors", make_model(seed=1), {"role": "draft"})
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        load_pair(tmp_path / "t.safetensors", tmp_path / "d.safetensors")


@pytest.mark.parametrize("why", ["sizes", "roles"])
def test_a_swapped_pair_gets_a_warning(tmp_path: Path, why: str) -> None:
    """Swapped files decode exactly but slower than no speculation (c > 1): say so."""
    big = GPTConfig(n_layer=3, n_head=2, d_model=32, mlp_hidden=64, max_seq_len=32)
    target_role, draft_role = ("target", "draft") if why == "sizes" else ("draft", "target")
    save_checkpoint(tmp_path / "t.safetensors", make_model(), {"role": target_role})
    save_checkpoint(
        tmp_path / "d.safetensors",
        make_model(big if why == "sizes" else SMALL),
        {"role": draft_role},
    )
    with pytest.warns(UserWarning, match=r"d\.safetensors .* like a target .* are they swapped\?"):
        load_pair(tmp_path / "t.safetensors", tmp_path / "d.safetensors")


# ---- crafted files: each one clear error (issue 13) ---------------------------------------------


def test_deeply_nested_header_json(tmp_path: Path) -> None:
    header = b'{"a": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    path = tmp_path / "nested.safetensors"
    path.write_bytes(struct.pack("<Q", len(header)) + header)
    expect_error(path, "not a safetensors file", "nests too deeply")


def test_deeply_nested_config_json(saved: Path) -> None:
    tensors, meta = read_checkpoint(saved)
    rewrite(saved, tensors, {**meta, "config": "[" * 100_000 + "]" * 100_000})
    expect_error(saved, "model config does not parse", "nested too deeply")


@pytest.mark.parametrize("key", ["tokenizer", "config"])
def test_metadata_without_a_required_key(saved: Path, key: str) -> None:
    tensors, meta = read_checkpoint(saved)
    del meta[key]
    rewrite(saved, tensors, meta)
    expect_error(saved, f"incomplete metadata (no {key})")


@pytest.mark.parametrize(
    "field, value", [("vocab_size", 10**12), ("max_seq_len", 10**12), ("n_layer", 10**9)]
)
def test_huge_config_fails_before_allocating(saved: Path, field: str, value: int) -> None:
    tensors, meta = read_checkpoint(saved)
    config = {**json.loads(meta["config"]), field: value}
    rewrite(saved, tensors, {**meta, "config": json.dumps(config)})
    expect_error(saved, "model config does not parse", f"GPTConfig.{field} must be at most")


def test_large_config_that_the_file_contradicts_fails_before_allocating(saved: Path) -> None:
    """Within the limits, but 40 GB of weights for a file of kilobytes: the shapes tell, on the
    meta device, before anything is allocated (a real allocation would fail or take minutes)."""
    tensors, meta = read_checkpoint(saved)
    config = {**json.loads(meta["config"]), "d_model": 65536, "mlp_hidden": 65536, "n_head": 2}
    rewrite(saved, tensors, {**meta, "config": json.dumps(config)})
    expect_error(saved, "shape mismatch for embed.weight", "(258, 32)", "(258, 65536)")


@pytest.mark.parametrize("value", [math.nan, math.inf, -math.inf])
def test_non_finite_weights_are_refused_by_name(saved: Path, value: float) -> None:
    tensors, meta = read_checkpoint(saved)
    tensors["blocks.1.attn.wo.weight"][3, 5] = value
    rewrite(saved, tensors, meta)
    expect_error(saved, "tensor blocks.1.attn.wo.weight has NaN or inf")


def test_weights_that_overflow_the_load_dtype_are_refused_by_name(saved: Path) -> None:
    tensors, meta = read_checkpoint(saved)
    tensors["norm.weight"][0] = 1e6  # finite in float32, inf in float16
    rewrite(saved, tensors, meta)
    load_checkpoint(saved)  # float32 is fine
    with pytest.raises(
        CheckpointError, match=r"tensor norm\.weight has values beyond torch\.float16's range"
    ):
        load_checkpoint(saved, dtype=torch.float16)


def test_checkpoint_for_another_tokenizer(saved: Path) -> None:
    tensors, meta = read_checkpoint(saved)
    bpe = {"kind": "bpe", "vocab_size": 258, "bos": 256, "eos": 257}
    rewrite(saved, tensors, {**meta, "tokenizer": json.dumps(bpe)})
    expect_error(saved, "made for tokenizer 'bpe'", "minispec's tokenizer is 'bytes'")


SWAPPED_SPECIALS = json.dumps({"kind": "bytes", "vocab_size": 258, "bos": 257, "eos": 256})


@pytest.mark.parametrize("tokenizer", ["{oops", "[1, 2]", SWAPPED_SPECIALS])
def test_checkpoint_with_a_bad_tokenizer_record(saved: Path, tokenizer: str) -> None:
    tensors, meta = read_checkpoint(saved)
    rewrite(saved, tensors, {**meta, "tokenizer": tokenizer})
    expect_error(saved, "tokenizer")


@pytest.mark.parametrize("vocab_size", [300, 200])
def test_vocabulary_that_is_not_the_tokenizers(tmp_path: Path, vocab_size: int) -> None:
    """A consistent pair with 300 ids would have ids 258-299 dropped from the text; one with 200
    could not even read the tokenizer's BOS (256). Both fail at load, naming the file."""
    config = GPTConfig(
        vocab_size=vocab_size, n_layer=1, n_head=2, d_model=16, mlp_hidden=32, max_seq_len=32
    )
    for role in ("target", "draft"):
        save_checkpoint(tmp_path / f"{role}.safetensors", make_model(config))
    with pytest.raises(
        CheckpointError,
        match=rf"target\.safetensors: vocab_size {vocab_size} does "
        r"not match the bytes tokenizer's 258 ids",
    ):
        load_pair(tmp_path / "target.safetensors", tmp_path / "draft.safetensors")


# ---- atomic writes ------------------------------------------------------------------------------


def interrupt(*args, **kwargs):
    raise KeyboardInterrupt  # what Ctrl-C raises: a BaseException, not an Exception


@pytest.mark.parametrize(
    "where", ["fsync", "replace"]
)  # after the bytes are written / at the rename
def test_interrupted_save_keeps_the_previous_checkpoint(
    saved: Path, monkeypatch: pytest.MonkeyPatch, where: str
) -> None:
    before = saved.read_bytes()
    monkeypatch.setattr(storage.os, where, interrupt)
    with pytest.raises(KeyboardInterrupt):
        save_checkpoint(saved, make_model(seed=1), {"role": "newer"})
    monkeypatch.undo()
    assert saved.read_bytes() == before
    assert os.listdir(saved.parent) == [saved.name]  # no temporary file left behind
    assert load_checkpoint(saved)[1]["role"] == "target"


def test_interrupted_first_save_leaves_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real_open = builtins.open

    class HalfWriter:
        """A file that takes half the bytes, then fails: a write cut short by a full disk."""

        def __init__(self, f):
            self.f = f

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.f.close()

        def write(self, data):
            self.f.write(data[: len(data) // 2])
            raise OSError(28, "No space left on device")

    monkeypatch.setattr(
        storage, "open", lambda path, mode: HalfWriter(real_open(path, mode)), raising=False
    )
    with pytest.raises(OSError, match="No space left"):
        save_checkpoint(tmp_path / "m.safetensors", make_model())
    assert os.listdir(tmp_path) == []


def test_stale_temporaries_are_removed_by_the_next_save(saved: Path) -> None:
    """A kill mid-save skips the clean-up and leaves `.X.tmp-<pid>` behind; the next save in the
    folder removes it, but not the temporary of a process that is still writing."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = saved.parent / f".{saved.name}.tmp-{dead.pid}"
    live = saved.parent / f".other.safetensors.tmp-{os.getppid()}"
    unrelated = saved.parent / ".notes.tmp-x"
    for path in (stale, live, unrelated):
        path.write_bytes(b"partial")
    save_checkpoint(saved.parent / "next.safetensors", make_model())
    assert not stale.exists() and live.exists() and unrelated.exists()
    assert storage.remove_stale_temporaries(saved.parent) == []
