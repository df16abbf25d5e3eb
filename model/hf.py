"""Hugging Face interop: a GPT as a `LlamaForCausalLM` folder, and such a folder as a GPT.

GPT is the Llama architecture (model/gpt.py), so converting renames tensors and splits the fused
`wqkv` by rows into q_proj, k_proj and v_proj. No row permutation is needed: both apply rotary
embeddings to the two halves of each head, as transformers' `rotate_half` does. A folder feature
that GPT does not implement is one `CheckpointError` naming it, never a silently different model.

Weights and configs need only safetensors; tokenizer files are model/hf_tokenizer.py's job.
Loading from a hub is out of scope: a folder is a local path.
"""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors import SafetensorError
from safetensors.torch import load_file
from safetensors.torch import save as save_bytes

from model import hf_tokenizer, tokenizer
from model.errors import CheckpointError, listed, read_json
from model.folders import replace_folder
from model.gpt import GPT, GPTConfig
from model.storage import TIED_KEY, cast_finite, config_shapes

FORMAT = "hf-llama"  # the "format" a loaded folder's metadata reports
ARCHITECTURE = "LlamaForCausalLM"
# Per layer, GPT's name -> the Hugging Face name; wqkv (one matrix for three) is apart.
LAYER_NAMES = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn.wo.weight": "self_attn.o_proj.weight",
    "mlp_norm.weight": "post_attention_layernorm.weight",
    "mlp.gate.weight": "mlp.gate_proj.weight",
    "mlp.up.weight": "mlp.up_proj.weight",
    "mlp.down.weight": "mlp.down_proj.weight",
}
# Every file an export can write: the leftovers of a killed export are these or nothing.
EXPORT_NAMES = {
    "config.json",
    "generation_config.json",
    "model.safetensors",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
}
# The sizes of a config.json, checked to be positive ints before any arithmetic on them.
SIZE_KEYS = (
    "vocab_size",
    "hidden_size",
    "intermediate_size",
    "num_hidden_layers",
    "num_attention_heads",
    "num_key_value_heads",
    "max_position_embeddings",
    "head_dim",
)
# Defaults of transformers' LlamaConfig, for keys a config.json leaves out.
HF_DEFAULTS = {
    "max_position_embeddings": 2048,
    "rms_norm_eps": 1e-6,
    "rope_theta": 10000.0,
    "tie_word_embeddings": False,
    "hidden_act": "silu",
}


def name_map(config: GPTConfig) -> dict[str, tuple[str, ...]]:
    """Each GPT tensor's Hugging Face name(s): wqkv is q_proj, k_proj, v_proj stacked by rows."""
    names = {"embed.weight": ("model.embed_tokens.weight",), "norm.weight": ("model.norm.weight",)}
    if not config.tie_embeddings:  # a tied head is the embedding: stored once, as transformers does
        names[TIED_KEY] = ("lm_head.weight",)
    for i in range(config.n_layer):
        ours, theirs = f"blocks.{i}.", f"model.layers.{i}."
        names[ours + "attn.wqkv.weight"] = tuple(
            f"{theirs}self_attn.{p}_proj.weight" for p in "qkv"
        )
        names.update({ours + a: (theirs + b,) for a, b in LAYER_NAMES.items()})
    return names


def hf_config(config: GPTConfig, dtype: torch.dtype, byte_vocab: bool = True) -> dict:
    """config.json for `config`. Special ids are the byte tokenizer's when `byte_vocab`."""
    special = (tokenizer.BOS_TOKEN_ID, tokenizer.EOS_TOKEN_ID) if byte_vocab else (None, None)
    return {
        "architectures": [ARCHITECTURE],
        "model_type": "llama",
        "vocab_size": config.vocab_size,
        "hidden_size": config.d_model,
        "intermediate_size": config.mlp_hidden,
        "num_hidden_layers": config.n_layer,
        "num_attention_heads": config.n_head,
        "num_key_value_heads": config.n_kv_head,
        "head_dim": config.head_dim,
        "hidden_act": "silu",
        "max_position_embeddings": config.max_seq_len,
        "rms_norm_eps": config.norm_eps,
        # The plain top-level form, which transformers 4 and 5 and vLLM all read.
        "rope_theta": config.rope_theta,
        "rope_scaling": None,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": config.tie_embeddings,
        "bos_token_id": special[0],
        "eos_token_id": special[1],
        "torch_dtype": str(dtype).removeprefix("torch."),
    }


def export_folder(
    model: GPT, out: str | Path, dtype: torch.dtype | None = None, with_tokenizer: bool = True
) -> None:
    """Write `model` as a Hugging Face Llama folder: config.json, generation_config.json,
    model.safetensors (cast to `dtype`, by default the model's) and, `with_tokenizer`, the byte
    tokenizer's files. The folder is replaced whole, never a mix of old and new files, and only
    when minispec wrote it (model/folders.py)."""
    model = getattr(model, "_orig_mod", model)  # a compiled wrapper's keys carry a prefix
    config = model.config
    if with_tokenizer and config.vocab_size != tokenizer.VOCAB_SIZE:
        raise ValueError(
            f"the byte tokenizer has {tokenizer.VOCAB_SIZE} tokens but the model "
            f"{config.vocab_size}: export it with_tokenizer=False"
        )
    dtype = dtype or model.embed.weight.dtype
    state = model.state_dict()
    split = model.blocks[0].attn.qkv_split
    tensors = {}
    for ours, theirs in name_map(config).items():
        tensors.update(zip(theirs, state[ours].split(split) if len(theirs) == 3 else [state[ours]]))
    tensors = {k: v.detach().to("cpu", dtype).contiguous() for k, v in tensors.items()}
    files = {"model.safetensors": save_bytes(tensors, metadata={"format": "pt"})}
    special = (
        {
            "bos_token_id": tokenizer.BOS_TOKEN_ID,
            "eos_token_id": tokenizer.EOS_TOKEN_ID,
            "pad_token_id": tokenizer.EOS_TOKEN_ID,
        }
        if with_tokenizer
        else {}
    )
    files["config.json"] = json.dumps(hf_config(config, dtype, with_tokenizer), indent=2).encode()
    files["generation_config.json"] = json.dumps(special, indent=2).encode()
    if with_tokenizer:
        files.update(hf_tokenizer.byte_tokenizer_files(config.max_seq_len))
    replace_folder(Path(out), files, EXPORT_NAMES)


def unsupported(path: Path, feature: str) -> CheckpointError:
    """The error for a folder feature that GPT does not implement."""
    return CheckpointError(
        f"{path}: unsupported Hugging Face feature: {feature} "
        f"(minispec implements the plain Llama architecture)"
    )


def check_architecture(hf: dict, path: Path) -> None:
    """The plain Llama architecture: SiLU, no biases, no quantization, full rotary."""
    architectures = hf.get("architectures") or [ARCHITECTURE]
    if hf.get("model_type") != "llama" or architectures != [ARCHITECTURE]:
        raise unsupported(
            path, f"architecture {architectures} (model_type {hf.get('model_type')!r})"
        )
    if hf["hidden_act"] != "silu":
        raise unsupported(path, f"hidden_act {hf['hidden_act']!r}")
    for flag in ("attention_bias", "mlp_bias"):
        if hf.get(flag):
            raise unsupported(path, f"{flag}")
    if hf.get("quantization_config"):
        raise unsupported(path, "quantization_config")


def plain_rope_theta(hf: dict, path: Path) -> float:
    """The RoPE base, after checking that the rotary embedding is the plain one: full width,
    no scaling."""
    # transformers 5 writes {"rope_type", "rope_theta"} as rope_parameters; 4 writes rope_theta
    # and rope_scaling. Any rope type but the default (linear, dynamic, yarn, llama3...) scales.
    for key in ("rope_scaling", "rope_parameters"):
        if not isinstance(hf.get(key, {}), dict):
            raise unsupported(path, f"{key} {hf[key]!r}")
    rope = {**hf.get("rope_scaling", {}), **hf.get("rope_parameters", {})}
    theta = rope.pop("rope_theta", hf["rope_theta"])
    rope_type = rope.pop("rope_type", rope.pop("type", "default"))
    if rope_type != "default" or rope:
        raise unsupported(path, f"rope scaling { ({'rope_type': rope_type, **rope}) }")
    if hf.get("partial_rotary_factor", 1.0) != 1.0:
        raise unsupported(path, f"partial_rotary_factor {hf['partial_rotary_factor']}")
    return theta


def gpt_config(hf: dict, path: Path) -> GPTConfig:
    """The GPTConfig of a config.json, or a CheckpointError naming what GPT does not implement."""
    hf = {**HF_DEFAULTS, **{k: v for k, v in hf.items() if v is not None}}
    check_architecture(hf, path)
    theta = plain_rope_theta(hf, path)
    for key in SIZE_KEYS:
        value = hf.get(key)
        if key in hf and (isinstance(value, bool) or not isinstance(value, int) or value <= 0):
            raise CheckpointError(
                f"{path}: config.json's {key} must be a positive int, got {value!r}"
            )
    try:
        heads, d_model = hf["num_attention_heads"], hf["hidden_size"]
        if "head_dim" in hf and hf["head_dim"] * heads != d_model:
            raise unsupported(
                path, f"head_dim {hf['head_dim']} != hidden_size / num_attention_heads"
            )
        return GPTConfig(
            vocab_size=hf["vocab_size"],
            n_layer=hf["num_hidden_layers"],
            n_head=heads,
            n_kv_head=hf.get("num_key_value_heads", heads),
            d_model=d_model,
            mlp_hidden=hf["intermediate_size"],
            max_seq_len=hf["max_position_embeddings"],
            rope_theta=theta,
            norm_eps=hf["rms_norm_eps"],
            tie_embeddings=hf["tie_word_embeddings"],
        )
    except KeyError as exc:
        raise CheckpointError(f"{path}: config.json has no {exc.args[0]!r}") from None
    except CheckpointError:
        raise  # it names the folder already
    except (TypeError, ValueError) as exc:
        raise CheckpointError(f"{path}: {exc}") from None


def shard_files(path: Path) -> list[Path]:
    """model.safetensors, or the shards that model.safetensors.index.json lists."""
    if (path / "model.safetensors").is_file():
        return [path / "model.safetensors"]
    index = path / "model.safetensors.index.json"
    if not index.is_file():
        raise CheckpointError(
            f"{path}: no model.safetensors (or index): only safetensors weights load"
        )
    weight_map = read_json(index)
    weight_map = weight_map.get("weight_map") if isinstance(weight_map, dict) else None
    if not isinstance(weight_map, dict) or not all(
        isinstance(name, str) and name == Path(name).name for name in weight_map.values()
    ):
        raise CheckpointError(
            f"{index}: no weight_map from tensor names to the folder's file names"
        )
    return sorted({path / name for name in weight_map.values()})


def read_tensors(path: Path) -> dict[str, torch.Tensor]:
    """The tensors of model.safetensors, or of the shards its index lists."""
    tensors = {}
    for file in shard_files(path):
        try:
            tensors.update(load_file(file))
        except (SafetensorError, OSError, ValueError, RuntimeError) as exc:
            raise CheckpointError(f"{file}: unreadable safetensors file ({exc})") from None
    return tensors


def read_config(path: Path) -> dict:
    """config.json as a dict, or a CheckpointError."""
    if not path.is_dir():
        raise CheckpointError(f"{path}: not a folder")
    hf = read_json(path / "config.json")
    if not isinstance(hf, dict):
        raise CheckpointError(f"{path / 'config.json'} does not load (not a JSON object)")
    return hf


def gpt_state(
    path: Path, config: GPTConfig, tensors: dict[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The folder's tensors under GPT's names (q, k and v stacked into wqkv), after checking,
    before anything is allocated, that the folder holds exactly the tensors, of the shapes,
    that config.json implies."""
    names = name_map(config)
    expected = {name for group in names.values() for name in group}
    # transformers may store a tied head's copy, and old versions stored RoPE frequencies.
    ignored = {k for k in tensors if k.endswith("rotary_emb.inv_freq") or k == "lm_head.weight"}
    missing, unexpected = (
        sorted(expected - tensors.keys()),
        sorted(tensors.keys() - expected - ignored),
    )
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: missing tensors {listed(missing)}, unexpected tensors {listed(unexpected)}"
        )
    shapes = config_shapes(config)
    state = {}
    for name, theirs in names.items():
        parts = [tensors[t] for t in theirs]
        if sum(p.shape[0] for p in parts) != shapes[name][0] or any(
            p.shape[1:] != shapes[name][1:] for p in parts
        ):
            raise CheckpointError(
                f"{path}: {', '.join(theirs)} of shapes {[tuple(p.shape) for p in parts]} "
                f"do not stack to {tuple(shapes[name])}, which config.json implies"
            )
        state[name] = torch.cat(parts)
    if config.tie_embeddings:
        state[TIED_KEY] = state["embed.weight"]
    return state


def load_hf_folder(
    path: str | Path, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32
) -> tuple[GPT, dict[str, str]]:
    """A GPT from a local Hugging Face Llama folder, with metadata like a checkpoint's: format,
    config, tokenizer (what load_pair compares), bos_token_id and eos_token_id (as JSON)."""
    path = Path(path)
    hf = read_config(path)
    config = gpt_config(hf, path)
    hf_tokenizer.check_vocabulary(path, config.vocab_size)
    state = gpt_state(path, config, read_tensors(path))
    model = GPT(config, init_weights=False)  # every parameter is loaded next (strict)
    model.load_state_dict(cast_finite(path, state, dtype))
    meta = {
        "format": FORMAT,
        "config": config.to_json(),
        "tokenizer": hf_tokenizer.identity(path),
        "bos_token_id": json.dumps(hf.get("bos_token_id")),
        "eos_token_id": json.dumps(hf.get("eos_token_id")),
    }
    return model.to(device=device, dtype=dtype).eval(), meta
