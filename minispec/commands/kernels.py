"""What Inductor generated for the rejection sampler: the source and the list of its kernels.

    python -m minispec kernels [--device cuda] [--out results/gpu]

On a GPU the kernels are generated Triton (`triton_...`), on a CPU generated C++ (`cpp_fused_...`).
Counting them shows how well the sampler fuses: every kernel is one pass over its inputs.
"""

from __future__ import annotations

import argparse
import re
from pathlib import Path

from minispec.commands.args import OneLineParser, check_device, device_name, writable_folder

KERNEL_NAME = re.compile(r"^(triton_\w+|cpp_fused_\w+) = async_compile", re.MULTILINE)


def sampler_source(
    device: str, batch_size: int = 64, k: int = 4, vocab_size: int = 32000, one_hot: bool = False
) -> tuple[str, list[str]]:
    """Compile the sampler afresh for these shapes; return the generated source and kernel names."""
    import torch  # deferred, as in main: a bad flag is reported before torch loads
    from torch._inductor.utils import run_and_get_code

    from sampling import rejection_sample

    g = torch.Generator(device=device).manual_seed(0)
    target_logits = torch.randn(batch_size, k + 1, vocab_size, device=device, generator=g)
    draft_ids = torch.randint(vocab_size, (batch_size, k), device=device, generator=g)
    draft_probs = (
        None
        if one_hot
        else torch.rand(batch_size, k, vocab_size, device=device, generator=g).softmax(-1)
    )
    torch._dynamo.reset()  # forget compiled graphs so that this call generates code again
    with torch._inductor.config.patch(fx_graph_cache=False):
        _, sources = run_and_get_code(
            lambda: rejection_sample(target_logits, draft_ids, draft_probs, generator=g)
        )
    source = "\n\n".join(sources)
    return source, KERNEL_NAME.findall(source)


def main(argv: list[str] | None = None) -> int:
    parser = OneLineParser(
        prog="minispec kernels",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    parser.add_argument(
        "--device", type=device_name, help="default: cuda when this machine has it, else cpu"
    )
    parser.add_argument("--out", type=writable_folder, default="results")
    args = parser.parse_args(argv)
    import torch

    if args.device is None:
        args.device = "cuda" if torch.cuda.is_available() else "cpu"
    check_device(parser, args.device)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    for label, one_hot in (("probabilistic", False), ("one_hot", True)):
        source, kernels = sampler_source(args.device, one_hot=one_hot)
        path = out / f"sampler_{label}_{args.device}_generated.py.txt"
        path.write_text(source)
        print(f"{label} draft on {args.device}: {len(kernels)} kernels -> {path}")
        for name in kernels:
            print(f"  {name}")
    return 0
