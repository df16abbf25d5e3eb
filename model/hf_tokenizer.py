"""Tokenizers in Hugging Face folders: the byte tokenizer written as tokenizer files, a folder's
tokenizer read back, and the identity that load_pair compares.

The byte vocabulary is expressed with the tokenizers library (the optional `peer` extra) as a
byte-level BPE with no merges: the ByteLevel pre-tokenizer maps each UTF-8 byte b to one printable
character, whose id is b; BOS and EOS are special tokens 256 and 257, and a template puts BOS
first. transformers' AutoTokenizer, and so vLLM and SGLang, then encode text to exactly
model.tokenizer.encode's ids.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Protocol

from model import tokenizer
from model.errors import CheckpointError, read_json

SPECIAL_TOKENS = {tokenizer.BOS_TOKEN_ID: "<s>", tokenizer.EOS_TOKEN_ID: "</s>"}


class TextTokenizer(Protocol):
    def encode(self, text: str) -> list[int]: ...

    def decode(self, ids: list[int]) -> str: ...


def byte_to_char() -> dict[int, str]:
    """The ByteLevel pre-tokenizer's table (GPT-2's): bytes that print as themselves keep their
    code point; the others (control characters, space, a few Latin-1 ones) take 256, 257, ...
    in byte order, so every byte is one visible character."""
    printable = {*range(ord("!"), ord("~") + 1), *range(0xA1, 0xAD), *range(0xAE, 0x100)}
    others = iter(range(256, 512))
    return {b: chr(b) if b in printable else chr(next(others)) for b in range(256)}


def byte_tokenizer_files(model_max_length: int) -> dict[str, bytes]:
    """tokenizer.json, tokenizer_config.json and special_tokens_map.json for the byte tokenizer."""
    try:
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors
    except ImportError:
        raise ValueError(
            "writing tokenizer files needs the tokenizers package: pip install 'minispec[peer]'"
        ) from None
    vocab = {char: b for b, char in byte_to_char().items()}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    # use_regex=False: no splitting into words, so nothing (spaces included) is merged or moved.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(
        [AddedToken(SPECIAL_TOKENS[i], special=True) for i in sorted(SPECIAL_TOKENS)]
    )
    bos = SPECIAL_TOKENS[tokenizer.BOS_TOKEN_ID]
    tok.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A", pair=f"{bos} $A $B", special_tokens=[(bos, tokenizer.BOS_TOKEN_ID)]
    )
    names = {"bos_token": bos, "eos_token": SPECIAL_TOKENS[tokenizer.EOS_TOKEN_ID]}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **names,
        "pad_token": names["eos_token"],
        "model_max_length": model_max_length,
        # "<s>" typed in a prompt is three bytes, as model.tokenizer.encode makes it, not BOS.
        "split_special_tokens": True,
        "clean_up_tokenization_spaces": False,  # decode must give back the exact text
    }
    return {
        "tokenizer.json": tok.to_str().encode(),
        "tokenizer_config.json": json.dumps(config, indent=2).encode(),
        "special_tokens_map.json": json.dumps(names, indent=2).encode(),
    }


def _read_spec(folder: Path) -> dict | None:
    """tokenizer.json, or None where the folder has none; a CheckpointError naming the file
    where it is not a JSON object."""
    path = folder / "tokenizer.json"
    if not path.is_file():
        return None
    spec = read_json(path)
    if not isinstance(spec, dict):
        raise CheckpointError(f"{path}: not a tokenizer (a JSON {type(spec).__name__})")
    return spec


def part(spec: dict, key: str, kind: type) -> dict | list:
    """spec[key] where it is a `kind`, else an empty one: a malformed part is no byte tokenizer
    and has no ids, which the callers report."""
    value = spec.get(key)
    return value if isinstance(value, kind) else kind()


def vocabulary_size(spec: dict, path: Path) -> int:
    """One more than the highest id the tokenizer can give: its model's vocabulary (a dict of
    ids, or a list whose positions are the ids) and its added tokens."""
    vocab = part(spec, "model", dict).get("vocab")
    ids = list(vocab.values()) if isinstance(vocab, dict) else []
    if isinstance(vocab, list) and vocab:
        ids.append(len(vocab) - 1)
    ids += [t.get("id") for t in part(spec, "added_tokens", list) if isinstance(t, dict)]
    if not ids or not all(isinstance(i, int) and not isinstance(i, bool) and i >= 0 for i in ids):
        raise CheckpointError(f"{path}: no vocabulary of token ids >= 0")
    return max(ids) + 1


def check_vocabulary(folder: Path, vocab_size: int) -> None:
    """A folder's tokenizer must have the model's vocabulary, as a checkpoint's must
    (checkpoint.check_tokenizer): with fewer ids, the model's other ids would vanish from the
    text without a word; with more, the tokenizer's would be out of the model's range."""
    spec = _read_spec(folder)
    if spec is None:
        return
    size = vocabulary_size(spec, folder / "tokenizer.json")
    if size != vocab_size:
        raise CheckpointError(
            f"{folder / 'tokenizer.json'} has {size} token ids, but config.json's vocab_size "
            f"is {vocab_size}: they must be the same"
        )


def is_byte_tokenizer(spec: dict) -> bool:
    """Whether a tokenizer.json is the byte tokenizer (as byte_tokenizer_files writes it)."""
    model, pre = part(spec, "model", dict), part(spec, "pre_tokenizer", dict)
    added = {
        t.get("id"): t.get("content")
        for t in part(spec, "added_tokens", list)
        if isinstance(t, dict)
    }
    return (
        model.get("type") == "BPE"
        and not model.get("merges")
        and model.get("vocab") == {c: b for b, c in byte_to_char().items()}
        and pre.get("type") == "ByteLevel"
        and not pre.get("use_regex", True)
        and not pre.get("add_prefix_space", True)
        and added == SPECIAL_TOKENS
    )


def identity(folder: str | Path) -> str:
    """What load_pair compares: the byte tokenizer's description, as a minispec checkpoint
    records it (so an exported model pairs with a .safetensors one), or a digest of the
    folder's vocabulary and added tokens."""
    spec = _read_spec(Path(folder))
    if spec is None:
        return json.dumps({"kind": "none"})
    if is_byte_tokenizer(spec):
        return json.dumps(tokenizer.describe())
    vocab = json.dumps([spec.get("model"), spec.get("added_tokens")], sort_keys=True)
    return json.dumps({"kind": "hf", "sha256": hashlib.sha256(vocab.encode()).hexdigest()})


class FolderTokenizer:
    """A folder's own tokenizer.json, through the tokenizers library: encode adds what the
    folder's template adds (BOS for Llama), decode drops special tokens."""

    def __init__(self, folder: Path, spec: dict) -> None:
        try:
            from tokenizers import Tokenizer
        except ImportError:
            raise ValueError(
                f"{folder} has its own tokenizer, which needs the tokenizers "
                f"package: pip install 'minispec[peer]'"
            ) from None
        try:
            self.backend = Tokenizer.from_str(json.dumps(spec))
        except Exception as exc:  # the library raises a bare Exception for a spec it cannot read
            raise CheckpointError(f"{folder / 'tokenizer.json'}: not a tokenizer ({exc})") from None
        config_path = folder / "tokenizer_config.json"
        config = read_json(config_path) if config_path.is_file() else {}
        if not isinstance(config, dict):
            raise CheckpointError(f"{config_path} does not load (not a JSON object)")
        self.backend.encode_special_tokens = bool(config.get("split_special_tokens", False))

    def encode(self, text: str) -> list[int]:
        return self.backend.encode(text).ids

    def decode(self, ids: list[int]) -> str:
        return self.backend.decode(ids, skip_special_tokens=True)


def load_tokenizer(path: str | Path) -> TextTokenizer:
    """The tokenizer that goes with a checkpoint file or model folder: model.tokenizer for
    minispec checkpoints and exported folders, else the folder's tokenizer.json."""
    path = Path(path)
    spec = _read_spec(path) if path.is_dir() else None
    if spec is None:
        if path.is_dir():
            raise ValueError(f"{path} has no tokenizer.json to encode text with")
        return tokenizer
    return tokenizer if is_byte_tokenizer(spec) else FolderTokenizer(path, spec)
