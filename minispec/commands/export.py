"""`python -m minispec export OUT_DIR`: the pair as Hugging Face Llama folders.

    python -m minispec export OUT_DIR [--target PATH] [--draft PATH] [--dtype float32]

Writes OUT_DIR/target/ and OUT_DIR/draft/, each with config.json (LlamaForCausalLM),
generation_config.json, model.safetensors and the byte tokenizer's files, which transformers,
vLLM and SGLang load as they are, and minispec-export.json, the mark of a folder minispec
wrote. Each folder is replaced whole or not at all, and only if it bears that mark and holds no
file it does not list: any other folder is left as it is, with one line saying why.
"""

from __future__ import annotations

from pathlib import Path

from minispec.commands.args import OneLineParser, writable_folder

DTYPES = ("bfloat16", "float16", "float32")  # torch's names: torch is imported after parsing


def main(argv: list[str]) -> int:
    p = OneLineParser(
        prog="minispec export", description="Export the pair as Hugging Face folders."
    )
    p.add_argument("out_dir", type=writable_folder, help="writes OUT_DIR/target and OUT_DIR/draft")
    p.add_argument("--target", default=None, help="target checkpoint (default: the shipped one)")
    p.add_argument("--draft", default=None, help="draft checkpoint (default: the shipped one)")
    p.add_argument(
        "--dtype",
        default="float32",
        choices=DTYPES,
        help="weights' dtype in model.safetensors (default float32)",
    )
    args = p.parse_args(argv)
    import torch  # deferred, as every import below: a bad flag is reported at once

    from minispec.api import DEFAULT_DRAFT, DEFAULT_TARGET
    from model.checkpoint import load_pair
    from model.folders import check_replaceable
    from model.hf import export_folder

    out = Path(args.out_dir)
    for role in ("target", "draft"):  # both, before either is written
        check_replaceable(out / role)
    models = load_pair(args.target or DEFAULT_TARGET, args.draft or DEFAULT_DRAFT)
    for role, model in zip(("target", "draft"), models):
        export_folder(model, out / role, getattr(torch, args.dtype))
        print(f"{role}: {out / role}")
    return 0
