"""Safetensors checkpoints: weights plus the metadata needed to trust and reproduce them.

A checkpoint is one .safetensors file. Its header metadata (string -> string) holds the model
config as JSON, the tokenizer, how it was trained, and a SHA-256 of the tensor bytes, so that
every way a file can be wrong is reported as one clear `CheckpointError` instead of a crash or,
worse, a silently different model. Writes are atomic: a temporary file, fsync, then rename.
"""

from __future__ import annotations

import hashlib
import json
import struct
import warnings
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load as load_bytes
from safetensors.torch import save as save_bytes

from model import tokenizer
from model.errors import CheckpointError, listed
from model.gpt import GPT, GPTConfig
from model.head import FeatureHead, HeadConfig
from model.hf import load_hf_folder
from model.storage import (
    FORMAT,
    HEAD_FORMAT,
    TIED_KEY,
    atomic_write,
    cast_finite,
    config_shapes,
)

# Keys of the trainer's optimizer state, which a resumable checkpoint carries beside the
# weights (save_checkpoint's `extra`); loading a model skips them.
OPTIMIZER_PREFIX = "optim."


def tensor_digest(tensors: dict[str, torch.Tensor]) -> str:
    h = hashlib.sha256()
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def save_checkpoint(
    path: str | Path,
    model: GPT,
    metadata: dict[str, str] | None = None,
    dtype: torch.dtype | None = None,
    extra: dict[str, torch.Tensor] | None = None,
) -> None:
    """Save `model` (optionally cast to `dtype`, e.g. float16 to halve the file) with metadata.

    `extra` adds tensors under their own names (the trainer stores optimizer state this way).
    """
    # A torch.compile wrapper's keys carry an `_orig_mod.` prefix that would make the file
    # unloadable: save the module it wraps.
    model = getattr(model, "_orig_mod", model)
    tied = model.config.tie_embeddings
    tensors = {
        k: (v.to(dtype) if dtype is not None else v).detach().cpu().contiguous()
        for k, v in model.state_dict().items()
        if not (tied and k == TIED_KEY)
    }
    tensors.update({k: v.detach().cpu().contiguous() for k, v in (extra or {}).items()})
    write_checkpoint(path, tensors, metadata, FORMAT, model.config.to_json())


def write_checkpoint(
    path: str | Path,
    tensors: dict[str, torch.Tensor],
    metadata: dict[str, str] | None,
    format: str,
    config: str,
) -> None:
    """Write `tensors` atomically with `metadata` and what every checkpoint's header holds:
    its format, config (JSON), tokenizer and the tensors' SHA-256."""
    meta = {str(k): str(v) for k, v in (metadata or {}).items()}
    meta.update(
        format=format,
        config=config,
        tokenizer=json.dumps(tokenizer.describe()),
        sha256=tensor_digest(tensors),
    )
    atomic_write(Path(path), save_bytes(tensors, metadata=meta))


def read_checkpoint(
    path: str | Path, expected_format: str = FORMAT
) -> tuple[dict[str, torch.Tensor], dict[str, str]]:
    """Tensors and metadata of a checkpoint file, after checking it is whole and untampered."""
    path = Path(path)
    if not path.is_file():
        raise CheckpointError(f"checkpoint not found: {path}")
    data = path.read_bytes()
    try:
        tensors = load_bytes(data)
    except (SafetensorError, ValueError, RuntimeError) as exc:
        raise unreadable(path, data, exc) from None
    # The safetensors layout: an 8-byte little-endian header size, a JSON header, then the
    # data. load_bytes has read the header already, and found it whole.
    (header_size,) = struct.unpack("<Q", data[:8])
    meta = json.loads(data[8 : 8 + header_size]).get("__metadata__") or {}
    if meta.get("format") != expected_format:
        raise CheckpointError(
            f"{path}: not a minispec checkpoint (format {meta.get('format')!r}, "
            f"expected {expected_format!r})"
        )
    if meta.get("sha256") != tensor_digest(tensors):
        raise CheckpointError(f"{path}: corrupt checkpoint (tensor checksum mismatch)")
    missing = [key for key in ("config", "tokenizer") if key not in meta]
    if missing:
        raise CheckpointError(f"{path}: incomplete metadata (no {' or '.join(missing)})")
    return tensors, meta


def unreadable(path: Path, data: bytes, exc: Exception) -> CheckpointError:
    """Why safetensors could not read the bytes of `path` (raising `exc`), in one line."""
    try:
        (header_size,) = struct.unpack("<Q", data[:8])
        header = json.loads(data[8 : 8 + header_size])
    except RecursionError:  # JSON nested thousands deep: no header we wrote; json.loads gives up
        return CheckpointError(f"{path}: not a safetensors file (its header nests too deeply)")
    except (struct.error, ValueError, UnicodeDecodeError):
        # A header that starts like one ('{') but runs past the end of the file was cut short,
        # e.g. by an interrupted copy: say so rather than "not safetensors".
        if data[8:9] == b"{" and len(data) < 8 + header_size:
            return CheckpointError(
                f"{path}: truncated safetensors file ({len(data)} bytes, but its header "
                f"alone needs {8 + header_size})"
            )
        return CheckpointError(f"{path}: not a safetensors file")
    if not isinstance(header, dict):
        return CheckpointError(f"{path}: not a safetensors file")
    return CheckpointError(f"{path}: truncated or corrupt safetensors file ({exc})")


def check_tokenizer(path: Path, meta: dict[str, str], config: GPTConfig) -> None:
    """The checkpoint must be for the tokenizer minispec encodes and decodes with, and its
    vocabulary must be that tokenizer's: with more ids the extra ones would be dropped from the
    text without a word, with fewer the tokenizer's own ids would be out of range."""
    expected = tokenizer.describe()
    try:
        recorded = json.loads(meta["tokenizer"])
    except (ValueError, RecursionError):
        raise CheckpointError(f"{path}: tokenizer metadata does not parse") from None
    kind = recorded.get("kind") if isinstance(recorded, dict) else None
    if kind != expected["kind"]:
        raise CheckpointError(
            f"{path}: made for tokenizer {kind!r}, but minispec's tokenizer is {expected['kind']!r}"
        )
    if recorded != expected:
        raise CheckpointError(f"{path}: tokenizer {recorded} differs from minispec's {expected}")
    if config.vocab_size != expected["vocab_size"]:
        raise CheckpointError(
            f"{path}: vocab_size {config.vocab_size} does not match the "
            f"{expected['kind']} tokenizer's {expected['vocab_size']} ids"
        )


def load_checkpoint(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[GPT, dict[str, str]]:
    """Build the model a checkpoint describes and load its weights (cast to `dtype`).

    `path` is a minispec .safetensors file, or a Hugging Face Llama folder (with config.json).
    """
    if Path(path).is_dir():
        return load_hf_folder(path, device, dtype)
    tensors, meta = read_checkpoint(path)
    try:
        config = GPTConfig.from_json(meta.get("config", ""))
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    check_tokenizer(Path(path), meta, config)
    tied = config.tie_embeddings
    expected = {k: v for k, v in config_shapes(config).items() if not (tied and k == TIED_KEY)}
    weights = {k: v for k, v in tensors.items() if not k.startswith(OPTIMIZER_PREFIX)}
    missing, unexpected = (
        sorted(expected.keys() - weights.keys()),
        sorted(weights.keys() - expected.keys()),
    )
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: missing keys {listed(missing)}, unexpected keys {listed(unexpected)}"
        )
    for k, shape in expected.items():
        if weights[k].shape != shape:
            raise CheckpointError(
                f"{path}: shape mismatch for {k}: file has {tuple(weights[k].shape)}, "
                f"config expects {tuple(shape)}"
            )
    if tied:
        weights[TIED_KEY] = weights["embed.weight"]
    model = GPT(config, init_weights=False)  # every parameter is loaded next (strict)
    model.load_state_dict(cast_finite(path, weights, dtype))
    return model.to(device=device, dtype=dtype).eval(), meta


def tokenizer_name(meta: dict[str, str]) -> str:
    """A checkpoint's tokenizer in a few words: its kind, and a folder tokenizer's digest."""
    try:
        recorded = json.loads(meta["tokenizer"])
        return " ".join(str(recorded[k])[:12] for k in ("kind", "sha256") if k in recorded)
    except (KeyError, TypeError, ValueError):
        return "unknown"


def check_same_vocabulary(target: tuple, draft: tuple) -> None:
    """A draft pairs with a target only when both have the same token ids for the same text.
    Each argument: (path, model, metadata)."""
    (target_path, target_model, target_meta), (draft_path, draft_model, draft_meta) = target, draft
    sizes = (draft_model.config.vocab_size, target_model.config.vocab_size)
    if sizes[0] != sizes[1]:
        raise CheckpointError(
            f"draft {draft_path} and target {target_path} have different vocabularies "
            f"({sizes[0]} vs {sizes[1]} tokens)"
        )
    if target_meta["tokenizer"] != draft_meta["tokenizer"]:
        raise CheckpointError(
            f"draft {draft_path} and target {target_path} have different tokenizers "
            f"({tokenizer_name(draft_meta)} vs {tokenizer_name(target_meta)}), though both "
            f"have {sizes[0]} tokens"
        )


def load_pair(
    target_path: str | Path,
    draft_path: str | Path,
    device: str | torch.device = "cpu",
    dtype: torch.dtype = torch.float32,
) -> tuple[GPT, GPT]:
    """The target and draft models; they must share a tokenizer and vocabulary to be paired."""
    target, target_meta = load_checkpoint(target_path, device, dtype)
    draft, draft_meta = load_checkpoint(draft_path, device, dtype)
    check_same_vocabulary((target_path, target, target_meta), (draft_path, draft, draft_meta))
    # Swapped files still decode exactly, only slower than no speculation at all (c > 1).
    roles = (target_meta.get("role"), draft_meta.get("role"))
    if draft.num_params() > target.num_params() or roles == ("draft", "target"):
        warnings.warn(
            f"the draft {draft_path} (role {roles[1]!r}, {draft.num_params():,} "
            f"parameters) looks like a target and the target {target_path} (role "
            f"{roles[0]!r}, {target.num_params():,} parameters) like a draft: "
            f"are they swapped?",
            stacklevel=2,
        )
    return target, draft


def save_head(path: str | Path, head: FeatureHead, metadata: dict[str, str] | None = None) -> None:
    """Save a feature head in float16 (its own weights: the target's embedding and LM head are
    the target's), atomically, with its config and a checksum."""
    tensors = {k: v.detach().cpu().half().contiguous() for k, v in head.state_dict().items()}
    write_checkpoint(path, tensors, metadata, HEAD_FORMAT, head.config.to_json())


def load_head(
    path: str | Path, target: GPT, device: str | torch.device = "cpu"
) -> tuple[FeatureHead, dict[str, str]]:
    """A feature head for `target`: its width must be the target's, its vocabulary the
    target's."""
    tensors, meta = read_checkpoint(path, HEAD_FORMAT)
    try:
        config = HeadConfig.from_json(meta["config"])
    except ValueError as exc:
        raise CheckpointError(f"{path}: {exc}") from None
    if config.target_width != target.config.d_model:
        raise CheckpointError(
            f"{path}: a head for a target of width {config.target_width}, not "
            f"{target.config.d_model}"
        )
    head = FeatureHead(config, target.config.vocab_size)
    expected = {k: v.shape for k, v in head.state_dict().items()}
    if expected.keys() != tensors.keys() or any(
        tensors[k].shape != shape for k, shape in expected.items()
    ):
        raise CheckpointError(f"{path}: its tensors do not match its config")
    head.load_state_dict(cast_finite(path, tensors, target.embed.weight.dtype))
    return head.to(device).eval(), meta
